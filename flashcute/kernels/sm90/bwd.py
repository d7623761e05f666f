"""The FlashAttention backward kernel for Hopper (sm_90a): TMA, wgmma and warp specialization.

One thread block owns one (block_n, head_dim) tile of K and V for one (batch, kv head) and walks every query head
of its GQA group and every Q tile that sees its keys, as the sm80 backward does; dK and dV stay in registers for
the whole walk and dQ is added across thread blocks with float32 reductions into a zeroed buffer that a
postprocess casts. The steps of one Q tile run transposed, with the keys as rows, so that every
operand the dV and dK GEMMs need as "A" is already in registers:

    S^T  = K Q^T         (wgmma, both from shared memory)
    dP^T = V dO^T        (wgmma, both from shared memory)
    P^T  = exp2(S^T * scale_log2 - LSE * log2 e)           per column (query) LSE
    dS^T = P^T * (dP^T - D)                                per column D = rowsum(dO * O)
    dV  += P^T dO        (wgmma, P^T from registers, dO^T a transposed view of the dO tile)
    dK  += dS^T Q        (wgmma, dS^T from registers)
    dQ   = dS K          (wgmma from shared memory: dS^T is written there once, read through a transposed view;
                          for 80-row Q tiles dQ^T = K^T dS^T, the head dim as rows: config.dq_transposed)
    (dK times softmax_scale once at the end, dQ in the postprocess that casts it)

With softcap, S^T is capped first and dS^T takes the cap's derivative (kernels/common/softcap.py).

dQ of a step goes registers -> shared memory (float32) -> global memory with a TMA reduce-add
(cp.reduce.async.bulk.tensor), which adds a whole tile at L2 and clips rows past seqlen_q and columns past the
head dim, so the consumers issue no per-element atomics. A warp of its own, the dQ writer, issues the reduce-adds
and waits for them to have read shared memory; the consumers only wait, at the next step, until their dQ tile is
free, and (dk_after_dq) write it while dK's MMA runs (docs/tuning-sm90.md, Backward dQ writer warp).

Warpgroup 0 is the producer: one warp loads K and V once, then Q with its LSE and dO with its D for every Q tile
into a ring of num_stages buffers guarded by mbarriers (TMA for the tiles, bulk copies for the two rows of
statistics); another is the dQ writer. The kernel is launched to start while the preprocess ends (programmatic
dependent launch): the producer issues K's and V's loads, then waits for the preprocess's grid to finish before it
reads the statistics (nothing else reads what the preprocess writes before they arrive). Warpgroups 1 and 2 are
consumers, 64 key rows each. The host passes
LSE * log2(e) and D padded to whole Q tiles (+inf and 0 past seqlen_q, +inf where a row saw no key), so the
recomputed P is 0 on every row that must not contribute. K/V rows past seqlen_k load as zeros and are masked,
so no NaN reaches dQ. In a packed batch (common/seqlen.py) those rows are the next sequence's or no sequence's,
which may hold anything: the consumers zero them in shared memory before the walk (walk); each sequence's LSE and
D rows start on a whole Q tile (family.PaddedStatsRows).
"""

import dataclasses
from functools import partial
from types import SimpleNamespace

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup

from flashcute.kernels.common import copy as gcopy
from flashcute.kernels.common import semaphore, tma
from flashcute.kernels.common.alibi import alibi_slope
from flashcute.kernels.common.copy import make_gmem_tiled_copy
from flashcute.kernels.common.dtypes import CUTLASS_DTYPES
from flashcute.kernels.common.epilogue import store_o
from flashcute.kernels.common.limits import MAX_SMEM_BYTES, dtype_limits
from flashcute.kernels.common.mask import TransposedMask
from flashcute.kernels.common.scheduler import heads_per_section, rotated, rotated_place, rotation, tile_coords
from flashcute.kernels.common.seqlen import SeqLens
from flashcute.kernels.common.softcap import apply_softcap, keep_t, softcap_grad_kept, softcap_grad_t, softcap_scales
from flashcute.kernels.common.softmax import column_stats, recompute_probs_t, softmax_grad_t
from flashcute.kernels.common.tile_info import TileInfo
from flashcute.kernels.common.wgmma import gemm, store_probs, transpose_view
from flashcute.kernels.sm90.config import Sm90BwdConfig

PRODUCER_REGS = 24
CONSUMER_REGS = 240
# Named barriers (0 is __syncthreads): among the 256 consumer threads, dS of a step is in shared memory, and the
# epilogue's shared-memory staging of dK and dV; per consumer warpgroup (+ its index) and the dQ writer warp, its
# dQ tile in shared memory is free to write (the writer's last reduce-add has read it), and is written.
DS_BARRIER = 1
EPILOGUE_BARRIER = 2
DQ_EMPTY_BARRIER = 3
DQ_FULL_BARRIER = 5
STALE_ROWS_BARRIER = 7  # the consumers wait for K's and V's rows past a packed sequence's keys to be zeroed
CONSUMER_THREADS = 256
DQ_HANDOFF_THREADS = 128 + 32  # a consumer warpgroup and the dQ writer warp


def _tiled_mma(dtype, a_major, b_major, atoms_mn: tuple[int, int], atom_n: int, a_in_registers: bool = False):
    """A tiled wgmma over the two consumer warpgroups: ``atoms_mn`` warpgroups along (M, N), each 64 x atom_n."""
    return sm90_utils.make_trivial_tiled_mma(
        dtype,
        dtype,
        a_major,
        b_major,
        Float32,
        (*atoms_mn, 1),
        (64, atom_n),
        warpgroup.OperandSource.RMEM if a_in_registers else warpgroup.OperandSource.SMEM,
    )


