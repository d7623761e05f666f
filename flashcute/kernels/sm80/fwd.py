"""The seed's FlashAttention forward kernel for sm_80 and newer (mma.sync 16x8x16, cp.async, ldmatrix).

One thread block owns one (block_m, head_dim) tile of Q for one (batch, head) and walks the K/V tiles it needs,
keeping the softmax state (m, l) and the unnormalised output U in registers. The kernel body follows the seven
steps of the seed; each step lives in a module of flashcute/kernels/common and has a same-named counterpart in
flashcute/reference/tiled.py.

Load/compute overlap with one shared-memory stage each for K and V, as in the seed (num_stages = 1):
    wait K[n]  -> issue V[n]   -> S = Q K[n]^T      (V[n] lands while the tensor cores work on S)
    wait V[n]  -> issue K[n-1] -> softmax, O += P V[n]  (K[n-1] lands during softmax and P V)
The two barriers also make the single buffers safe: K[n-1] overwrites sK only after every warp has finished
reading K[n], and V[n+1] overwrites sV only after every warp has finished P V[n]. With num_stages = 2 every
load is issued one tile earlier (V[n-1] at the first wait, K[n-2] at the second) into the other buffer: tile n
always lives in stage n % 2, so no stage counter has to be carried through the loops.
"""

from functools import partial
from types import SimpleNamespace

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import warp

from flashcute.kernels.common import copy as gcopy
from flashcute.kernels.common.alibi import alibi_slope
from flashcute.kernels.common.dtypes import CUTLASS_DTYPES
from flashcute.kernels.common.epilogue import store_lse, store_o
from flashcute.kernels.common.gemm import gemm_rs, gemm_ss
from flashcute.kernels.common.layout import acc_as_operand_a, converted
from flashcute.kernels.common.limits import exact_value_head_dim, value_head_dim
from flashcute.kernels.common.mask import AttentionMask
from flashcute.kernels.common.seqlen import SeqLens
from flashcute.kernels.common.softcap import apply_softcap, softcap_scales
from flashcute.kernels.common.softmax import RESCALE_THRESHOLD, OnlineSoftmax
from flashcute.kernels.common.tile_info import TileInfo
from flashcute.kernels.sm80.config import FwdConfig
from flashcute.kernels.sm80.limits import common_limits


