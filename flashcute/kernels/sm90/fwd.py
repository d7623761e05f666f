"""The FlashAttention forward kernel for Hopper (sm_90a): TMA, wgmma and warp specialization.

The seven steps are the sm80 kernel's (and reference/tiled.py's); the machinery under them differs:

- Warp specialization. Warpgroup 0 is the producer: it gives up registers (setmaxnreg) and one of its warps
  issues TMA loads of Q and of every K and V tile into a ring of shared-memory stages, each guarded by a full and
  an empty mbarrier (cutlass.pipeline.PipelineTmaAsync). Warpgroups 1.. are consumers, 64 rows of the Q tile each.
- wgmma. S = Q K^T reads both operands from shared memory; O += P V takes P from registers.
- Softmax under the tensor cores. Inside a warpgroup, the Q K^T of tile n is issued before the P V of tile n + 1
  (the one before it in walking order), so the softmax of S_n runs while that P V is still on the tensor cores.
  Across warpgroups, a pair of named barriers makes them take turns issuing their MMAs, so one warpgroup's softmax
  overlaps the other's MMAs (FlashAttention-4 takes turns up to head dim 128 only; here every head dim does).
- Lazy rescaling: on an unmasked K/V tile the softmax skips the row max, taking E against the kept max straight
  into P once the previous P V is done, and rescales only where a row grew by more than softmax.RESCALE_THRESHOLD
  (softmax.online_softmax_kept_max; under a mask a row that has seen no key yet may keep m = 0 there).
  With config.exp_in_place E goes into S's registers while that P V still runs, and into P after it
  (softmax.online_softmax_in_place; a warp that fails the check moves its max from E, or from S
  computed again by FMAs where E cannot tell: wgmma.scores_by_fma).
- Epilogue. Each warpgroup writes its 64 rows of O into shared memory, and one warp stores them with a TMA store
  (rows past seqlen_q and columns past head_dim are dropped by the TMA unit).
- Persistent. The grid has one thread block per SM (or fewer). Each starts with tile block_idx of the order of
  kernels/common/scheduler.py and then claims the next tile in that order from a global counter as it finishes
  one: the producer warp adds to the counter and hands the index to the consumers through a two-slot ring in
  shared memory, so thread blocks that run at different speeds still end the walk together (docs/tuning-sm90.md,
  Claimed tiles and the persistent grid). The producer runs ahead into the next tile: its Q and
  first K/V tiles load while the consumers finish and store this one. O has its own shared
  memory where it fits (head dim <= 128); at 192 and 256 it reuses Q's, so the next Q loads only after O has
  left.

With softcap, every score tile is capped as it lands, before the mask and the softmax (kernels/common/softcap.py).
With learnable sinks, each row's denominator takes its head's sink in the epilogue (softmax.finalize); with ALiBi,
every score tile takes its bias after the cap (kernels/common/alibi.py).

K/V tiles are split into masked and unmasked runs by TileInfo as in the sm80 kernel; the walk takes the last tile
first, then the unmasked run downwards, then the rest of the right-masked run and the left-masked run (mainloop
says why that order). A Q tile that sees no key at all loads only Q and writes O = 0, LSE = -inf.
"""

from functools import partial
from types import SimpleNamespace

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync

from flashcute.kernels.common import copy as gcopy
from flashcute.kernels.common import tma
from flashcute.kernels.common.alibi import alibi_slope
from flashcute.kernels.common.dtypes import CUTLASS_DTYPES
from flashcute.kernels.common.epilogue import store_lse, store_o
from flashcute.kernels.common.layout import converted
from flashcute.kernels.common.limits import MAX_SMEM_BYTES, dtype_limits, exact_value_head_dim, value_head_dim
from flashcute.kernels.common.mask import AttentionMask
from flashcute.kernels.common.scheduler import heads_per_section, tile_coords, tile_divisors
from flashcute.kernels.common.seqlen import SeqLens
from flashcute.kernels.common.softcap import apply_softcap, softcap_scales
from flashcute.kernels.common.softmax import RESCALE_THRESHOLD, OnlineSoftmax
from flashcute.kernels.common.tile_info import TileInfo
from flashcute.kernels.common.wgmma import (
    K_DESCRIPTOR_FORMS,
    fixed_descriptors,
    gemm,
    gemm_steps,
    k_steps,
    make_tiled_mmas,
    scores_by_fma,
    stage_steps,
    store_probs,
    transpose_view,
)
from flashcute.kernels.sm90.config import NUM_STAGES, Sm90FwdConfig

# Registers per thread after setmaxnreg, by number of consumer warpgroups: the producer warpgroup gives up what the
# consumers take (the register file holds 64K; FlashAttention-3's split).
PRODUCER_REGS = {1: 56, 2: 24, 3: 32}
CONSUMER_REGS = {1: 256, 2: 240, 3: 160}
# Named barriers (0 is __syncthreads): one per consumer warpgroup for taking turns, one per warpgroup epilogue.
SCHEDULER_BARRIER = 1
EPILOGUE_BARRIER = 4
STALE_ROWS_BARRIER = 7  # the consumers wait for V's rows past a packed sequence's keys to be zeroed
# Slots of the ring that carries claimed tile indices from the producer warp to the consumers.
TILE_RING = 2