class FlashAttentionBackwardSm90:
    """dK, dV (and dQ through TMA reduce-adds) on Hopper. Construct from a Sm90BwdConfig; compile for sm_90a."""

    DKV_TRANSPOSED = False  # the dK and dV accumulators are (block_n, head_dim)

    def __init__(self, config: Sm90BwdConfig):
        self.config = config
        self.dtype = CUTLASS_DTYPES[config.dtype]
        self.block_m = config.block_m
        self.block_n = config.block_n
        self.head_dim_padded = config.head_dim_padded
        self.num_stages = config.num_stages
        # the (rows, columns) of the dQ tile that one consumer warpgroup adds
        self.dq_cols = config.head_dim_padded if config.dq_split_rows else config.head_dim_padded // 2
        self.dq_rows = 64 if config.dq_split_rows else config.block_m
        # deterministic without a mask: each K/V tile walks the Q tiles from its own start (scheduler.rotation), so
        # that the K/V tiles of a head, which see the same Q tiles and start side by side, do not queue for each
        # Q tile's dQ one after another (where a head's tiles all run at once: scheduler.ROTATION_SPAN)
        self.rotates = config.deterministic and not (config.mask_right or config.mask_left)

    @classmethod
    def can_implement(cls, config: Sm90BwdConfig, arch: str) -> str | None:
        """None if the kernel can be built for ``config`` on target ``arch``, else the reason it cannot."""
        if arch != "sm_90a":
            return f"the sm90 backward needs TMA and wgmma: target sm_90a, not {arch}"
        reason = dtype_limits(config) or cls.tile_reason(config)
        if reason is None and config.smem_bytes() > MAX_SMEM_BYTES[arch]:
            reason = f"needs {config.smem_bytes()} bytes of shared memory, over {arch}'s {MAX_SMEM_BYTES[arch]}"
        return reason

    @staticmethod
    def tile_reason(config: Sm90BwdConfig) -> str | None:
        """Why the kernel cannot take ``config``'s tiles and head dim, or None."""
        if config.block_n != 128:
            return f"block_n={config.block_n} is not 128 (two consumer warpgroups of 64 key rows)"
        if config.block_m not in (64, 80, 128):
            return f"block_m={config.block_m} is not 64, 80 or 128"
        if config.dq_transposed and config.head_dim_padded != 128:
            return f"block_m={config.block_m} computes dQ^T, 64 head-dim rows a warpgroup: head_dim_padded 128 only"
        if config.head_dim_padded > 128:
            return f"head_dim_padded={config.head_dim_padded} is over 128 (the register budget of dK and dV)"
        return None

    # ---------------------------------------------------------------- host side: layouts, tensor maps, launch
    def smem_layouts(self) -> tuple:
        """Shared-memory layouts: Q's (also dO's), K's, V's, dS's, LSE's (also D's) and the dQ tile's."""
        d, bm, bn, stages = self.head_dim_padded, self.block_m, self.block_n, self.num_stages
        return (
            tma.smem_layout(self.dtype, bm, d, stages),
            # K's swizzle atoms no wider than a warpgroup's dQ columns, which its K^T view is split into (48 at D=96)
            tma.smem_layout(self.dtype, bn, d, 1, atom_cols=self.dq_cols),
            tma.smem_layout(self.dtype, bn, d, 1),
            tma.smem_layout(self.dtype, bn, bm, stages),  # dS^T: key rows, query columns contiguous
            cute.make_layout((bm, stages)),
            # each consumer warpgroup's (dq_rows, dq_cols) part of the dQ tile, float32
            tma.smem_layout(Float32, self.dq_rows, self.dq_cols, 2),
        )

    def tiled_mmas(self) -> SimpleNamespace:
        """The GEMMs of a step over the two consumer warpgroups: S^T and dP^T, dV and dK, dQ."""
        d, bm = self.head_dim_padded, self.block_m
        K, MN = OperandMajorMode.K, OperandMajorMode.MN
        return SimpleNamespace(
            # S^T and dP^T: (block_n, block_m), a warpgroup's 64 key rows each
            sdp=_tiled_mma(self.dtype, K, K, (2, 1), bm),
            # dV and dK: (block_n, head_dim), A = P^T or dS^T from registers, B = dO^T or Q^T (N-major views)
            dkv=_tiled_mma(self.dtype, K, MN, (2, 1), d, a_in_registers=True),
            # dQ: (block_m, head_dim), A = dS (a transposed view of dS^T), B = K^T (a transposed view of K); or
            # dQ^T: (head_dim, block_m), A = K^T, B = dS, each warpgroup 64 head-dim rows
            dq=self._dq_mma(),
        )

    def _dq_mma(self) -> cute.TiledMma:
        d, bm, MN = self.head_dim_padded, self.block_m, OperandMajorMode.MN
        if self.config.dq_transposed:
            return _tiled_mma(self.dtype, MN, MN, (2, 1), bm)
        if self.config.dq_split_rows:
            return _tiled_mma(self.dtype, MN, MN, (2, 1), d)
        return _tiled_mma(self.dtype, MN, MN, (1, 2), d // 2)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (batch, seqlen_q, nheads, head_dim)
        mK: cute.Tensor,  # (batch, seqlen_k, nheads_k, head_dim)
        mV: cute.Tensor,
        mdO: cute.Tensor,  # (batch, seqlen_q, nheads, head_dim)
        mLSE: cute.Tensor,  # (batch, nheads, seqlen_q rounded up to block_m) float32: LSE * log2(e), padded
        mD: cute.Tensor,  # (batch, nheads, seqlen_q rounded up to block_m) float32: rowsum(dO * O), padded
        mdQaccum: cute.Tensor,  # (batch, seqlen_q, nheads, head_dim) float32, zeroed
        mdK: cute.Tensor,  # (batch, seqlen_k, nheads_k, head_dim)
        mdV: cute.Tensor,
        softmax_scale: Float32,
        diag_offset: Int32,
        window_left: Int32,
        window_right: Int32,
        stream: cuda.CUstream,
        mCuSeqlensQ: cute.Tensor | None = None,  # packed batches (common/seqlen.py)
        mCuSeqlensK: cute.Tensor | None = None,
        mSeqUsedQ: cute.Tensor | None = None,
        mSeqUsedK: cute.Tensor | None = None,
        max_seqlen_q: Int32 | None = None,
        max_seqlen_k: Int32 | None = None,
        softcap: Float32 | None = None,  # the cap, when config.softcap (kernels/common/softcap.py)
        mAlibi: cute.Tensor | None = None,  # (batch, nheads) float32: ALiBi slopes, when config.alibi (common/alibi.py)
        mSemaphore: cute.Tensor | None = None,  # (batch, nheads, Q tiles) int32, zeroed: with config.deterministic
    ):
        d, bm, bn = self.head_dim_padded, self.block_m, self.block_n
        sQ_layout, sK_layout, sV_layout, sdS_layout, sLSE_layout, sdQ_layout = self.smem_layouts()

        mQ_t, mK_t, mV_t, mdO_t = (tma.bshd_to_sdhb(t) for t in (mQ, mK, mV, mdO))
        load = cpasync.CopyBulkTensorTileG2SOp()
        tma_Q, tQ = tma.make_tma(load, mQ_t, sQ_layout, bm, d)
        tma_dO, tdO = tma.make_tma(load, mdO_t, sQ_layout, bm, d)
        tma_K, tK = tma.make_tma(load, mK_t, sK_layout, bn, d)
        tma_V, tV = tma.make_tma(load, mV_t, sV_layout, bn, d)
        reduce_add = cpasync.CopyReduceBulkTensorTileS2GOp()
        tma_dQ, tdQ = tma.make_tma(reduce_add, tma.bshd_to_sdhb(mdQaccum), sdQ_layout, self.dq_rows, self.dq_cols)
        self.tx_bytes_q = tma.tx_bytes(self.dtype, sQ_layout) + bm * 4  # a Q (or dO) tile and its LSE (or D) row
        self.tx_bytes_kv = tma.tx_bytes(self.dtype, sK_layout) + tma.tx_bytes(self.dtype, sV_layout)

        mmas = self.tiled_mmas()

        @cute.struct
        class SharedStorage:
            mbar_kv: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2 * self.num_stages]
            mbar_do: cute.struct.MemRange[cutlass.Int64, 2 * self.num_stages]
            sLSE: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sLSE_layout)], 128]
            sD: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sLSE_layout)], 128]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sdS_layout)], 1024]
            sdQ: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sdQ_layout)], 1024]

        assert SharedStorage.size_in_bytes() <= self.config.smem_bytes(), "Sm90BwdConfig.smem_bytes undercounts"

        batch, seqlen_q, seqlen_k = mK.shape[0], mQ.shape[1], mK.shape[1]
        if cutlass.const_expr(self.config.packed):
            batch, seqlen_q, seqlen_k = mSeqUsedK.shape[0], max_seqlen_q, max_seqlen_k
        num_n_blocks = cute.ceil_div(seqlen_k, bn)
        self.kernel(
            tQ,
            tK,
            tV,
            tdO,
            mLSE,
            mD,
            tdQ,
            mdK,
            mdV,
            tma_Q,
            tma_K,
            tma_V,
            tma_dO,
            tma_dQ,
            mCuSeqlensQ,
            mCuSeqlensK,
            mSeqUsedQ,
            mSeqUsedK,
            mAlibi,
            mSemaphore,
            softmax_scale,
            softcap,
            diag_offset,
            window_left,
            window_right,
            num_n_blocks,
            # Under a mask, K/V tiles go longest first in sections of kv heads whose Q, dO (2 bytes an element) and
            # float32 dQ accumulator fit in L2 together; without one, every K/V tile of a head before the next head
            # (all the same length).
            heads_per_section(seqlen_q * (mQ.shape[2] // mK.shape[2]), 8 * d)
            if cutlass.const_expr(self.config.mask_right)
            else 1,
            batch,
            mQ.shape[1],
            mK.shape[1],
            mQ.shape[3],
            sQ_layout,
            sK_layout,
            sV_layout,
            sdS_layout,
            sLSE_layout,
            sdQ_layout,
            mmas.sdp,
            mmas.dkv,
            mmas.dq,
            SharedStorage,
        ).launch(
            grid=[num_n_blocks * mK.shape[2] * batch, 1, 1],
            block=[self.config.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
            use_pdl=True,  # starts while the preprocess ends (bwd_pre.py), which the producer waits for
        )

    # ---------------------------------------------------------------- device side
    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,  # TMA coordinate tensors, (seqlen, head_dim, heads, batch)
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mD: cute.Tensor,
        mdQaccum: cute.Tensor,  # TMA coordinate tensor, (seqlen, head_dim, heads, batch)
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        tma_Q: cute.CopyAtom,
        tma_K: cute.CopyAtom,
        tma_V: cute.CopyAtom,
        tma_dO: cute.CopyAtom,
        tma_dQ: cute.CopyAtom,
        mCuSeqlensQ: cute.Tensor | None,
        mCuSeqlensK: cute.Tensor | None,
        mSeqUsedQ: cute.Tensor | None,
        mSeqUsedK: cute.Tensor | None,
        mAlibi: cute.Tensor | None,
        mSemaphore: cute.Tensor | None,
        softmax_scale: Float32,
        softcap: Float32 | None,
        diag_offset: Int32,
        window_left: Int32,
        window_right: Int32,
        num_n_blocks: Int32,
        section: Int32,
        batch: Int32,
        seqlen_q: Int32,
        seqlen_k: Int32,
        head_dim: Int32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sdS_layout: cute.ComposedLayout,
        sLSE_layout: cute.Layout,
        sdQ_layout: cute.ComposedLayout,
        tiled_mma_sdp: cute.TiledMma,
        tiled_mma_dkv: cute.TiledMma,
        tiled_mma_dq: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        cfg = self.config
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            for atom in (tma_Q, tma_K, tma_V, tma_dO, tma_dQ):
                cpasync.prefetch_descriptor(atom)

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        make_pipeline = partial(pipeline.PipelineTmaAsync.create, producer_group=producer, defer_sync=True)
        # Q's and dO's stages are released by every consumer thread, not by one lane a warp: each thread's own
        # arrive orders its reads of the stage's LSE (D) row (plain shared-memory loads) before the producer's next
        # bulk copy into it. K and V are never released.
        every_thread = pipeline.CooperativeGroup(pipeline.Agent.Thread, CONSUMER_THREADS)
        tile_pipeline = partial(
            make_pipeline, num_stages=self.num_stages, tx_count=self.tx_bytes_q, consumer_group=every_thread
        )
        pipes = SimpleNamespace(
            kv=make_pipeline(
                num_stages=1,
                tx_count=self.tx_bytes_kv,
                barrier_storage=storage.mbar_kv.data_ptr(),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, CONSUMER_THREADS // 32),
            ),
            q=dataclasses.replace(tile_pipeline(barrier_storage=storage.mbar_q.data_ptr()), is_signaling_thread=True),
            do=dataclasses.replace(tile_pipeline(barrier_storage=storage.mbar_do.data_ptr()), is_signaling_thread=True),
        )
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        smem = SimpleNamespace(
            sQ=storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner),  # (block_m, D, stage)
            sdO=storage.sdO.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner),
            sK=storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner),  # (block_n, D, 1)
            sV=storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner),
            sdS=storage.sdS.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner),  # (block_n, block_m, stage)
            sLSE=storage.sLSE.get_tensor(sLSE_layout),  # (block_m, stage)
            sD=storage.sD.get_tensor(sLSE_layout),
            sdQ=storage.sdQ.get_tensor(sdQ_layout.outer, swizzle=sdQ_layout.inner),  # (64, dq_cols, warpgroup)
        )

        # ---- step 1: our K/V tile, and the (query head, Q tile) pairs that see it
        bidx, _, _ = cute.arch.block_idx()
        nheads_k = mK.shape[2]
        # longest first: under a causal mask the first K/V tiles are seen by the most Q tiles (scheduler.py)
        last_first, kv_head_idx, batch_idx = tile_coords(bidx, num_n_blocks, nheads_k, batch, section)
        n_block = num_n_blocks - 1 - last_first
        seq = SeqLens(batch_idx, seqlen_q, seqlen_k, diag_offset, mCuSeqlensQ, mCuSeqlensK, mSeqUsedQ, mSeqUsedK)
        tile_info = TileInfo.of(cfg, seq.seqlen_q, seq.seqlen_k, seq.diag_offset, window_left, window_right)
        m_block_min, m_block_max = tile_info.m_block_range(n_block)
        stats_offset = Int32(0)
        if cutlass.const_expr(seq.packed):
            if n_block * self.block_n >= seq.seqlen_k:  # past a shorter sequence's end: no keys, no Q tile to walk
                m_block_max = m_block_min
            # the sequence's rows of LSE and D start on a whole Q tile, padded_stats_offset (family.py)
            stats_offset = (seq.offset_q + batch_idx * self.block_m) // self.block_m * self.block_m
        qheads_per_kvhead = mQ.shape[2] // nheads_k
        _, num_n_blocks = tile_info.n_block_range(m_block_min)  # the sequence's K/V tiles (rotation, wait_turn)
        work = SimpleNamespace(
            n_block=n_block,
            kv_head_idx=kv_head_idx,
            seq=seq,
            stats_offset=stats_offset,
            first_head_idx=kv_head_idx * qheads_per_kvhead,
            qheads_per_kvhead=qheads_per_kvhead,
            m_block_min=m_block_min,
            m_block_max=m_block_max,
            num_m_blocks=m_block_max - m_block_min,
            num_n_blocks=num_n_blocks,
            start=rotation(n_block, cutlass.max(m_block_max - m_block_min, 1), num_n_blocks) if self.rotates else 0,
        )
        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp_idx == 0:
                self.load(mQ, mK, mV, mdO, mLSE, mD, smem, tma_Q, tma_K, tma_V, tma_dO, pipes, work)
            elif warp_idx == 1:
                self.write_dq(mdQaccum, tma_dQ, smem.sdQ, work, tile_info, mSemaphore)
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            self.consume(
                mdK,
                mdV,
                smem,
                pipes,
                work,
                tile_info,
                softmax_scale,
                softcap,
                mAlibi,
                head_dim,
                tiled_mma_sdp,
                tiled_mma_dkv,
                tiled_mma_dq,
            )

    # ---------------------------------------------------------------- step 2: the producer warp
    @cute.jit
    def load(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mD: cute.Tensor,
        smem: SimpleNamespace,
        tma_Q: cute.CopyAtom,
        tma_K: cute.CopyAtom,
        tma_V: cute.CopyAtom,
        tma_dO: cute.CopyAtom,
        pipes: SimpleNamespace,
        work: SimpleNamespace,
    ):
        """K and V once; then per (query head, Q tile): Q with its LSE row, dO with its D row."""
        d = self.head_dim_padded
        pipe_kv, pipe_q, pipe_do = pipes.kv, pipes.q, pipes.do
        num_tiles = work.qheads_per_kvhead * work.num_m_blocks
        gK, gV = (work.seq.rows_k(mX, work.kv_head_idx, 0) for mX in (mK, mV))
        if num_tiles > 0:
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            tKsK, tKgK = tma.partition_tiles(tma_K, smem.sK, gK, self.block_n, d)
            tVsV, tVgV = tma.partition_tiles(tma_V, smem.sV, gV, self.block_n, d)
            pipe_kv.producer_acquire(kv_state)
            barrier = pipe_kv.producer_get_barrier(kv_state)
            cute.copy(tma_K, tKgK[None, work.n_block], tKsK[None, 0], tma_bar_ptr=barrier)
            cute.copy(tma_V, tVgV[None, work.n_block], tVsV[None, 0], tma_bar_ptr=barrier)
        # the preprocess's LSE, D and zeroed dQ accumulator: complete and visible once its grid has finished
        cute.arch.griddepcontrol_wait()
        bulk = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), Float32)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_stages)
        # this sequence's rows of every query head (sliced out before the loop: SeqLens.heads_q)
        mQ_s, mdO_s = (work.seq.heads_q(mX, 0) for mX in (mQ, mdO))
        mLSE_s, mD_s = (work.seq.heads_stats(mX, work.stats_offset) for mX in (mLSE, mD))
        for t in cutlass.range(num_tiles, unroll=1):
            head_idx, m_block = self.walk_tile(work, t)
            for pipe, tma_atom, mX, sX, mStat, sStat in (
                (pipe_q, tma_Q, mQ_s, smem.sQ, mLSE_s, smem.sLSE),
                (pipe_do, tma_dO, mdO_s, smem.sdO, mD_s, smem.sD),
            ):
                tXsX, tXgX = tma.partition_tiles(tma_atom, sX, mX[None, None, head_idx], self.block_m, d)
                gStat = cute.local_tile(mStat[head_idx, None], (self.block_m,), (m_block,))
                pipe.producer_acquire(state)
                barrier = pipe.producer_get_barrier(state)
                cute.copy(tma_atom, tXgX[None, m_block], tXsX[None, state.index], tma_bar_ptr=barrier)
                with cute.arch.elect_one():
                    cute.copy(bulk, gStat, sStat[None, state.index], mbar_ptr=barrier)
            state.advance()

    # ---------------------------------------------------------------- the dQ writer warp
    @cute.jit
    def write_dq(
        self,
        mdQaccum: cute.Tensor,
        tma_dQ: cute.CopyAtom,
        sdQ: cute.Tensor,
        work: SimpleNamespace,
        tile_info: TileInfo,
        mSemaphore: cute.Tensor | None,
    ):
        """Per (query head, Q tile), in the consumers' order: tell each consumer warpgroup that its dQ tile is free
        (the reduce-add before has read it), wait until it is written, and add it into dQaccum by TMA.

        With config.deterministic the K/V tiles add into a Q tile in a fixed order, the launch order (first K/V
        tile first, common/semaphore.py): the writer waits until the Q tile's counter says that every K/V tile
        before this one has added, adds, and once its adds are done (not only read) moves the counter on. It
        frees the consumers' dQ tiles first, as soon as the adds have read them, so that the consumers stage the
        next dQ while the adds complete and the writer waits its next turn."""
        mdQ_s = work.seq.heads_q(mdQaccum, 0)  # this sequence's rows of every query head
        counters = None
        if cutlass.const_expr(self.config.deterministic):  # this sequence's Q tiles' counters, every query head
            counters = work.seq.heads_stats(mSemaphore, work.stats_offset // self.block_m)
        num_tiles = work.qheads_per_kvhead * work.num_m_blocks
        dq_box = (self.dq_rows, self.dq_cols)
        for t in cutlass.range(num_tiles, unroll=1):
            head_idx, m_block = self.walk_tile(work, t)
            for wg in cutlass.range_constexpr(2):
                cute.arch.cp_async_bulk_wait_group(1 - wg, read=True)  # this warpgroup's last reduce-add has read
                cute.arch.barrier_arrive(barrier_id=DQ_EMPTY_BARRIER + wg, number_of_threads=DQ_HANDOFF_THREADS)
            if cutlass.const_expr(self.config.deterministic):
                self.end_turn(counters, work, t - 1)
                self.wait_turn(counters, tile_info, work, head_idx, m_block)
            for wg in cutlass.range_constexpr(2):
                # the warpgroup's (dq_rows, dq_cols) box: rows split by warpgroup (block_m = 128) or columns
                box = (m_block * 2 + wg, 0) if cutlass.const_expr(self.config.dq_split_rows) else (m_block, wg)
                cute.arch.barrier(barrier_id=DQ_FULL_BARRIER + wg, number_of_threads=DQ_HANDOFF_THREADS)
                tdQsdQ, tdQgdQ = cpasync.tma_partition(
                    tma_dQ,
                    0,
                    cute.make_layout(1),
                    cute.group_modes(sdQ[None, None, wg], 0, 2),
                    cute.group_modes(cute.local_tile(mdQ_s[None, None, head_idx], dq_box, box), 0, 2),
                )
                cute.copy(tma_dQ, tdQsdQ, tdQgdQ)
                cute.arch.cp_async_bulk_commit_group()
        if cutlass.const_expr(self.config.deterministic):
            self.end_turn(counters, work, num_tiles - 1)
        cute.arch.cp_async_bulk_wait_group(0, read=True)  # shared memory stays until the last reduce-add has read it

    @cute.jit
    def end_turn(self, counters: cute.Tensor, work: SimpleNamespace, t: Int32):
        """Once the reduce-adds of the writer's t-th (query head, Q tile) are done, not only read, move that Q
        tile's counter on: the next K/V tile's turn (one lane); nothing for t < 0."""
        if t >= 0:
            cute.arch.cp_async_bulk_wait_group(0, read=False)
            if cute.arch.lane_idx() == 0:
                head_idx, m_block = self.walk_tile(work, t)
                semaphore.step(counters[head_idx, None].iterator + m_block)

    def walk_tile(self, work: SimpleNamespace, t: Int32) -> tuple:
        """(query head, Q tile) of the walk's t-th step: the query heads in turn, each over the Q tiles from
        work.start on."""
        head_idx = work.first_head_idx + t // work.num_m_blocks
        return head_idx, work.m_block_min + self.walk_offset(work, t % work.num_m_blocks)

    def walk_tile_of(self, work: SimpleNamespace, m_block: Int32) -> Int32:
        """The Q tile a query head visits at the position of m_block in unrotated order."""
        return work.m_block_min + self.walk_offset(work, m_block - work.m_block_min)

    def walk_offset(self, work: SimpleNamespace, r: Int32) -> Int32:
        """The Q tile (from m_block_min) of a query head's r-th step."""
        return rotated(r, work.start, work.num_m_blocks) if self.rotates else r

    @cute.jit
    def wait_turn(
        self, counters: cute.Tensor, tile_info: TileInfo, work: SimpleNamespace, head_idx: Int32, m_block: Int32
    ):
        """Wait until the K/V tiles before this one that see Q tile m_block have added into its dQ (one lane
        spins, the warp waits for it)."""
        if cutlass.const_expr(self.rotates):  # no mask: every K/V tile sees every Q tile (m_block_min is 0)
            place = rotated_place(work.n_block, m_block, work.num_n_blocks, work.num_m_blocks)
        else:
            place = work.n_block - tile_info.n_block_range(m_block)[0]
        counter = counters[head_idx, None].iterator + m_block
        if cute.arch.lane_idx() == 0:
            semaphore.wait_for(counter, place)
        cute.arch.sync_warp()

    # ---------------------------------------------------------------- steps 3 to 7: the consumer warpgroups
    @cute.jit
    def consume(
        self,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        smem: SimpleNamespace,
        pipes: SimpleNamespace,
        work: SimpleNamespace,
        tile_info: TileInfo,
        softmax_scale: Float32,
        softcap: Float32 | None,
        mAlibi: cute.Tensor | None,
        head_dim: Int32,
        tiled_mma_sdp: cute.TiledMma,
        tiled_mma_dkv: cute.TiledMma,
        tiled_mma_dq: cute.TiledMma,
    ):
        """Every (query head, Q tile) of the walk against this thread block's K/V tile, then dK and dV out."""
        tidx = cute.arch.thread_idx()[0] - 128  # 0 .. 255 over the two consumer warpgroups
        tiled = {"sdp": tiled_mma_sdp, "dkv": tiled_mma_dkv, "dq": tiled_mma_dq}
        thr = SimpleNamespace(**{name: t.get_slice(tidx) for name, t in tiled.items()})
        # Shared-memory operands are sliced by warpgroup, through an index the compiler knows to be warp-uniform:
        # sliced by thread, their descriptors were computed in ordinary registers and moved to uniform ones
        # before every wgmma (118 R2UR a main-loop step at d128).
        wg_first = (cute.arch.make_warp_uniform(cute.arch.warp_idx()) // 4 - 1) * 128
        wg = SimpleNamespace(**{name: t.get_slice(wg_first) for name, t in tiled.items()})
        # score-shaped tiles (dS^T, or P and dS) to shared memory by stmatrix: four 8 x 8 tiles of 16-bit values an
        # instruction
        stmatrix = cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4)
        store_scores = cute.make_tiled_copy_C(cute.make_copy_atom(stmatrix, self.dtype), tiled_mma_sdp)
        store_scores = store_scores.get_slice(tidx)
        mma = SimpleNamespace(
            tiled_mma_sdp=tiled_mma_sdp,
            tiled_mma_dkv=tiled_mma_dkv,
            tiled_mma_dq=tiled_mma_dq,
            thr_sdp=thr.sdp,
            thr_dq=thr.dq,
            store_scores=store_scores,
            tScores=store_scores.partition_D(smem.sdS),
            store_dQ=self.store_dq_copy(tidx),
            # this warpgroup's dQ tile (its transposed view for dQ^T)
            sdQ=transpose_view(smem.sdQ)[None, None, tidx // 128]
            if cutlass.const_expr(self.config.dq_transposed)
            else smem.sdQ[None, None, tidx // 128],
            alibi=mAlibi,  # with config.alibi
            # shared-memory descriptors of every GEMM operand (stage mode last), register operands, dK's and dV's
            # accumulators
            **self.operands(smem, thr, wg),
        )
        mma.acc_dK.fill(0.0)
        mma.acc_dV.fill(0.0)
        mask = self.make_mask(tile_info, thr.sdp, tiled_mma_sdp.get_slice(0))

        scale_log2, softcap_multiplier = softcap_scales(softmax_scale, softcap)
        step = partial(self.one_q_tile, smem, pipes, mma, mask, work, scale_log2, softcap_multiplier, softmax_scale)
        self.walk(step, pipes, work, tile_info, smem, tidx)
        self.store_dk_dv(mma.acc_dK, mma.acc_dV, mdK, mdV, smem, work, tiled_mma_dkv, tidx, softmax_scale, head_dim)

    def operands(self, smem: SimpleNamespace, thr: SimpleNamespace, wg: SimpleNamespace) -> dict:
        """The step's GEMM operands (by thread ``thr`` and warpgroup ``wg`` slices of the tiled MMAs) and dK's and
        dV's accumulators."""
        d, bm, bn = self.head_dim_padded, self.block_m, self.block_n
        sQt, sdOt, sKt = (transpose_view(s) for s in (smem.sQ, smem.sdO, smem.sK))  # (D, rows, stage)
        sdS = transpose_view(smem.sdS)  # dS: (block_m, block_n, stage)
        if self.config.dq_transposed:  # dQ^T = K^T dS^T: A = K^T, B = dS
            tdQrKt = wg.dq.make_fragment_A(wg.dq.partition_A(sKt))[None, None, None, 0]
            tdQrdS = wg.dq.make_fragment_B(wg.dq.partition_B(sdS))
        else:
            tdQrdS = wg.dq.make_fragment_A(wg.dq.partition_A(sdS))
            tdQrKt = wg.dq.make_fragment_B(wg.dq.partition_B(sKt))[None, None, None, 0]
        return dict(
            tSrK=wg.sdp.make_fragment_A(wg.sdp.partition_A(smem.sK))[None, None, None, 0],
            tSrQ=wg.sdp.make_fragment_B(wg.sdp.partition_B(smem.sQ)),
            tdPrV=wg.sdp.make_fragment_A(wg.sdp.partition_A(smem.sV))[None, None, None, 0],
            tdPrdO=wg.sdp.make_fragment_B(wg.sdp.partition_B(smem.sdO)),
            tdVrP=thr.dkv.make_fragment_A(thr.dkv.partition_shape_A((bn, bm))),
            tdKrdS=thr.dkv.make_fragment_A(thr.dkv.partition_shape_A((bn, bm))),
            tdVrdOt=wg.dkv.make_fragment_B(wg.dkv.partition_B(sdOt)),
            tdKrQt=wg.dkv.make_fragment_B(wg.dkv.partition_B(sQt)),
            tdQrdS=tdQrdS,
            tdQrKt=tdQrKt,
            acc_dK=thr.dkv.make_fragment_C(thr.dkv.partition_shape_C((bn, d))),
            acc_dV=thr.dkv.make_fragment_C(thr.dkv.partition_shape_C((bn, d))),
        )

    def make_mask(self, tile_info: TileInfo, thr_sdp, thr0_sdp) -> TransposedMask:
        """The mask of S^T's tiles, also the (key, query) coordinates of its elements."""
        return TransposedMask(tile_info, thr_sdp, thr0_sdp)

    @cute.jit
    def walk(
        self, step, pipes: SimpleNamespace, work: SimpleNamespace, tile_info: TileInfo, smem: SimpleNamespace, tidx
    ):
        """``step(state, head_idx, m_block, masked)`` on every (query head, Q tile) of the walk, once K and V are
        in: the masked Q tiles (the diagonal's, the window's edge, the seqlen_k tail) apart from the free ones. A
        packed sequence's K/V tile that its keys do not fill has its rows past them zeroed first (common/copy.py,
        zero_rows: K's too, since dQ adds dS K and dS is 0, not -inf, there)."""
        if work.qheads_per_kvhead * work.num_m_blocks > 0:
            pipes.kv.consumer_wait(pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1))
            if cutlass.const_expr(work.seq.packed):
                keys_in_tile = work.seq.seqlen_k - work.n_block * self.block_n
                if keys_in_tile < self.block_n:
                    zero = gcopy.make_gmem_tiled_copy(self.dtype, self.head_dim_padded, CONSUMER_THREADS, False)
                    for sX in (smem.sK, smem.sV):  # (v's head dim is q's)
                        gcopy.zero_rows(zero, sX[None, None, 0], keys_in_tile, tidx)
                    cute.arch.fence_view_async_shared()  # the generic-proxy writes, visible to wgmma
                    cute.arch.barrier(barrier_id=STALE_ROWS_BARRIER, number_of_threads=CONSUMER_THREADS)
        free_start, free_end = tile_info.masked_m_runs(work.n_block, work.m_block_min, work.m_block_max)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_stages)
        for h in cutlass.range(work.qheads_per_kvhead, unroll=1):
            head_idx = work.first_head_idx + h
            # without a mask every step of a K/V tile is masked alike, so rotated positions keep the runs
            for m_block in cutlass.range(work.m_block_min, free_start, unroll=1):
                state = step(state, head_idx, self.walk_tile_of(work, m_block), True)
            for m_block in cutlass.range(free_start, free_end, unroll=1):
                state = step(state, head_idx, self.walk_tile_of(work, m_block), False)
            for m_block in cutlass.range(free_end, work.m_block_max, unroll=1):
                state = step(state, head_idx, self.walk_tile_of(work, m_block), True)

    @cute.jit
    def store_dk_dv(
        self,
        acc_dK: cute.Tensor,
        acc_dV: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        smem: SimpleNamespace,
        work: SimpleNamespace,
        tiled_mma_dkv: cute.TiledMma,
        tidx: Int32,
        softmax_scale: Float32,
        head_dim: Int32,
    ):
        """Step 7: dK *= softmax_scale; dK and dV leave through shared memory (sK's and sV's bytes); where
        DKV_TRANSPOSED, the accumulators hold dK^T and dV^T (head dim as rows)."""
        d, bn = self.head_dim_padded, self.block_n
        acc_dK.store(acc_dK.load() * softmax_scale)
        cute.arch.barrier(barrier_id=EPILOGUE_BARRIER, number_of_threads=CONSUMER_THREADS)  # done reading sK, sV
        rows_left = work.seq.seqlen_k - work.n_block * bn
        gmem_store = make_gmem_tiled_copy(self.dtype, d, CONSUMER_THREADS, False)
        for acc, sX, mX in ((acc_dK, smem.sK, mdK), (acc_dV, smem.sV, mdV)):
            gX = cute.local_tile(work.seq.rows_k(mX, work.kv_head_idx), (bn, d), (work.n_block, 0))
            store_o(
                acc,
                sX[None, None, 0],
                gX,
                tiled_mma_dkv,
                gmem_store,
                tidx,
                rows_left,
                head_dim,
                not self.config.exact_head_dim,
                CONSUMER_THREADS,
                EPILOGUE_BARRIER,
                transpose_view(sX)[None, None, 0] if cutlass.const_expr(self.DKV_TRANSPOSED) else None,
            )

    @cute.jit
    def one_q_tile(
        self,
        smem: SimpleNamespace,
        pipes: SimpleNamespace,
        mma: SimpleNamespace,
        mask: TransposedMask,
        work: SimpleNamespace,
        scale_log2: Float32,
        softcap_multiplier: Float32 | None,
        softmax_scale: Float32,
        state: pipeline.PipelineState,
        head_idx: Int32,
        m_block: Int32,
        masked: cutlass.Constexpr[bool],
    ) -> pipeline.PipelineState:
        """Steps 3 to 6 for one Q tile of one query head; returns the advanced pipeline state."""
        bm, bn, d = self.block_m, self.block_n, self.head_dim_padded
        stage = state.index
        # step 3: S^T = K Q^T, then dP^T = V dO^T, both in flight while softmax waits for S^T
        acc_S = mma.thr_sdp.make_fragment_C(mma.thr_sdp.partition_shape_C((bn, bm)))
        acc_dP = mma.thr_sdp.make_fragment_C(mma.thr_sdp.partition_shape_C((bn, bm)))
        pipes.q.consumer_wait(state)
        gemm(mma.tiled_mma_sdp, acc_S, mma.tSrK, mma.tSrQ[None, None, None, stage], True, -1)
        lse_cols = None  # LSE read into registers while dO arrives and S^T's MMA runs (lse_ahead)
        if cutlass.const_expr(self.config.lse_ahead):
            lse_cols = column_stats(smem.sLSE[None, stage], mask.tScS)
        pipes.do.consumer_wait(state)
        gemm(mma.tiled_mma_sdp, acc_dP, mma.tdPrV, mma.tdPrdO[None, None, None, stage], True, 1)
        if cutlass.const_expr(self.config.softcap):  # S^T = tanh(S^T * softmax_scale / softcap)
            apply_softcap(acc_S, softcap_multiplier)
        if cutlass.const_expr(self.config.alibi):  # S^T -= slope * |q + offset - key| (t kept for the cap's derivative)
            acc_t = keep_t(acc_S) if cutlass.const_expr(self.config.softcap) else None
            slope = alibi_slope(mma.alibi, work.seq.batch_idx, head_idx, scale_log2)
            mask.apply_alibi(acc_S, m_block, work.n_block, slope)
        # steps 4 and 5: mask, P^T = exp2(S^T * scale_log2 - LSE log2 e)
        if cutlass.const_expr(masked):
            mask.apply_mask(acc_S, m_block, work.n_block)
        if cutlass.const_expr(lse_cols is not None):
            recompute_probs_t(acc_S, lse_cols, None, scale_log2)
        else:  # read at its use, through the fragment's coordinates
            recompute_probs_t(acc_S, smem.sLSE[None, stage], mask.tScS, scale_log2)
        # step 6: dV += P^T dO and dK += dS^T Q from registers; dS^T to shared memory for dQ = dS K
        if cutlass.const_expr(self.config.dv_before_ds):  # dV's MMA runs while dS^T is computed
            store_probs(acc_S, mma.tdVrP)
            gemm(mma.tiled_mma_dkv, mma.acc_dV, mma.tdVrP, mma.tdVrdOt[None, None, None, stage], False, 1)  # dP^T done
        else:
            warpgroup.wait_group(0)
        softmax_grad_t(acc_S, acc_dP, smem.sD[None, stage], mask.tScS)  # acc_dP becomes dS^T
        if cutlass.const_expr(self.config.softcap and self.config.alibi):  # dS^T *= 1 - t^2, the cap's derivative
            softcap_grad_kept(acc_t, acc_dP)
        elif cutlass.const_expr(self.config.softcap):  # t from the fp32 P^T
            softcap_grad_t(acc_S, acc_dP, smem.sLSE[None, stage], mask.tScS, scale_log2)
        if cutlass.const_expr(not self.config.dv_before_ds):
            store_probs(acc_S, mma.tdVrP)
        store_probs(acc_dP, mma.tdKrdS)
        if cutlass.const_expr(not self.config.dv_before_ds):  # dV's MMA runs across the dS^T barrier
            gemm(mma.tiled_mma_dkv, mma.acc_dV, mma.tdVrP, mma.tdVrdOt[None, None, None, stage], False, -1)
        if cutlass.const_expr(not self.config.dk_after_dq):
            gemm(mma.tiled_mma_dkv, mma.acc_dK, mma.tdKrdS, mma.tdKrQt[None, None, None, stage], False, -1)
        rdS = cute.make_tensor(mma.tdKrdS.iterator, acc_dP.layout)
        cute.copy(mma.store_scores, mma.store_scores.retile(rdS), mma.tScores[None, None, None, stage])
        cute.arch.fence_view_async_shared()  # the generic-proxy writes, visible to wgmma
        cute.arch.barrier(barrier_id=DS_BARRIER, number_of_threads=CONSUMER_THREADS)  # both halves of dS^T
        dq_shape, dq_operands = (bm, d), (mma.tdQrdS[None, None, None, stage], mma.tdQrKt)
        if cutlass.const_expr(self.config.dq_transposed):  # dQ^T = K^T dS^T
            dq_shape, dq_operands = (d, bm), dq_operands[::-1]
        acc_dQ = mma.thr_dq.make_fragment_C(mma.thr_dq.partition_shape_C(dq_shape))
        if cutlass.const_expr(self.config.dk_after_dq):  # dK's MMA runs while dQ goes to shared memory
            gemm(mma.tiled_mma_dq, acc_dQ, *dq_operands, True, -1)
            gemm(mma.tiled_mma_dkv, mma.acc_dK, mma.tdKrdS, mma.tdKrQt[None, None, None, stage], False, 1)
        else:
            gemm(mma.tiled_mma_dq, acc_dQ, *dq_operands, True, 0)
        pipes.do.consumer_release(state)  # dV is done with dO
        self.stage_dq(mma, acc_dQ)
        warpgroup.wait_group(0)  # dK is done with Q
        pipes.q.consumer_release(state)
        state.advance()
        return state

    def store_dq_copy(self, tidx: Int32) -> cute.TiledCopy:
        """Thread ``tidx``'s copy of its warpgroup's dQ part, registers -> its (dq_rows, dq_cols) shared-memory tile
        (as a one-warpgroup MMA's C); with dq_transposed, its dQ^T part (64, block_m) into the tile's transposed
        view, a value a store (a thread's neighbouring values are a row apart there)."""
        transposed, MN = self.config.dq_transposed, OperandMajorMode.MN
        return cute.make_tiled_copy_C(
            cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=32 if transposed else 64),
            _tiled_mma(self.dtype, MN, MN, (1, 1), self.block_m if transposed else self.dq_cols),
        ).get_slice(tidx % 128)

    @cute.jit
    def stage_dq(self, mma: SimpleNamespace, acc_dQ: cute.Tensor):
        """This warpgroup's part of dQ -> its shared-memory tile, once the dQ writer says the tile is free; then tell
        the writer that it is written."""
        wg = cute.arch.make_warp_uniform(cute.arch.warp_idx()) // 4 - 1
        cute.arch.barrier(barrier_id=DQ_EMPTY_BARRIER + wg, number_of_threads=DQ_HANDOFF_THREADS)
        cute.copy(mma.store_dQ, mma.store_dQ.retile(acc_dQ), mma.store_dQ.partition_D(mma.sdQ))
        cute.arch.fence_view_async_shared()  # the generic-proxy writes, visible to the TMA unit
        cute.arch.barrier_arrive(barrier_id=DQ_FULL_BARRIER + wg, number_of_threads=DQ_HANDOFF_THREADS)