class FlashAttentionForwardSm80:
    """Forward attention on mma.sync tensor cores. Construct from a FwdConfig; compile with cute.compile."""

    def __init__(self, config: FwdConfig):
        self.config = config
        self.dtype = CUTLASS_DTYPES[config.dtype]
        self.block_m = config.block_m
        self.block_n = config.block_n
        self.head_dim_padded = config.head_dim_padded
        self.head_dim_v_padded = value_head_dim(config)  # v's and O's: q's, or a smaller bucket
        self.num_threads = config.num_threads
        self.num_stages = config.num_stages

    @staticmethod
    def can_implement(config: FwdConfig, arch: str) -> str | None:
        """None if the kernel can be built for ``config`` on target ``arch``, else the reason it cannot."""
        if config.block_m % (16 * config.num_warps) != 0:
            return f"block_m={config.block_m} is not a multiple of 16 * num_warps = {16 * config.num_warps}"
        if config.num_stages not in (1, 2):
            return f"num_stages={config.num_stages} is not 1 or 2"
        return common_limits(config, config.num_threads, config.smem_bytes(), arch)

    # ---------------------------------------------------------------- host side: layouts, copies, MMA, launch
    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (batch, seqlen_q, nheads, head_dim)
        mK: cute.Tensor,  # (batch, seqlen_k, nheads_k, head_dim)
        mV: cute.Tensor,  # (batch, seqlen_k, nheads_k, head_dim_v)
        mO: cute.Tensor,  # (batch, seqlen_q, nheads, head_dim_v)
        mLSE: cute.Tensor,  # (batch, nheads, seqlen_q) float32
        softmax_scale: Float32,
        diag_offset: Int32,
        window_left: Int32,
        window_right: Int32,
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
    ):
        d, dv = self.head_dim_padded, self.head_dim_v_padded
        smem_atom, smem_atom_v = (gcopy.smem_layout_atom(self.dtype, n) for n in (d, dv))
        sQ_layout = cute.tile_to_shape(smem_atom, (self.block_m, d), (0, 1))
        sK_layout = cute.tile_to_shape(smem_atom, (self.block_n, d, self.num_stages), (0, 1, 2))
        sV_layout = cute.tile_to_shape(smem_atom_v, (self.block_n, dv, self.num_stages), (0, 1, 2))
        sO_layout = cute.tile_to_shape(smem_atom_v, (self.block_m, dv), (0, 1))  # in Q's bytes: dv <= d
        SharedStorage = self.shared_storage(sQ_layout, sK_layout, sV_layout)

        # The warps stacked along M: each owns block_m / num_warps whole rows of S and O.
        num_warps = self.config.num_warps
        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16)),
            (num_warps, 1, 1),
            permutation_mnk=(num_warps * 16, 16, 16),
        )
        gmem_tiled_copy_QK = gcopy.make_gmem_tiled_copy(self.dtype, d, self.num_threads, True)
        gmem_tiled_copy_V = gcopy.make_gmem_tiled_copy(self.dtype, dv, self.num_threads, True)
        gmem_tiled_copy_O = gcopy.make_gmem_tiled_copy(self.dtype, dv, self.num_threads, False)

        batch, seqlen_q = mQ.shape[0], mQ.shape[1]
        if cutlass.const_expr(mCuSeqlensQ is not None):
            batch, seqlen_q = mSeqUsedQ.shape[0], max_seqlen_q
        num_m_blocks = cute.ceil_div(seqlen_q, self.block_m)
        scale_log2, softcap_multiplier = softcap_scales(softmax_scale, softcap)
        self.kernel(
            mQ,
            mK,
            mV,
            mO,
            mLSE,
            mCuSeqlensQ,
            mCuSeqlensK,
            mSeqUsedQ,
            mSeqUsedK,
            mSink,
            mAlibi,
            scale_log2,
            softcap_multiplier,
            diag_offset,
            window_left,
            window_right,
            num_m_blocks,
            sQ_layout,
            sK_layout,
            sV_layout,
            sO_layout,
            gmem_tiled_copy_QK,
            gmem_tiled_copy_V,
            gmem_tiled_copy_O,
            tiled_mma,
            SharedStorage,
        ).launch(
            grid=[num_m_blocks * mQ.shape[2] * batch, 1, 1],
            block=[self.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
        )

    def shared_storage(self, sQ_layout, sK_layout, sV_layout):
        """The thread block's shared memory: Q, K and V."""
        fields = {
            "sQ": cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024],
            "sK": cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024],
            "sV": cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024],
        }
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    # ---------------------------------------------------------------- device side: the seven steps
    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mCuSeqlensQ: cute.Tensor | None,
        mCuSeqlensK: cute.Tensor | None,
        mSeqUsedQ: cute.Tensor | None,
        mSeqUsedK: cute.Tensor | None,
        mSink: cute.Tensor | None,
        mAlibi: cute.Tensor | None,
        scale_log2: Float32,
        softcap_multiplier: Float32 | None,
        diag_offset: Int32,
        window_left: Int32,
        window_right: Int32,
        num_m_blocks: Int32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
        gmem_tiled_copy_QK: cute.TiledCopy,
        gmem_tiled_copy_V: cute.TiledCopy,
        gmem_tiled_copy_O: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        cfg = self.config
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()

        # ---- step 1: which tile is ours. The 1-D grid avoids the 65535 limit of gridDim.y/z; the m_block order
        # is reversed so that, under a causal mask, the longest rows of Q start first.
        nheads = mQ.shape[2]
        m_block = num_m_blocks - 1 - bidx % num_m_blocks
        head_idx = (bidx // num_m_blocks) % nheads
        batch_idx = bidx // num_m_blocks // nheads
        kv_head_idx = head_idx // (nheads // mK.shape[2])
        seq = SeqLens(batch_idx, mQ.shape[1], mK.shape[1], diag_offset, mCuSeqlensQ, mCuSeqlensK, mSeqUsedQ, mSeqUsedK)
        seqlen_q, seqlen_k = seq.seqlen_q, seq.seqlen_k
        head_dim = mQ.shape[3]
        head_dim_v = head_dim if cutlass.const_expr(cfg.head_dim_v_padded is None) else mV.shape[3]
        tile_info = TileInfo.of(cfg, seqlen_q, seqlen_k, seq.diag_offset, window_left, window_right)
        n_block_min, n_block_max = tile_info.n_block_range(m_block)
        if cutlass.const_expr(seq.packed):  # noqa: SIM102 (a compile-time test around a run-time one)
            if m_block * self.block_m >= seqlen_q:  # past a shorter sequence's end: no rows, nothing to visit
                n_block_max = n_block_min
        left_end, right_start = tile_info.masked_runs(m_block, n_block_min, n_block_max)

        tile_q = (self.block_m, self.head_dim_padded)
        tile_k = (self.block_n, self.head_dim_padded)
        tile_v = (self.block_n, self.head_dim_v_padded)
        tile_o = (self.block_m, self.head_dim_v_padded)
        gQ = cute.local_tile(seq.rows_q(mQ, head_idx), tile_q, (m_block, 0))  # (block_m, D)
        gK = cute.local_tile(seq.rows_k(mK, kv_head_idx), tile_k, (None, 0))  # (block_n, D, n_block)
        gV = cute.local_tile(seq.rows_k(mV, kv_head_idx), tile_v, (None, 0))  # (block_n, Dv, n_block)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)
        sK = storage.sK.get_tensor(sK_layout)
        sV = storage.sV.get_tensor(sV_layout)
        # V^T as a (Dv, block_n) view of the same bytes: ldmatrix.trans reads it, nothing is copied.
        sVt = cute.composition(
            sV,
            cute.make_layout(
                (self.head_dim_v_padded, self.block_n, self.num_stages),
                stride=(self.block_n, 1, self.block_n * self.head_dim_v_padded),
            ),
        )

        # ---- step 2: per-thread gmem -> smem partitions and their predicates
        gmem_thr_copy = gmem_tiled_copy_QK.get_slice(tidx)
        gmem_thr0_copy = gmem_tiled_copy_QK.get_slice(0)
        gmem_thr_copy_V = gmem_tiled_copy_V.get_slice(tidx)
        tQgQ, tQsQ = gmem_thr_copy.partition_S(gQ), gmem_thr_copy.partition_D(sQ)
        tKgK, tKsK = gmem_thr_copy.partition_S(gK), gmem_thr_copy.partition_D(sK)
        tVgV, tVsV = gmem_thr_copy_V.partition_S(gV), gmem_thr_copy_V.partition_D(sV)
        tQcQ = gmem_thr_copy.partition_S(cute.make_identity_tensor(tile_q))
        t0QcQ = gmem_thr0_copy.partition_S(cute.make_identity_tensor(tile_q))
        tQpQ = gcopy.head_dim_predicate(tQcQ, head_dim)
        check_hdim, check_hdim_v = not cfg.exact_head_dim, not exact_value_head_dim(cfg)

        # the K and the V tiles' copies: one where v's head dim is q's
        copy_k = gcopy.tile_copy(gmem_tiled_copy_QK, tile_k, head_dim, check_hdim, tidx)
        kv = SimpleNamespace(
            k=copy_k,
            v=copy_k
            if cutlass.const_expr(cfg.head_dim_v_padded is None)
            else gcopy.tile_copy(gmem_tiled_copy_V, tile_v, head_dim_v, check_hdim_v, tidx),
            seqlen_k=seqlen_k,
            tKgK=tKgK,
            tKsK=tKsK,
            tVgV=tVgV,
            tVsV=tVsV,
        )

        # ---- steps 3 and 6: MMA partitions; Q, K and V^T reach the tensor cores through ldmatrix
        thr_mma = tiled_mma.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK[None, None, 0]))
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt[None, None, 0]))
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C(tile_o), Float32)
        acc_O.fill(0.0)
        ldmatrix = warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4)
        ldmatrix_t = warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4)
        smem_thr_copy_Q = cute.make_tiled_copy_A(cute.make_copy_atom(ldmatrix, self.dtype), tiled_mma).get_slice(tidx)
        smem_thr_copy_K = cute.make_tiled_copy_B(cute.make_copy_atom(ldmatrix, self.dtype), tiled_mma).get_slice(tidx)
        smem_thr_copy_V = cute.make_tiled_copy_B(cute.make_copy_atom(ldmatrix_t, self.dtype), tiled_mma).get_slice(tidx)
        tSsQ = smem_thr_copy_Q.partition_S(sQ)
        tSsK = smem_thr_copy_K.partition_S(sK)
        tOsVt = smem_thr_copy_V.partition_S(sVt)

        mask = AttentionMask(tile_info, thr_mma, tiled_mma.get_slice(0))
        num_rows = cute.size(acc_O, mode=[0, 1]) * cute.size(acc_O, mode=[1])
        threshold = RESCALE_THRESHOLD if cutlass.const_expr(cfg.lazy_rescale) else None
        softmax = OnlineSoftmax(scale_log2, num_rows, rescale_threshold=threshold)

        # ---- prologue: Q and the first (last-in-sequence) K tile in flight together
        gcopy.copy_rows(
            gmem_tiled_copy_QK,
            tQgQ,
            tQsQ,
            tQcQ,
            t0QcQ,
            tQpQ,
            seqlen_q - m_block * self.block_m,
            True,
            check_hdim,
            False,
        )
        if n_block_max > n_block_min:
            self.load_kv_tile(kv.k, kv.seqlen_k, tKgK, tKsK, n_block_max - 1, True, False)
        cute.arch.cp_async_commit_group()
        if cutlass.const_expr(self.num_stages == 2):
            if n_block_max > n_block_min:
                self.load_kv_tile(kv.v, kv.seqlen_k, tVgV, tVsV, n_block_max - 1, True, True)
            cute.arch.cp_async_commit_group()
            if n_block_max - 1 > n_block_min:
                self.load_kv_tile(kv.k, kv.seqlen_k, tKgK, tKsK, n_block_max - 2, False, False)
            cute.arch.cp_async_commit_group()

        compute_one_n_block = partial(
            self.compute_one_n_block,
            SimpleNamespace(
                tiled_mma=tiled_mma,
                thr_mma=thr_mma,
                tSrQ=tSrQ,
                tSrK=tSrK,
                tOrVt=tOrVt,
                tSsQ=tSsQ,
                tSsK=tSsK,
                tOsVt=tOsVt,
                smem_thr_copy_Q=smem_thr_copy_Q,
                smem_thr_copy_K=smem_thr_copy_K,
                smem_thr_copy_V=smem_thr_copy_V,
            ),
            kv,
            softmax,
            mask,
            softcap_multiplier,
            alibi_slope(mAlibi, batch_idx, head_idx, scale_log2) if cutlass.const_expr(cfg.alibi) else None,
            acc_O,
            m_block,
            n_block_min,
        )

        # ---- main loop over K/V tiles, last to first (see TileInfo.masked_runs)
        if n_block_max > n_block_min:
            compute_one_n_block(n_block_max - 1, True, True)
        for i in cutlass.range(n_block_max - 1 - right_start, unroll=1):
            compute_one_n_block(n_block_max - 2 - i, False, True)
        for i in cutlass.range(right_start - left_end, unroll=1):
            compute_one_n_block(right_start - 1 - i, False, False)
        if cutlass.const_expr(cfg.mask_left):
            for i in cutlass.range(left_end - n_block_min, unroll=1):
                compute_one_n_block(left_end - 1 - i, False, True)

        # ---- step 7: O = U / l, LSE = scale * m + log l (the head's sink in l, with config.sink); O leaves
        # through shared memory (sQ's bytes)
        inv_sum, lse = softmax.finalize(mSink[head_idx] if cutlass.const_expr(cfg.sink) else None)
        softmax.rescale_o(acc_O, inv_sum)
        cute.arch.cp_async_wait_group(0)  # no cp.async may still write sQ (the loop may have run zero times)
        cute.arch.sync_threads()  # every warp is done reading sQ
        rows_left = seqlen_q - m_block * self.block_m
        sO = cute.make_tensor(sQ.iterator, sO_layout)
        gO = cute.local_tile(seq.rows_q(mO, head_idx), tile_o, (m_block, 0))
        store_o(acc_O, sO, gO, tiled_mma, gmem_tiled_copy_O, tidx, rows_left, head_dim_v, check_hdim_v)
        gLSE = cute.local_tile(seq.row_stats(mLSE, head_idx), (self.block_m,), (m_block,))
        store_lse(lse, gLSE, thr_mma, tile_o, rows_left)

    @cute.jit
    def load_kv_tile(
        self,
        copy: SimpleNamespace,
        seqlen_k: Int32,
        tXgX: cute.Tensor,
        tXsX: cute.Tensor,
        n_block: Int32,
        is_last_tile: cutlass.Constexpr[bool],
        zero_fill_rows: cutlass.Constexpr[bool],
    ):
        """Step 2 for K or V (``copy``: copy.tile_copy's) into stage n_block % num_stages: only the last tile can be
        partial."""
        gcopy.copy_rows(
            copy.tiled_copy,
            tXgX[None, None, None, n_block],
            tXsX[None, None, None, self.stage(n_block)],
            copy.tXcX,
            copy.t0XcX,
            copy.tXpX,
            seqlen_k - n_block * self.block_n,
            is_last_tile,
            copy.check_hdim,
            zero_fill_rows,
        )

    @cute.jit
    def compute_one_n_block(
        self,
        mma: SimpleNamespace,
        kv: SimpleNamespace,
        softmax: OnlineSoftmax,
        mask: AttentionMask,
        softcap_multiplier: Float32 | None,
        slope: Float32 | None,
        acc_O: cute.Tensor,
        m_block: Int32,
        n_block_min: Int32,
        n_block: Int32,
        is_last_tile: cutlass.Constexpr[bool],
        mask_rows: cutlass.Constexpr[bool],
    ):
        """One K/V tile: steps 3 to 6, with the next K tile's load overlapping softmax and P V."""
        acc_S = cute.make_rmem_tensor(mma.thr_mma.partition_shape_C((self.block_m, self.block_n)), Float32)
        acc_S.fill(0.0)
        stage = self.stage(n_block)
        # The groups in flight, oldest first, are (K[n], V[n], K[n-1]) with two stages, (K[n]) with one.
        cute.arch.cp_async_wait_group(2 * self.num_stages - 2)  # K[n] (and, the first time, Q) has landed ...
        cute.arch.sync_threads()  # ... for every thread, and every warp is done with the stage V[n+1] used
        if cutlass.const_expr(self.num_stages == 1):
            self.load_kv_tile(kv.v, kv.seqlen_k, kv.tVgV, kv.tVsV, n_block, is_last_tile, True)
        elif n_block > n_block_min:
            self.load_kv_tile(kv.v, kv.seqlen_k, kv.tVgV, kv.tVsV, n_block - 1, False, True)
        cute.arch.cp_async_commit_group()
        # step 3: S = Q K^T
        self.gemm_qk(mma, acc_S, stage)
        cute.arch.cp_async_wait_group(2 * self.num_stages - 2)  # V[n] has landed ...
        cute.arch.sync_threads()  # ... and every warp is done reading K[n]
        if n_block - self.num_stages >= n_block_min:
            self.load_kv_tile(kv.k, kv.seqlen_k, kv.tKgK, kv.tKsK, n_block - self.num_stages, False, False)
        cute.arch.cp_async_commit_group()
        if cutlass.const_expr(self.config.softcap):  # S = tanh(S * softmax_scale / softcap)
            apply_softcap(acc_S, softcap_multiplier)
        if cutlass.const_expr(self.config.alibi):  # S -= slope * |i + offset - j| (the tile's ALiBi slope)
            mask.apply_alibi(acc_S, m_block, n_block, slope)
        # step 4: mask (only on the tiles that cross a boundary)
        if cutlass.const_expr(is_last_tile or mask_rows):
            mask.apply_mask(acc_S, m_block, n_block, mask_rows)
        # step 5: online softmax, U *= alpha
        if cutlass.const_expr(self.config.lazy_rescale and not (is_last_tile or mask_rows)):
            # lazy rescaling on an unmasked tile: E against the kept max first, the max only where it moved
            rP = cute.make_fragment_like(acc_S, self.dtype)
            softmax.online_softmax_kept_max(acc_S, acc_O, rP)
        else:
            row_scale = softmax.online_softmax(acc_S)
            softmax.rescale_o(acc_O, row_scale, softmax.any_moved(row_scale))
            # step 6: O += P V, P converted to 16 bits in the registers that held S
            rP = converted(acc_S, self.dtype)
        self.gemm_pv(mma, acc_O, rP, stage)

    @staticmethod
    def gemm_qk(mma: SimpleNamespace, acc_S: cute.Tensor, stage: Int32):
        """Step 3: S = Q K^T, Q and K[stage] read from shared memory through ldmatrix."""
        tSsK = mma.tSsK[None, None, None, stage]
        gemm_ss(mma.tiled_mma, acc_S, mma.tSrQ, mma.tSrK, mma.tSsQ, tSsK, mma.smem_thr_copy_Q, mma.smem_thr_copy_K)

    @staticmethod
    def gemm_pv(mma: SimpleNamespace, acc_O: cute.Tensor, rP: cute.Tensor, stage: Int32):
        """Step 6: O += P V, P from the registers that held S, V[stage] read transposed (ldmatrix.trans)."""
        tOsVt = mma.tOsVt[None, None, None, stage]
        gemm_rs(mma.tiled_mma, acc_O, acc_as_operand_a(rP), mma.tOrVt, tOsVt, mma.smem_thr_copy_V)

    def stage(self, n_block: Int32):
        """The shared-memory stage that holds K/V tile n_block. n_block is never negative, so a mask does what
        n_block % num_stages would without the signed remainder's fix-ups (bf16 D=128 on sm_90a: spill
        instructions 110 -> 75, free step 1008 -> 981 SASS instructions; fp16 899 -> 897)."""
        return n_block & (self.num_stages - 1) if cutlass.const_expr(self.num_stages > 1) else 0