class FlashAttentionForwardSm90:
    """Forward attention on Hopper. Construct from a Sm90FwdConfig; compile with cute.compile for sm_90a."""

    def __init__(self, config: Sm90FwdConfig):
        self.config = config
        self.dtype = CUTLASS_DTYPES[config.dtype]
        self.block_m = config.block_m
        self.block_n = config.block_n
        self.head_dim_padded = config.head_dim_padded
        self.head_dim_v = value_head_dim(config)  # V's and O's
        self.num_stages = NUM_STAGES
        self.num_wg = config.num_mma_warpgroups
        self.take_turns = self.num_wg > 1  # one warpgroup has no one to take turns with

    @staticmethod
    def can_implement(config: Sm90FwdConfig, arch: str) -> str | None:
        """None if the kernel can be built for ``config`` on target ``arch``, else the reason it cannot."""
        if arch != "sm_90a":
            return f"the sm90 kernel needs TMA and wgmma: target sm_90a, not {arch}"
        reason = dtype_limits(config)
        if reason is not None:
            return reason
        if config.block_m not in (64, 128, 192):
            return f"block_m={config.block_m} is not 64, 128 or 192 (one to three 64-row consumer warpgroups)"
        if config.block_n % 16 != 0 or not 16 <= config.block_n <= 256:
            return f"block_n={config.block_n} is not a multiple of 16 in [16, 256] (wgmma N and P V's k-steps)"
        if config.k_descriptors not in K_DESCRIPTOR_FORMS:
            return f"k_descriptors={config.k_descriptors!r} is not one of {K_DESCRIPTOR_FORMS}"
        if config.smem_bytes() > MAX_SMEM_BYTES[arch]:
            return f"needs {config.smem_bytes()} bytes of shared memory, over {arch}'s {MAX_SMEM_BYTES[arch]}"
        return None

    # ---------------------------------------------------------------- host side: layouts, tensor maps, launch
    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (batch, seqlen_q, nheads, head_dim)
        mK: cute.Tensor,  # (batch, seqlen_k, nheads_k, head_dim)
        mV: cute.Tensor,  # (batch, seqlen_k, nheads_k, head_dim_v)
        mO: cute.Tensor,  # (batch, seqlen_q, nheads, head_dim_v)
        mLSE: cute.Tensor,  # (batch, nheads, seqlen_q) float32
        mTileCounter: cute.Tensor,  # (2,) int32, zeroed: tiles claimed, thread blocks done (left zeroed)
        softmax_scale: Float32,
        diag_offset: Int32,
        window_left: Int32,
        window_right: Int32,
        max_grid: Int32,  # the most thread blocks: one per SM
        stream: cuda.CUstream,
        mCuSeqlensQ: cute.Tensor | None = None,  # packed batches (common/seqlen.py): (batch + 1,) int32
        mCuSeqlensK: cute.Tensor | None = None,
        mSeqUsedQ: cute.Tensor | None = None,  # (batch,) int32
        mSeqUsedK: cute.Tensor | None = None,
        max_seqlen_q: Int32 | None = None,  # the longest sequence of a packed batch
        max_seqlen_k: Int32 | None = None,
        softcap: Float32 | None = None,  # the cap, when config.softcap (kernels/common/softcap.py)
        mSink: cute.Tensor | None = None,  # (nheads,) float32: learnable sinks, when config.sink (softmax.finalize)
        mAlibi: cute.Tensor | None = None,  # (batch, nheads) float32: ALiBi slopes, when config.alibi (common/alibi.py)
        mBlockTable: cute.Tensor | None = None,  # config.page_rows: (batch, pages) int32, each sequence's pages
        page_size: Int32 | None = None,  # rows of a page
        seq_rows: Int32 | None = None,  # rows a sequence's positions span in cu_seqlens_k's numbering (its capacity)
    ):
        d, dv = self.head_dim_padded, self.head_dim_v
        sQ_layout = tma.smem_layout(self.dtype, 64, d, self.num_wg)  # one 64-row stage per consumer warpgroup
        sO_layout = tma.smem_layout(self.dtype, 64, dv, self.num_wg)
        sK_layout = tma.smem_layout(self.dtype, self.block_n, d, self.num_stages)
        sV_layout = tma.smem_layout(self.dtype, self.block_n, dv, self.num_stages)
        tiled_mma_qk, tiled_mma_pv = make_tiled_mmas(self.dtype, self.block_n, dv)

        mQ_t, mK_t, mV_t, mO_t = (tma.bshd_to_sdhb(t) for t in (mQ, mK, mV, mO))
        load = cpasync.CopyBulkTensorTileG2SOp()
        tma_Q, tQ = tma.make_tma(load, mQ_t, sQ_layout, 64, d)
        tma_K, tK = tma.make_tma(load, mK_t, sK_layout, self.block_n, d)
        tma_V, tV = tma.make_tma(load, mV_t, sV_layout, self.block_n, dv)
        if cutlass.const_expr(self.config.page_rows):  # K and V in pages: a box of page_rows rows at a time
            rows = self.config.page_rows
            cols_k, cols_v = tma.atom_columns(self.dtype, d), tma.atom_columns(self.dtype, dv)
            tma_K, tK = tma.make_tma(load, mK_t, tma.smem_layout(self.dtype, rows, cols_k, 1), rows, cols_k)
            tma_V, tV = tma.make_tma(load, mV_t, tma.smem_layout(self.dtype, rows, cols_v, 1), rows, cols_v)
        tma_O, tO = tma.make_tma(cpasync.CopyBulkTensorTileS2GOp(), mO_t, sO_layout, 64, dv)
        self.tx_bytes_q = tma.tx_bytes(self.dtype, sQ_layout) * self.num_wg
        self.tx_bytes_k = tma.tx_bytes(self.dtype, sK_layout)
        self.tx_bytes_v = tma.tx_bytes(self.dtype, sV_layout)

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_k: cute.struct.MemRange[cutlass.Int64, 2 * self.num_stages]
            mbar_v: cute.struct.MemRange[cutlass.Int64, 2 * self.num_stages]
            mbar_tile: cute.struct.MemRange[cutlass.Int64, 2 * TILE_RING]
            tile_ring: cute.struct.MemRange[Int32, TILE_RING]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sO: cute.struct.Align[
                cute.struct.MemRange[self.dtype, 0 if self.config.o_aliases_q else cute.cosize(sO_layout)], 1024
            ]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]

        batch, seqlen_q, seqlen_k = mQ.shape[0], mQ.shape[1], mK.shape[1]
        if cutlass.const_expr(self.config.packed):
            batch, seqlen_q, seqlen_k = mSeqUsedQ.shape[0], max_seqlen_q, max_seqlen_k
        num_m_blocks = cute.ceil_div(seqlen_q, self.block_m)
        num_tiles = num_m_blocks * mQ.shape[2] * batch
        # L2 sections pay off where tiles differ in length (causal, windows); without a mask the plain order keeps
        # the running thread blocks on fewer heads (docs/tuning-sm90.md, L2 sections).
        section = 1
        if cutlass.const_expr(self.config.mask_right):
            section = heads_per_section(seqlen_k, 4 * mK.shape[3])  # K and V
        divisors = tile_divisors(num_m_blocks, mQ.shape[2], batch, section, make=cute.FastDivmodDivisorV2)
        scale_log2, softcap_multiplier = softcap_scales(softmax_scale, softcap)
        page_div = seq_rows_div = None  # config.page_rows: positions to pages, rows to sequences, by multiply and shift
        if cutlass.const_expr(self.config.page_rows):
            page_div, seq_rows_div = cute.FastDivmodDivisorV2(page_size), cute.FastDivmodDivisorV2(seq_rows)
        self.kernel(
            tQ,
            tK,
            tV,
            mO if cutlass.const_expr(self.config.packed) else tO,
            mLSE,
            mTileCounter,
            mCuSeqlensQ,
            mCuSeqlensK,
            mSeqUsedQ,
            mSeqUsedK,
            mSink,
            mAlibi,
            mBlockTable,
            page_size,
            page_div,
            seq_rows_div,
            tma_Q,
            tma_K,
            tma_V,
            tma_O,
            scale_log2,
            softcap_multiplier,
            diag_offset,
            window_left,
            window_right,
            num_m_blocks,
            num_tiles,
            section,
            divisors.tiles,
            divisors.section,
            divisors.last,
            divisors.nheads,
            cute.FastDivmodDivisorV2(mQ.shape[2] // mK.shape[2]),
            mQ.shape[1],
            mK.shape[1],
            sQ_layout,
            sO_layout,
            sK_layout,
            sV_layout,
            tiled_mma_qk,
            tiled_mma_pv,
            SharedStorage,
        ).launch(
            grid=[cutlass.min(num_tiles, max_grid), 1, 1],
            block=[self.config.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
        )

    # ---------------------------------------------------------------- device side
    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,  # TMA coordinate tensors, (seqlen, head_dim, heads, batch)
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,  # packed batches: O itself (stored without TMA: epilogue)
        mLSE: cute.Tensor,
        mTileCounter: cute.Tensor,
        mCuSeqlensQ: cute.Tensor | None,
        mCuSeqlensK: cute.Tensor | None,
        mSeqUsedQ: cute.Tensor | None,
        mSeqUsedK: cute.Tensor | None,
        mSink: cute.Tensor | None,
        mAlibi: cute.Tensor | None,
        mBlockTable: cute.Tensor | None,
        page_size: Int32 | None,
        page_div: cute.FastDivmodDivisorV2 | None,
        seq_rows_div: cute.FastDivmodDivisorV2 | None,
        tma_Q: cute.CopyAtom,
        tma_K: cute.CopyAtom,
        tma_V: cute.CopyAtom,
        tma_O: cute.CopyAtom,
        scale_log2: Float32,
        softcap_multiplier: Float32 | None,
        diag_offset: Int32,
        window_left: Int32,
        window_right: Int32,
        num_m_blocks: Int32,
        num_tiles: Int32,
        section: Int32,
        div_section_tiles: cute.FastDivmodDivisorV2,  # scheduler.tile_divisors
        div_section: cute.FastDivmodDivisorV2,
        div_last_section: cute.FastDivmodDivisorV2,
        div_nheads: cute.FastDivmodDivisorV2,
        div_qheads_per_kvhead: cute.FastDivmodDivisorV2,
        seqlen_q: Int32,
        seqlen_k: Int32,
        sQ_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        cfg = self.config
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            for atom in (tma_Q, tma_K, tma_V, tma_O):
                cpasync.prefetch_descriptor(atom)

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * self.num_wg)  # one arrive per warp
        make_pipeline = partial(
            pipeline.PipelineTmaAsync.create, producer_group=producer, consumer_group=consumers, defer_sync=True
        )
        pipes = SimpleNamespace(
            q=make_pipeline(num_stages=1, tx_count=self.tx_bytes_q, barrier_storage=storage.mbar_q.data_ptr()),
            k=make_pipeline(
                num_stages=self.num_stages, tx_count=self.tx_bytes_k, barrier_storage=storage.mbar_k.data_ptr()
            ),
            v=make_pipeline(
                num_stages=self.num_stages, tx_count=self.tx_bytes_v, barrier_storage=storage.mbar_v.data_ptr()
            ),
        )
        # the producer warp hands each claimed tile index to the consumers
        pipes.tile = pipeline.PipelineAsync.create(
            num_stages=TILE_RING,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128 * self.num_wg),
            barrier_storage=storage.mbar_tile.data_ptr(),
            defer_sync=True,
        )
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)  # (64, D, warpgroup)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)  # (block_n, D, stage)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)  # (block_n, D_v, stage)
        # (64, D_v, warpgroup): in Q's shared memory a warpgroup's O lies in its own Q stage, which only it reads
        sO = (
            storage.sQ.get_tensor(tma.restaged(sO_layout, sQ_layout), swizzle=sO_layout.inner)
            if cutlass.const_expr(cfg.o_aliases_q)
            else storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        )

        tile_info = TileInfo.of(cfg, seqlen_q, seqlen_k, diag_offset, window_left, window_right)
        # ---- step 1, for every tile this thread block takes: see scheduler.py for the order
        tiles = SimpleNamespace(
            num_m_blocks=num_m_blocks,
            num_tiles=num_tiles,
            section=section,
            divisors=SimpleNamespace(
                tiles=div_section_tiles, section=div_section, last=div_last_section, nheads=div_nheads
            ),
            qheads_per_kvhead=div_qheads_per_kvhead,
            nheads=mQ.shape[2],
            batch=mQ.shape[3] if cutlass.const_expr(mSeqUsedQ is None) else mSeqUsedQ.shape[0],
            tile_info=tile_info,
            seqlen_q=seqlen_q,
            seqlen_k=seqlen_k,
            diag_offset=diag_offset,
            window_left=window_left,
            window_right=window_right,
            packed=(mCuSeqlensQ, mCuSeqlensK, mSeqUsedQ, mSeqUsedK),
            pages=(mBlockTable, page_size, page_div, seq_rows_div),  # config.page_rows
            counter=mTileCounter,
            ring=storage.tile_ring.get_tensor(cute.make_layout(TILE_RING)),
        )
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS[self.num_wg])
            if warp_idx == 0:
                self.load(mQ, mK, mV, sQ, sK, sV, tma_Q, tma_K, tma_V, pipes, tiles)
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGS[self.num_wg])
            self.consume(
                mO,
                mLSE,
                tma_O,
                sQ,
                sK,
                sV,
                sO,
                pipes,
                tiles,
                scale_log2,
                softcap_multiplier,
                mSink,
                mAlibi,
                tiled_mma_qk,
                tiled_mma_pv,
            )

    @cute.jit
    def walk_claimed_tiles(
        self,
        tiles: SimpleNamespace,
        pipe_tile: pipeline.PipelineAsync,
        one_tile,
        q_state: pipeline.PipelineState,
        kv_state: pipeline.PipelineState,
    ):
        """The producer warp's walk: its first tile is block_idx; once a tile's loads are issued
        (the K/V ring lets the warp run at most two stages ahead, so this is near the end of the consumers' work
        on the tile before) it claims the next with an atomic add on the counter, grid_size + the count so far,
        and publishes each index in the ring for the consumers, then one past the last tile to end their walk.

        The counter is left zeroed for the next launch, so the host keeps one per stream instead of zeroing one a
        call (a memset launch): every thread block makes exactly one claim past the last tile, then counts itself
        done (acq_rel: after its claims); the block that counts last knows no claim is left and zeroes both."""
        block_idx, grid_size = cute.arch.block_idx()[0], cute.arch.grid_dim()[0]
        ring_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, TILE_RING)
        tile_idx = self.skip_empty_tiles(tiles, block_idx, grid_size)
        while tile_idx < tiles.num_tiles:
            ring_state = self.publish_tile(pipe_tile, tiles.ring, ring_state, tile_idx)
            q_state, kv_state = one_tile(tile_idx, q_state, kv_state)
            tile_idx = self.skip_empty_tiles(tiles, self.claim_tile(tiles, grid_size), grid_size)
        self.publish_tile(pipe_tile, tiles.ring, ring_state, tile_idx)
        counter = tiles.counter
        if cute.arch.lane_idx() == 0:
            done = cute.arch.atomic_add(counter.iterator + 1, Int32(1), sem="acq_rel", scope="gpu")
            if done == grid_size - 1:
                counter[0] = Int32(0)
                counter[1] = Int32(0)

    @cute.jit
    def claim_tile(self, tiles: SimpleNamespace, grid_size: Int32) -> Int32:
        """The next tile index: grid_size + the count of claims so far (lane 0 adds, the warp shares it)."""
        claimed = Int32(0)
        if cute.arch.lane_idx() == 0:
            claimed = cute.arch.atomic_add(tiles.counter.iterator, Int32(1))
        return grid_size + cute.arch.shuffle_sync(claimed, 0)

    @cute.jit
    def skip_empty_tiles(self, tiles: SimpleNamespace, tile_idx: Int32, grid_size: Int32) -> Int32:
        """``tile_idx``, or in a packed batch the first tile from it on (claiming further) that holds a row: the
        tiles past a shorter sequence's end are neither loaded nor handed to the consumers."""
        if cutlass.const_expr(self.config.packed):
            empty = self.tile_is_empty(tiles, tile_idx)
            while empty:
                tile_idx = self.claim_tile(tiles, grid_size)
                empty = self.tile_is_empty(tiles, tile_idx)
        return tile_idx

    def tile_is_empty(self, tiles: SimpleNamespace, tile_idx: Int32):
        """Whether tile ``tile_idx`` (of a packed batch) exists and starts past its sequence's end."""
        last = cutlass.min(tile_idx, tiles.num_tiles - 1)
        m_block, _, batch_idx = tile_coords(
            last, tiles.num_m_blocks, tiles.nheads, tiles.batch, tiles.section, tiles.divisors
        )
        seq = SeqLens(batch_idx, tiles.seqlen_q, tiles.seqlen_k, tiles.diag_offset, *tiles.packed)
        return (tile_idx < tiles.num_tiles) & (m_block * self.block_m >= seq.seqlen_q)

    @cute.jit
    def walk_published_tiles(
        self,
        tiles: SimpleNamespace,
        pipe_tile: pipeline.PipelineAsync,
        one_tile,
        q_state: pipeline.PipelineState,
        kv_state: pipeline.PipelineState,
    ):
        """The consumers' walk: the tile indices the producer warp publishes, until one is past
        the last tile."""
        ring_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, TILE_RING)
        tile_idx, ring_state = self.fetch_tile(pipe_tile, tiles.ring, ring_state)
        while tile_idx < tiles.num_tiles:
            q_state, kv_state = one_tile(tile_idx, q_state, kv_state)
            tile_idx, ring_state = self.fetch_tile(pipe_tile, tiles.ring, ring_state)

    @cute.jit
    def publish_tile(
        self, pipe_tile: pipeline.PipelineAsync, ring: cute.Tensor, state: pipeline.PipelineState, tile_idx: Int32
    ) -> pipeline.PipelineState:
        """One lane writes the index into the next free slot and signals it (the mbarrier arrive releases the
        write to the consumers, whose wait acquires it)."""
        pipe_tile.producer_acquire(state)
        if cute.arch.lane_idx() == 0:
            ring[state.index] = tile_idx
            pipe_tile.producer_commit(state)
        state.advance()
        return state

    @cute.jit
    def fetch_tile(self, pipe_tile: pipeline.PipelineAsync, ring: cute.Tensor, state: pipeline.PipelineState):
        """Every consumer thread reads the next published index and frees its slot; returns (index, state)."""
        pipe_tile.consumer_wait(state)
        tile_idx = ring[state.index]
        pipe_tile.consumer_release(state)
        state.advance()
        return tile_idx, state

    def tile_at(self, tiles: SimpleNamespace, tile_idx: Int32) -> SimpleNamespace:
        """Step 1 for tile number ``tile_idx``: its coordinates, the K/V tiles it visits and in what order."""
        m_block, head_idx, batch_idx = tile_coords(
            tile_idx, tiles.num_m_blocks, tiles.nheads, tiles.batch, tiles.section, tiles.divisors
        )
        seq = SeqLens(batch_idx, tiles.seqlen_q, tiles.seqlen_k, tiles.diag_offset, *tiles.packed)
        tile_info = tiles.tile_info
        if cutlass.const_expr(seq.packed):  # each sequence its own lengths and diagonal
            tile_info = TileInfo.of(
                self.config, seq.seqlen_q, seq.seqlen_k, seq.diag_offset, tiles.window_left, tiles.window_right
            )
        n_block_min, n_block_max = tile_info.n_block_range(m_block)
        return SimpleNamespace(
            m_block=m_block,
            head_idx=head_idx,
            seq=seq,
            tile_info=tile_info,
            kv_head_idx=head_idx // tiles.qheads_per_kvhead,
            n_block_min=n_block_min,
            n_block_max=n_block_max,
            runs=tile_info.visit_runs(m_block, n_block_min, n_block_max, self.config.alibi),
        )

    @cute.jit
    def load(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sV: cute.Tensor,
        tma_Q: cute.CopyAtom,
        tma_K: cute.CopyAtom,
        tma_V: cute.CopyAtom,
        pipes: SimpleNamespace,
        tiles: SimpleNamespace,
    ):
        """Step 2, the producer warp: per tile, Q, then K[n] and V[n] for n from the last visited tile down."""
        # (Loops read the pipelines through locals: the tracer carries what a loop uses through it and rebinds the
        # names it finds, and a rebound attribute of ``pipes`` would leak this warp's loop into the consumers.)
        pipe_q, pipe_k, pipe_v = pipes.q, pipes.k, pipes.v
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        # (The loop body is a call through a partial: the tracer carries a loop's Python objects only if it sees
        # them in the body, and these are not run-time values.)
        load_one_tile = partial(
            self.load_one_tile, mQ, mK, mV, sQ, sK, sV, tma_Q, tma_K, tma_V, pipe_q, pipe_k, pipe_v, tiles
        )
        self.walk_claimed_tiles(tiles, pipes.tile, load_one_tile, q_state, kv_state)

    @cute.jit
    def load_one_tile(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sV: cute.Tensor,
        tma_Q: cute.CopyAtom,
        tma_K: cute.CopyAtom,
        tma_V: cute.CopyAtom,
        pipe_q: pipeline.PipelineTmaAsync,
        pipe_k: pipeline.PipelineTmaAsync,
        pipe_v: pipeline.PipelineTmaAsync,
        tiles: SimpleNamespace,
        tile_idx: Int32,
        q_state: pipeline.PipelineState,
        kv_state: pipeline.PipelineState,
    ):
        """Q, even for a tile that sees no key (its consumers wait for it before they write O, which may share Q's
        shared memory, and free it after), then the tile's K and V. Returns the advanced pipeline states."""
        tile = self.tile_at(tiles, tile_idx)
        self.load_q(mQ, sQ, tma_Q, pipe_q, q_state, tile)
        q_state.advance()
        if tile.n_block_max > tile.n_block_min:
            kv_state = self.load_kv(mK, mV, sK, sV, tma_K, tma_V, pipe_k, pipe_v, kv_state, tile, tiles.pages)
        return q_state, kv_state

    @cute.jit
    def load_q(
        self,
        mQ: cute.Tensor,
        sQ: cute.Tensor,
        tma_Q: cute.CopyAtom,
        pipe_q: pipeline.PipelineTmaAsync,
        q_state: pipeline.PipelineState,
        tile: SimpleNamespace,
    ):
        """One 64-row box per consumer warpgroup; rows past seqlen_q (even a whole warpgroup's) are zero-filled."""
        tQsQ, tQgQ = tma.partition_tiles(tma_Q, sQ, tile.seq.rows_q(mQ, tile.head_idx, 0), 64, self.head_dim_padded)
        pipe_q.producer_acquire(q_state)
        for wg in cutlass.range_constexpr(self.num_wg):
            q_tile = tile.m_block * self.num_wg + wg
            cute.copy(tma_Q, tQgQ[None, q_tile], tQsQ[None, wg], tma_bar_ptr=pipe_q.producer_get_barrier(q_state))

    @cute.jit
    def load_kv(
        self,
        mK: cute.Tensor,
        mV: cute.Tensor,
        sK: cute.Tensor,
        sV: cute.Tensor,
        tma_K: cute.CopyAtom,
        tma_V: cute.CopyAtom,
        pipe_k: pipeline.PipelineTmaAsync,
        pipe_v: pipeline.PipelineTmaAsync,
        state: pipeline.PipelineState,
        tile: SimpleNamespace,
        pages: tuple,
    ) -> pipeline.PipelineState:
        """The tiles in the consumers' order (mainloop), K one tile ahead of V: K[next] is needed before
        V[previous]. Returns the state after the tile's last stage. ``pages``: the kernel's (block table, page
        size, rows a sequence spans), with config.page_rows."""
        d, dv = self.head_dim_padded, self.head_dim_v
        if cutlass.const_expr(self.config.page_rows):
            load_k, load_v = (
                self.paged_loader(mX, sX, atom, pipe, width, tile, pages)
                for mX, sX, atom, pipe, width in ((mK, sK, tma_K, pipe_k, d), (mV, sV, tma_V, pipe_v, dv))
            )
        else:
            tKsK, tKgK = tma.partition_tiles(tma_K, sK, tile.seq.rows_k(mK, tile.kv_head_idx, 0), self.block_n, d)
            tVsV, tVgV = tma.partition_tiles(tma_V, sV, tile.seq.rows_k(mV, tile.kv_head_idx, 0), self.block_n, dv)
            load_k = partial(self.load_tile, pipe_k, tma_atom=tma_K, tXgX=tKgK, tXsX=tKsK)
            load_v = partial(self.load_tile, pipe_v, tma_atom=tma_V, tXgX=tVgV, tXsX=tVsV)
        prev = tile.n_block_max - 1
        load_k(state, n_block=prev)
        for run in cutlass.range_constexpr(len(tile.runs)):
            first, count, _, _, direction = tile.runs[run]
            for i in cutlass.range(count, unroll=1):
                state, prev = self.load_next(load_k, load_v, state, prev, first + direction * i)
        load_v(state, n_block=prev)
        state.advance()
        return state

    @staticmethod
    def load_next(load_k, load_v, state: pipeline.PipelineState, prev: Int32, n_block: Int32):
        """K[n_block] into the next stage, then V[prev] into this one; returns (the next stage, n_block)."""
        v_state = state.clone()
        state.advance()
        load_k(state, n_block=n_block)
        load_v(v_state, n_block=prev)
        return state, n_block

    @staticmethod
    def load_tile(
        pipe: pipeline.PipelineTmaAsync,
        state: pipeline.PipelineState,
        tma_atom: cute.CopyAtom,
        tXgX: cute.Tensor,
        tXsX: cute.Tensor,
        n_block: Int32,
    ):
        """Wait until the consumers have freed ``state``'s stage, then TMA tile n_block into it."""
        pipe.producer_acquire(state)
        cute.copy(tma_atom, tXgX[None, n_block], tXsX[None, state.index], tma_bar_ptr=pipe.producer_get_barrier(state))

    def paged_loader(self, mX, sX, tma_atom, pipe, width: int, tile: SimpleNamespace, pages: tuple):
        """load_tile for K or V in the pages of a cache: ``load(state, n_block)``. The packed batch's rows number
        each sequence's cache positions from b * seq_rows (flash_attn_with_kvcache), so the tile's sequence b and
        its first position come from cu_seqlens_k's start, which the caller keeps a multiple of page_rows (a box
        never crosses a page)."""
        table, page_size, page_div, seq_rows_div = pages
        rows, cols = self.config.page_rows, tma.atom_columns(self.dtype, width)
        tXsX, tXgX = tma.partition_boxes(tma_atom, sX, mX[None, None, tile.kv_head_idx, 0], rows, cols)
        batch_idx, first = divmod(tile.seq.offset_k, seq_rows_div)
        where = SimpleNamespace(
            table=table[batch_idx, None],
            page_size=page_size,
            page_div=page_div,
            first=first,
            end=first + tile.seq.seqlen_k,
        )
        return partial(self.load_paged_tile, pipe, tma_atom=tma_atom, tXgX=tXgX, tXsX=tXsX, where=where)

    @cute.jit
    def load_paged_tile(
        self,
        pipe: pipeline.PipelineTmaAsync,
        state: pipeline.PipelineState,
        tma_atom: cute.CopyAtom,
        tXgX: cute.Tensor,
        tXsX: cute.Tensor,
        where: SimpleNamespace,
        n_block: Int32,
    ):
        """Wait until the consumers have freed ``state``'s stage, then TMA tile n_block of the sequence into it a
        box of page_rows rows at a time, each from the page its positions lie in: lane j of the producer warp looks
        up box j's page (one round of page-table loads a tile, not one a box), and the boxes' loads take their
        coordinates from its lanes. A box past the sequence's keys is read from wholly outside the cache, which the
        TMA unit fills with zeros."""
        rows = self.config.page_rows
        lane = cute.arch.lane_idx()
        position = where.first + n_block * self.block_n + lane * rows
        box = Int32(-1)
        if lane < self.block_n // rows and position < where.end:
            page_idx, row = divmod(position, where.page_div)
            box = (where.table[page_idx] * where.page_size + row) // rows
        pipe.producer_acquire(state)
        barrier = pipe.producer_get_barrier(state)
        for j in cutlass.range(self.block_n // rows, unroll=1):  # (unrolled, the producer's 24 registers spill)
            box_j = cute.arch.shuffle_sync(box, j)
            for c in cutlass.range(cute.size(tXsX, mode=[1, 1]), unroll=1):
                cute.copy(tma_atom, tXgX[None, (box_j, c)], tXsX[None, (j, c, state.index)], tma_bar_ptr=barrier)

    @cute.jit
    def consume(
        self,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        tma_O: cute.CopyAtom,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sV: cute.Tensor,
        sO: cute.Tensor,
        pipes: SimpleNamespace,
        tiles: SimpleNamespace,
        scale_log2: Float32,
        softcap_multiplier: Float32 | None,
        mSink: cute.Tensor | None,
        mAlibi: cute.Tensor | None,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
    ):
        """Steps 3 to 7 for one consumer warpgroup's 64 rows of every tile this thread block takes."""
        tidx, _, _ = cute.arch.thread_idx()
        wg = cute.arch.make_warp_uniform(cute.arch.warp_idx()) // 4 - 1
        wg_tidx = tidx % 128
        thr_mma_qk = tiled_mma_qk.get_slice(wg_tidx)
        thr_mma_pv = tiled_mma_pv.get_slice(wg_tidx)
        sQ_wg = sQ[None, None, wg]

        # ---- steps 3 and 6: MMA operands (shared-memory descriptors) and accumulators. The descriptors are built
        # here, once for the whole kernel (wgmma.fixed_descriptors): Q's per k-step, since this warpgroup's Q tile
        # never moves; K's and V's as a base, to which a step adds its stage's and k-steps' offsets.
        tSrQ = [fixed_descriptors(q) for q in k_steps(thr_mma_qk.make_fragment_A(thr_mma_qk.partition_A(sQ_wg)))]
        tSrK = fixed_descriptors(thr_mma_qk.make_fragment_B(thr_mma_qk.partition_B(sK)))
        tOrVt = fixed_descriptors(thr_mma_pv.make_fragment_B(thr_mma_pv.partition_B(transpose_view(sV))))
        tOrP = thr_mma_pv.make_fragment_A(thr_mma_pv.partition_shape_A((64, self.block_n)))
        acc_O = thr_mma_pv.make_fragment_C(thr_mma_pv.partition_shape_C((64, self.head_dim_v)))
        softmax = OnlineSoftmax(
            scale_log2,
            cute.size(acc_O, mode=[0, 1]) * cute.size(acc_O, mode=[1]),
            4,
            self.config.sum_chains,
            rescale_threshold=RESCALE_THRESHOLD,
        )
        mask = AttentionMask(tiles.tile_info, thr_mma_qk, tiled_mma_qk.get_slice(0), 64, wg * 64)
        mma = SimpleNamespace(
            tiled_mma_qk=tiled_mma_qk,
            tiled_mma_pv=tiled_mma_pv,
            thr_mma_qk=thr_mma_qk,
            tSrQ=tSrQ,
            tSrK=tSrK,
            tOrVt=tOrVt,
            tOrP=tOrP,
            acc_O=acc_O,
            row_scale=cute.make_rmem_tensor(cute.size(softmax.row_max), Float32),  # alpha, for rescale_o_early
            sQ=sQ_wg,  # for scores_by_fma (exp_in_place)
            sK=sK,
            sV=sV,  # packed: zero_stale_v_rows
            zero_v=gcopy.make_gmem_tiled_copy(self.dtype, self.head_dim_v, 128, False) if self.config.packed else None,
            softcap_multiplier=softcap_multiplier,  # apply_softcap's, with config.softcap
            sink=mSink,  # with config.sink
            alibi=mAlibi,  # with config.alibi
        )

        if cutlass.const_expr(self.take_turns):  # noqa: SIM102 (a compile-time test around a run-time one)
            if wg == 0:  # the first warpgroup may issue first
                cute.arch.barrier_arrive(barrier_id=SCHEDULER_BARRIER, number_of_threads=256)

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        consume_one_tile = partial(
            self.consume_one_tile, mO, mLSE, tma_O, sO[None, None, wg], mma, pipes, softmax, mask, tiles, wg
        )
        self.walk_published_tiles(tiles, pipes.tile, consume_one_tile, q_state, kv_state)
        if wg_tidx < 32:
            cute.arch.cp_async_bulk_wait_group(0, read=True)  # the last O store has read shared memory

    @cute.jit
    def consume_one_tile(
        self,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        tma_O: cute.CopyAtom,
        sO: cute.Tensor,
        mma: SimpleNamespace,
        pipes: SimpleNamespace,
        softmax: OnlineSoftmax,
        mask: AttentionMask,
        tiles: SimpleNamespace,
        wg: Int32,
        tile_idx: Int32,
        q_state: pipeline.PipelineState,
        kv_state: pipeline.PipelineState,
    ):
        """Steps 3 to 7 of one tile; returns the advanced pipeline states."""
        tile = self.tile_at(tiles, tile_idx)
        if cutlass.const_expr(self.config.packed):
            mask = mask.with_tile_info(tile.tile_info)
        mma.acc_O.fill(0.0)
        softmax.reset()
        pipes.q.consumer_wait(q_state)
        if cutlass.const_expr(self.config.alibi):  # the tile's slope in S's units
            tile.alibi_slope = alibi_slope(mma.alibi, tile.seq.batch_idx, tile.head_idx, softmax.scale_log2)
        if tile.n_block_max > tile.n_block_min:
            kv_state = self.mainloop(mma, pipes, softmax, mask, tile, wg, kv_state)
        if cutlass.const_expr(not self.config.o_aliases_q):
            pipes.q.consumer_release(q_state)  # the next tile's Q may load while this one's O is stored
        sink = mma.sink[tile.head_idx] if cutlass.const_expr(self.config.sink) else None
        self.epilogue(mO, mLSE, tma_O, sO, softmax, sink, mma.acc_O, mma.tiled_mma_pv, tile, wg)
        if cutlass.const_expr(self.config.o_aliases_q):
            pipes.q.consumer_release(q_state)  # O has left Q's shared memory
        q_state.advance()
        return q_state, kv_state

    @cute.jit
    def epilogue(
        self,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        tma_O: cute.CopyAtom,
        sO: cute.Tensor,
        softmax: OnlineSoftmax,
        sink: Float32 | None,
        acc_O: cute.Tensor,
        tiled_mma_pv: cute.TiledMma,
        tile: SimpleNamespace,
        wg: Int32,
    ):
        """Step 7: O = U / l, LSE; O leaves through this warpgroup's part of sQ (or its own buffer), by TMA, or in a
        packed batch by the threads' stores of the rows inside the sequence. ``sink``: the tile's head's learnable
        sink, with config.sink."""
        wg_tidx = cute.arch.thread_idx()[0] % 128
        inv_sum, lse = softmax.finalize(sink)
        softmax.rescale_o(acc_O, inv_sum)
        q_tile = tile.m_block * self.num_wg + wg
        rows_left = tile.seq.seqlen_q - q_tile * 64
        if cutlass.const_expr(self.config.packed):
            self.store_packed_o(mO, sO, acc_O, tiled_mma_pv, tile, q_tile, wg, wg_tidx, rows_left)
        else:
            self.store_o(mO, tma_O, sO, acc_O, tiled_mma_pv, tile, q_tile, wg, wg_tidx)
        gLSE = cute.local_tile(tile.seq.row_stats(mLSE, tile.head_idx), (64,), (q_tile,))
        store_lse(lse, gLSE, tiled_mma_pv.get_slice(wg_tidx), (64, self.head_dim_v), rows_left)

    @cute.jit
    def mainloop(
        self,
        mma: SimpleNamespace,
        pipes: SimpleNamespace,
        softmax: OnlineSoftmax,
        mask: AttentionMask,
        tile: SimpleNamespace,
        wg: Int32,
        state: pipeline.PipelineState,
    ) -> pipeline.PipelineState:
        """Steps 3 to 6 over the visited K/V tiles: the last one (it holds the seqlen_k tail, or crosses the
        diagonal), then the free run downwards (with ALiBi in three walks away from the diagonal), then the rest of
        the right-masked run, then the left-masked run (the producer loads them in this order). Takes and returns
        the K/V pipeline's read position.

        The free run comes first in the code because ptxas gives the first of the two step loops the better
        uniform registers: with the masked run first, the causal kernel's free step was 481 SASS instructions
        at D=256 (44 R2UR moving wgmma descriptors out of ordinary registers) against 390 for the same step in
        the kernel without a mask; free run first, 402 (D=128: 475 -> 459, against 446).
        """
        if cutlass.const_expr(self.config.packed):
            self.zero_stale_v_rows(mma, pipes, state, tile, wg)
        # The first tile's S and P; its P V is issued together with the next tile's Q K^T.
        slope = tile.alibi_slope if cutlass.const_expr(self.config.alibi) else None
        self.first_scores(mma, pipes, state, softmax, mask, tile.m_block, tile.n_block_max - 1, slope, wg)
        step = partial(self.overlapped_step, mma, pipes, softmax, mask, tile.m_block, slope, wg)
        for run in cutlass.range_constexpr(len(tile.runs)):  # TileInfo.visit_runs
            first, count, masked, side, direction = tile.runs[run]
            for i in cutlass.range(count, unroll=1):
                state = step(state, first + direction * i, masked, side)
        # The last tile's P V.
        if cutlass.const_expr(self.config.rescale_o_early):
            softmax.rescale_o(mma.acc_O, mma.row_scale)
        pipes.v.consumer_wait(state)
        self.gemm_pv(mma, state.index, 0)
        pipes.v.consumer_release(state)
        state.advance()
        return state

    @cute.jit
    def zero_stale_v_rows(
        self, mma: SimpleNamespace, pipes: SimpleNamespace, state: pipeline.PipelineState, tile: SimpleNamespace, wg
    ):
        """A packed sequence's first K/V tile visited holds its last keys and, where they do not fill it, rows past
        them that may hold anything (common/copy.py, zero_rows): the first consumer warpgroup zeroes those rows of
        V before any P V reads the stage, and every consumer warpgroup waits for it (K's rows are masked by
        select)."""
        keys_in_tile = tile.seq.seqlen_k - (tile.n_block_max - 1) * self.block_n
        # (the pipeline's consumer_wait, inside the branch, leaks a value out of it: its mbarrier wait instead)
        full, phase = pipes.v.sync_object_full.get_barrier(state.index), state.phase
        if keys_in_tile < self.block_n:
            cute.arch.mbarrier_wait(full, phase)
            if wg == 0:
                wg_tidx = cute.arch.thread_idx()[0] % 128
                gcopy.zero_rows(mma.zero_v, mma.sV[None, None, state.index], keys_in_tile, wg_tidx)
                cute.arch.fence_view_async_shared()  # the generic-proxy writes, visible to wgmma
            cute.arch.barrier(barrier_id=STALE_ROWS_BARRIER, number_of_threads=self.num_wg * 128)

    @cute.jit
    def first_scores(
        self,
        mma: SimpleNamespace,
        pipes: SimpleNamespace,
        state: pipeline.PipelineState,
        softmax: OnlineSoftmax,
        mask: AttentionMask,
        m_block: Int32,
        n_block: Int32,
        alibi_slope: Float32 | None,
        wg: Int32,
    ):
        """Steps 3 to 5 for the first K/V tile visited (fully masked: it holds the seqlen_k tail). Its Q K^T takes
        a turn like every other step's MMAs, so the other warpgroups wait for this one's epilogue and first Q K^T
        only, not also for its first softmax."""
        acc_S = mma.thr_mma_qk.make_fragment_C(mma.thr_mma_qk.partition_shape_C((64, self.block_n)))
        pipes.k.consumer_wait(state)
        self.take_turn(wg)
        self.gemm_qk(mma, acc_S, state.index)
        self.pass_turn(wg)
        cute.nvgpu.warpgroup.wait_group(0)
        pipes.k.consumer_release(state)
        if cutlass.const_expr(self.config.softcap):  # S = tanh(S * softmax_scale / softcap)
            apply_softcap(acc_S, mma.softcap_multiplier)
        if cutlass.const_expr(self.config.alibi):  # S -= slope * |i + offset - j|
            mask.apply_alibi(acc_S, m_block, n_block, alibi_slope)
        mask.apply_mask(acc_S, m_block, n_block, True)
        row_scale = softmax.online_softmax(acc_S)
        store_probs(acc_S, mma.tOrP)
        if cutlass.const_expr(self.config.rescale_o_early):
            mma.row_scale.store(row_scale.load())  # (U is still 0; kept for the uniform step)

    @cute.jit
    def overlapped_step(
        self,
        mma: SimpleNamespace,
        pipes: SimpleNamespace,
        softmax: OnlineSoftmax,
        mask: AttentionMask,
        m_block: Int32,
        alibi_slope: Float32 | None,
        wg: Int32,
        state: pipeline.PipelineState,
        n_block: Int32,
        mask_rows: cutlass.Constexpr[bool],
        side: cutlass.Constexpr[int],
    ) -> pipeline.PipelineState:
        """S = Q K[n]^T and O += P V[previous tile] in flight together; softmax of S while P V finishes (with
        lazy rescaling on an unmasked tile, E against the kept max after it, straight into P). ``side``: where
        the tile lies from the diagonal, for ALiBi's linear form (TileInfo.visit_runs; 0: the exact form)."""
        # Lazy rescaling on an unmasked tile skips the row max. Such steps come right after the first tile
        # (TileInfo.visit_runs: the free run first), whose U is still 0, or after another of them, which leaves
        # row_scale at 1: so they skip rescale_o_early's multiplies too.
        kept_max = not mask_rows
        v_state = state.clone()
        state.advance()
        acc_S = mma.thr_mma_qk.make_fragment_C(mma.thr_mma_qk.partition_shape_C((64, self.block_n)))
        if cutlass.const_expr(self.config.turn_before_k):
            self.take_turn(wg)
        pipes.k.consumer_wait(state)
        if cutlass.const_expr(not self.config.turn_before_k):
            self.take_turn(wg)
        self.gemm_qk(mma, acc_S, state.index)
        if cutlass.const_expr(self.config.rescale_o_early and not kept_max):
            softmax.rescale_o(mma.acc_O, mma.row_scale)  # the previous tile's alpha, while Q K^T runs
        if cutlass.const_expr(self.config.pass_turn_after_qk):
            self.pass_turn(wg)
        pipes.v.consumer_wait(v_state)
        self.gemm_pv(mma, v_state.index, -1)
        if cutlass.const_expr(not self.config.pass_turn_after_qk):
            self.pass_turn(wg)
        cute.nvgpu.warpgroup.wait_group(1)  # S has landed; P V may still run
        if cutlass.const_expr(self.config.softcap):  # S = tanh(S * softmax_scale / softcap), under P V too
            apply_softcap(acc_S, mma.softcap_multiplier)
        shift = None  # S's rows less a constant each (OnlineSoftmax), with ALiBi's linear form
        if cutlass.const_expr(self.config.alibi):  # S -= slope * |i + offset - j|, under P V too
            shift = self.bias_scores(acc_S, mask, m_block, n_block, alibi_slope, side)
        if cutlass.const_expr(kept_max and self.config.exp_in_place):  # E in place of S while P V runs
            sK = mma.sK[None, None, state.index]
            scores = (mask, m_block, n_block, alibi_slope, side)
            recompute = partial(self.recompute_scores, acc_S, mma.sQ, sK, mma.softcap_multiplier, *scores)
            moved = softmax.online_softmax_in_place(acc_S, mma.row_scale, recompute, shift)
            pipes.k.consumer_release(state)  # (recompute may have read K)
            cute.nvgpu.warpgroup.wait_group(0)  # P V is done with the old P and with acc_O
            pipes.v.consumer_release(v_state)
            softmax.rescale_o(mma.acc_O, mma.row_scale, moved)
            store_probs(acc_S, mma.tOrP)
            if cutlass.const_expr(self.config.rescale_o_early):
                mma.row_scale.fill(1.0)  # U is up to date: nothing left for the next step's early rescale
        elif cutlass.const_expr(kept_max):  # E against the kept max goes straight into P, so it waits for P V
            pipes.k.consumer_release(state)
            cute.nvgpu.warpgroup.wait_group(0)
            pipes.v.consumer_release(v_state)
            rP = cute.make_tensor(mma.tOrP.iterator, acc_S.layout)
            softmax.online_softmax_kept_max(acc_S, mma.acc_O, rP, self.config.empty_rows_keep_zero, shift)
            if cutlass.const_expr(self.config.rescale_o_early):
                mma.row_scale.fill(1.0)
        else:
            pipes.k.consumer_release(state)
            if cutlass.const_expr(mask_rows):
                mask.apply_mask(acc_S, m_block, n_block, True)
            row_scale = softmax.online_softmax(acc_S, shift)
            cute.nvgpu.warpgroup.wait_group(0)  # P V is done with the old P and with acc_O
            pipes.v.consumer_release(v_state)
            store_probs(acc_S, mma.tOrP)
            if cutlass.const_expr(self.config.rescale_o_early):
                mma.row_scale.store(row_scale.load())
            else:
                softmax.rescale_o(mma.acc_O, row_scale)
        return state

    @cute.jit
    def recompute_scores(
        self,
        acc_S: cute.Tensor,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        softcap_multiplier: Float32 | None,
        mask: AttentionMask,
        m_block: Int32,
        n_block: Int32,
        alibi_slope: Float32 | None,
        side: cutlass.Constexpr[int],
    ):
        """S again by FMAs (wgmma.scores_by_fma), for move_kept_max where E cannot tell where the max went; capped
        and biased as the tensor cores' S was, with config.softcap and config.alibi (in the same form, so that S
        holds the same shift)."""
        scores_by_fma(acc_S, mask.tScS, sQ, sK)
        if cutlass.const_expr(self.config.softcap):
            apply_softcap(acc_S, softcap_multiplier)
        if cutlass.const_expr(self.config.alibi):
            self.bias_scores(acc_S, mask, m_block, n_block, alibi_slope, side)

    @staticmethod
    def bias_scores(
        acc_S: cute.Tensor,
        mask: AttentionMask,
        m_block: Int32,
        n_block: Int32,
        alibi_slope: Float32,
        side: cutlass.Constexpr[int],
    ) -> list | None:
        """Step 3's ALiBi bias: the exact form (side 0), or on a tile wholly on one side of the diagonal the linear
        form, whose per-row rest it returns as the softmax's shift (common/alibi.py)."""
        if cutlass.const_expr(side == 0):
            mask.apply_alibi(acc_S, m_block, n_block, alibi_slope)
            return None
        return mask.apply_alibi_on_side(acc_S, m_block, n_block, alibi_slope, side)

    def gemm_qk(self, mma: SimpleNamespace, acc_S: cute.Tensor, stage: Int32):
        """Step 3: S = Q K[stage]^T, both from shared memory, issued without waiting (wait_group does)."""
        gemm_steps(mma.tiled_mma_qk, acc_S, mma.tSrQ, self.key_steps(mma.tSrK, stage), True, -1)

    @staticmethod
    def gemm_pv(mma: SimpleNamespace, stage: Int32, wait: cutlass.Constexpr[int]):
        """Step 6: O += P V[stage], P from registers; ``wait``: wgmma groups left in flight (-1: do not wait)."""
        gemm(mma.tiled_mma_pv, mma.acc_O, mma.tOrP, mma.tOrVt[None, None, None, stage], False, wait)

    def key_steps(self, tSrK: cute.Tensor, stage: Int32) -> list[cute.Tensor]:
        """K's k-step operands in K/V stage ``stage``, computed in the form config.k_descriptors names."""
        return stage_steps(tSrK, stage, self.config.k_descriptors)

    def take_turn(self, wg: Int32):
        """Wait until the other consumer warpgroup has issued its MMAs (no-op unless self.take_turns)."""
        if cutlass.const_expr(self.take_turns):
            cute.arch.barrier(barrier_id=SCHEDULER_BARRIER + wg, number_of_threads=256)

    def pass_turn(self, wg: Int32):
        """Let the next consumer warpgroup issue its MMAs."""
        if cutlass.const_expr(self.take_turns):
            next_wg = (wg + 1) % self.num_wg
            cute.arch.barrier_arrive(barrier_id=SCHEDULER_BARRIER + next_wg, number_of_threads=256)

    @cute.jit
    def store_o(
        self,
        mO: cute.Tensor,
        tma_O: cute.CopyAtom,
        sO: cute.Tensor,
        acc_O: cute.Tensor,
        tiled_mma_pv: cute.TiledMma,
        tile: SimpleNamespace,
        q_tile: Int32,
        wg: Int32,
        wg_tidx: Int32,
    ):
        """Registers -> this warpgroup's (64, D) shared-memory tile -> TMA store.

        sO is this warpgroup's alone: its own buffer, or its part of sQ, which only its own Q K^T read. The barrier
        first makes every thread wait for the warp that stored the previous tile's O from the same buffer. In its
        own buffer, the store of O runs on while the warpgroup goes on to the next tile: the storing warp waits for
        it to have read the buffer only before the next tile's O is written there (and at the end, consume). Under
        sQ it waits at once, since Q's buffer is released for the next Q right after.
        """
        rO = converted(acc_O, self.dtype)
        if cutlass.const_expr(not self.config.o_aliases_q):  # noqa: SIM102 (a compile-time test around a run-time one)
            if wg_tidx < 32:
                cute.arch.cp_async_bulk_wait_group(0, read=True)  # the previous tile's store has read sO
        cute.arch.barrier(barrier_id=EPILOGUE_BARRIER + wg, number_of_threads=128)
        smem_copy = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype), tiled_mma_pv)
        thr_copy = smem_copy.get_slice(wg_tidx)
        cute.copy(smem_copy, thr_copy.retile(rO), thr_copy.partition_D(sO))
        cute.arch.fence_view_async_shared()  # the generic-proxy writes, visible to the TMA unit
        cute.arch.barrier(barrier_id=EPILOGUE_BARRIER + wg, number_of_threads=128)
        gO = cute.local_tile(tile.seq.rows_q(mO, tile.head_idx, 0), (64, self.head_dim_v), (q_tile, 0))
        if wg_tidx < 32:
            tOsO, tOgO = cpasync.tma_partition(
                tma_O, 0, cute.make_layout(1), cute.group_modes(sO, 0, 2), cute.group_modes(gO, 0, 2)
            )
            cute.copy(tma_O, tOsO, tOgO)
            cute.arch.cp_async_bulk_commit_group()
            if cutlass.const_expr(self.config.o_aliases_q):
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def store_packed_o(
        self,
        mO: cute.Tensor,
        sO: cute.Tensor,
        acc_O: cute.Tensor,
        tiled_mma_pv: cute.TiledMma,
        tile: SimpleNamespace,
        q_tile: Int32,
        wg: Int32,
        wg_tidx: Int32,
        rows_left: Int32,
    ):
        """Registers -> this warpgroup's (64, D) shared-memory tile -> 16-byte stores of the rows before
        ``rows_left``: a TMA box would run on into the next sequence's rows, which another tile writes.

        The first barrier makes every thread wait until the warpgroup's threads have read the previous tile's O out
        of the buffer (the reads are synchronous, so no bulk-copy wait is needed)."""
        cute.arch.barrier(barrier_id=EPILOGUE_BARRIER + wg, number_of_threads=128)
        dv = self.head_dim_v
        gO = cute.local_tile(tile.seq.rows_q(mO, tile.head_idx), (64, dv), (q_tile, 0))
        gmem_tiled_copy_O = gcopy.make_gmem_tiled_copy(self.dtype, dv, 128, False)
        store_o(
            acc_O,
            sO,
            gO,
            tiled_mma_pv,
            gmem_tiled_copy_O,
            wg_tidx,
            rows_left,
            mO.shape[3],
            not exact_value_head_dim(self.config),
            barrier_threads=128,
            barrier_id=EPILOGUE_BARRIER + wg,
        )
