"""dQ for the deterministic backward (sm_80 and newer): no atomics, a fixed order of additions.

One thread block owns one (block_m, head_dim) tile of dQ for one (batch, head) and walks the K/V tiles its rows
see, last to first, exactly like the forward walks them for O. Per K/V tile it recomputes P and dS, then
dQ += dS K with dS still in the registers that computed it (the A operand, as P is for P V in the forward):

    S = Q K^T,  P = exp2(S * scale_log2 - LSE * log2 e),  dP = dO V^T,  dS = P * (dP - D),  dQ += dS K

(with softcap, S capped first and dS times the cap's derivative: kernels/common/softcap.py). dO and V may have a
head dim of their own (v's, at most q's: DQConfig.head_dim_v_padded), the inner dimension of dP = dO V^T.

Each element of dQ is then a sum in one thread, in one order: bitwise reproducible. The dK/dV kernel runs beside
it with its dQ atomics turned off (BwdConfig.accumulate_dq = False).
"""

from types import SimpleNamespace

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import warp

from flashcute.kernels.common import copy as gcopy
from flashcute.kernels.common.alibi import alibi_slope
from flashcute.kernels.common.dtypes import CUTLASS_DTYPES
from flashcute.kernels.common.epilogue import store_o
from flashcute.kernels.common.gemm import gemm_rs, gemm_ss
from flashcute.kernels.common.layout import acc_as_operand_a, acc_rows_cols, converted
from flashcute.kernels.common.limits import exact_value_head_dim, value_head_dim
from flashcute.kernels.common.mask import AttentionMask
from flashcute.kernels.common.seqlen import SeqLens
from flashcute.kernels.common.softcap import apply_softcap, keep_t, softcap_grad, softcap_grad_kept, softcap_scales
from flashcute.kernels.common.softmax import load_row_stats, recompute_probs, softmax_grad
from flashcute.kernels.common.tile_info import TileInfo
from flashcute.kernels.sm80.config import DQConfig
from flashcute.kernels.sm80.limits import common_limits


class FlashAttentionBackwardDQSm80:
    """Deterministic dQ on mma.sync tensor cores. Construct from a DQConfig."""

    def __init__(self, config: DQConfig):
        self.config = config
        self.dtype = CUTLASS_DTYPES[config.dtype]
        self.block_m = config.block_m
        self.block_n = config.block_n
        self.head_dim_padded = config.head_dim_padded
        self.head_dim_v_padded = value_head_dim(config)  # dO's and V's: q's, or a smaller bucket
        self.num_threads = config.num_warps * 32

    @staticmethod
    def can_implement(config: DQConfig, arch: str) -> str | None:
        """None if the kernel can be built for ``config`` on target ``arch``, else the reason it cannot."""
        if config.block_m % (16 * config.num_warps) != 0:
            return f"block_m={config.block_m} does not split in 16-row MMA atoms over {config.num_warps} warps"
        return common_limits(config, config.num_warps * 32, config.smem_bytes(), arch)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (batch, seqlen_q, nheads, head_dim)
        mK: cute.Tensor,  # (batch, seqlen_k, nheads_k, head_dim)
        mV: cute.Tensor,  # (batch, seqlen_k, nheads_k, head_dim_v)
        mdO: cute.Tensor,  # (batch, seqlen_q, nheads, head_dim_v)
        mLSE: cute.Tensor,  # (batch, nheads, seqlen_q) float32
        mD: cute.Tensor,  # (batch, nheads, seqlen_q) float32: rowsum(dO * O)
        mdQ: cute.Tensor,  # (batch, seqlen_q, nheads, head_dim), the output
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
    ):
        d, dv = self.head_dim_padded, self.head_dim_v_padded
        atom, atom_v = (gcopy.smem_layout_atom(self.dtype, n) for n in (d, dv))
        sQ_layout = cute.tile_to_shape(atom, (self.block_m, d), (0, 1))
        sdO_layout = cute.tile_to_shape(atom_v, (self.block_m, dv), (0, 1))
        sK_layout = cute.tile_to_shape(atom, (self.block_n, d), (0, 1))
        sV_layout = cute.tile_to_shape(atom_v, (self.block_n, dv), (0, 1))

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sdO_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]

        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16)),
            (self.config.num_warps, 1, 1),
            permutation_mnk=(self.config.num_warps * 16, 16, 16),
        )
        batch, seqlen_q = mQ.shape[0], mQ.shape[1]
        if cutlass.const_expr(mCuSeqlensQ is not None):
            batch, seqlen_q = mSeqUsedQ.shape[0], max_seqlen_q
        num_m_blocks = cute.ceil_div(seqlen_q, self.block_m)
        self.kernel(
            mQ,
            mK,
            mV,
            mdO,
            mLSE,
            mD,
            mdQ,
            mCuSeqlensQ,
            mCuSeqlensK,
            mSeqUsedQ,
            mSeqUsedK,
            mAlibi,
            softmax_scale,
            softcap,
            diag_offset,
            window_left,
            window_right,
            num_m_blocks,
            sQ_layout,
            sdO_layout,
            sK_layout,
            sV_layout,
            gcopy.make_gmem_tiled_copy(self.dtype, d, self.num_threads, True),
            gcopy.make_gmem_tiled_copy(self.dtype, dv, self.num_threads, True),
            gcopy.make_gmem_tiled_copy(self.dtype, d, self.num_threads, False),
            tiled_mma,
            SharedStorage,
        ).launch(
            grid=[num_m_blocks * mQ.shape[2] * batch, 1, 1],
            block=[self.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
        )

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mD: cute.Tensor,
        mdQ: cute.Tensor,
        mCuSeqlensQ: cute.Tensor | None,
        mCuSeqlensK: cute.Tensor | None,
        mSeqUsedQ: cute.Tensor | None,
        mSeqUsedK: cute.Tensor | None,
        mAlibi: cute.Tensor | None,
        softmax_scale: Float32,
        softcap: Float32 | None,
        diag_offset: Int32,
        window_left: Int32,
        window_right: Int32,
        num_m_blocks: Int32,
        sQ_layout: cute.ComposedLayout,
        sdO_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        gmem_tiled_copy_load: cute.TiledCopy,
        gmem_tiled_copy_load_v: cute.TiledCopy,
        gmem_tiled_copy_store: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        cfg = self.config
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()

        # ---- step 1: our dQ tile and the K/V tiles its rows see
        nheads = mQ.shape[2]
        m_block = num_m_blocks - 1 - bidx % num_m_blocks
        head_idx = (bidx // num_m_blocks) % nheads
        batch_idx = bidx // num_m_blocks // nheads
        kv_head_idx = head_idx // (nheads // mK.shape[2])
        seq = SeqLens(batch_idx, mQ.shape[1], mK.shape[1], diag_offset, mCuSeqlensQ, mCuSeqlensK, mSeqUsedQ, mSeqUsedK)
        seqlen_q, seqlen_k, head_dim = seq.seqlen_q, seq.seqlen_k, mQ.shape[3]
        head_dim_v = head_dim if cutlass.const_expr(cfg.head_dim_v_padded is None) else mV.shape[3]
        check_hdim, check_hdim_v = not cfg.exact_head_dim, not exact_value_head_dim(cfg)
        tile_info = TileInfo.of(cfg, seqlen_q, seqlen_k, seq.diag_offset, window_left, window_right)
        n_block_min, n_block_max = tile_info.n_block_range(m_block)
        if cutlass.const_expr(seq.packed):  # noqa: SIM102 (a compile-time test around a run-time one)
            if m_block * self.block_m >= seqlen_q:  # past a shorter sequence's end: no rows, nothing to visit
                n_block_max = n_block_min
        tile_q = (self.block_m, self.head_dim_padded)
        tile_do = (self.block_m, self.head_dim_v_padded)
        tile_k = (self.block_n, self.head_dim_padded)
        tile_v = (self.block_n, self.head_dim_v_padded)

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)
        sdO = storage.sdO.get_tensor(sdO_layout)  # (block_m, Dv)
        sK = storage.sK.get_tensor(sK_layout)
        sV = storage.sV.get_tensor(sV_layout)  # (block_n, Dv)
        sKt = cute.composition(sK, cute.make_layout((self.head_dim_padded, self.block_n), stride=(self.block_n, 1)))

        # ---- step 2: Q and dO once (rows past seqlen_q zero-filled); K and V per tile
        # each tile's copy (copy.tile_copy): dO's and V's are Q's and K's where v's head dim is q's
        copy_q, copy_k, copy_do, copy_v = gcopy.operand_copies(
            gmem_tiled_copy_load,
            gmem_tiled_copy_load_v,
            (tile_q, tile_k, tile_do, tile_v),
            (head_dim, head_dim_v),
            (check_hdim, check_hdim_v),
            cutlass.const_expr(cfg.head_dim_v_padded is None),
            tidx,
        )
        rows_left = seqlen_q - m_block * self.block_m
        for m, s, tile, c in ((mQ, sQ, tile_q, copy_q), (mdO, sdO, tile_do, copy_do)):
            gcopy.load_tile(c, cute.local_tile(seq.rows_q(m, head_idx), tile, (m_block, 0)), s, rows_left, tidx)
        cute.arch.cp_async_commit_group()

        thr_mma = tiled_mma.get_slice(tidx)
        ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        ldsm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype)
        copy_A = cute.make_tiled_copy_A(ldsm, tiled_mma).get_slice(tidx)
        copy_B = cute.make_tiled_copy_B(ldsm, tiled_mma).get_slice(tidx)
        copy_Bt = cute.make_tiled_copy_B(ldsm_t, tiled_mma).get_slice(tidx)
        rQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        rdO = thr_mma.make_fragment_A(thr_mma.partition_A(sdO))
        rK = thr_mma.make_fragment_B(thr_mma.partition_B(sK))
        rV = thr_mma.make_fragment_B(thr_mma.partition_B(sV))
        rKt = thr_mma.make_fragment_B(thr_mma.partition_B(sKt))
        tScS = acc_rows_cols(thr_mma.partition_C(cute.make_identity_tensor((self.block_m, self.block_n))))
        lse_log2, d_row = load_row_stats(
            seq.row_stats(mLSE, head_idx), seq.row_stats(mD, head_idx), tScS, m_block * self.block_m, seqlen_q
        )
        mask = AttentionMask(tile_info, thr_mma, tiled_mma.get_slice(0))
        acc_dQ = cute.make_rmem_tensor(thr_mma.partition_shape_C(tile_q), Float32)
        acc_dQ.fill(0.0)
        scale_log2, softcap_multiplier = softcap_scales(softmax_scale, softcap)

        st = SimpleNamespace(
            mK=mK,
            mV=mV,
            sQ=sQ,
            sdO=sdO,
            sK=sK,
            sV=sV,
            sKt=sKt,
            copy_k=copy_k,
            copy_v=copy_v,
            tidx=tidx,
            tiled_mma=tiled_mma,
            thr_mma=thr_mma,
            copy_A=copy_A,
            copy_B=copy_B,
            copy_Bt=copy_Bt,
            rQ=rQ,
            rdO=rdO,
            rK=rK,
            rV=rV,
            rKt=rKt,
            lse_log2=lse_log2,
            d_row=d_row,
            seq=seq,
            kv_head_idx=kv_head_idx,
            seqlen_k=seqlen_k,
            scale_log2=scale_log2,
            softcap_multiplier=softcap_multiplier,
            alibi_slope=alibi_slope(mAlibi, batch_idx, head_idx, scale_log2) if cutlass.const_expr(cfg.alibi) else None,
        )
        for i in cutlass.range(n_block_max - n_block_min, unroll=1):
            self.compute_one_n_block(st, mask, acc_dQ, m_block, n_block_max - 1 - i)

        # ---- step 7: dQ *= softmax_scale, out through shared memory (sQ's bytes)
        acc_dQ.store(acc_dQ.load() * softmax_scale)
        cute.arch.cp_async_wait_group(0)  # the loop may have run zero times
        cute.arch.sync_threads()
        gdQ = cute.local_tile(seq.rows_q(mdQ, head_idx), tile_q, (m_block, 0))
        store_o(acc_dQ, sQ, gdQ, tiled_mma, gmem_tiled_copy_store, tidx, rows_left, head_dim, check_hdim)

    @cute.jit
    def compute_one_n_block(
        self, st: SimpleNamespace, mask: AttentionMask, acc_dQ: cute.Tensor, m_block: Int32, n_block: Int32
    ):
        """One K/V tile: recompute P and dS for this dQ tile and add dS K to dQ."""
        cfg = self.config
        tile_k = (self.block_n, self.head_dim_padded)
        tile_v = (self.block_n, self.head_dim_v_padded)
        # K, V -> shared memory (rows past seqlen_k zero-filled); every warp is done with the last tile
        rows_left = st.seqlen_k - n_block * self.block_n
        for m, s, tile, c in ((st.mK, st.sK, tile_k, st.copy_k), (st.mV, st.sV, tile_v, st.copy_v)):
            gcopy.load_tile(
                c, cute.local_tile(st.seq.rows_k(m, st.kv_head_idx), tile, (n_block, 0)), s, rows_left, st.tidx
            )
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        # steps 3 to 5: S = Q K^T, mask, P; dP = dO V^T; dS = P (dP - D)
        acc_S = cute.make_rmem_tensor(st.thr_mma.partition_shape_C((self.block_m, self.block_n)), Float32)
        acc_dP = cute.make_rmem_tensor(st.thr_mma.partition_shape_C((self.block_m, self.block_n)), Float32)
        acc_S.fill(0.0)
        acc_dP.fill(0.0)
        gemm_ss(
            st.tiled_mma,
            acc_S,
            st.rQ,
            st.rK,
            st.copy_A.partition_S(st.sQ),
            st.copy_B.partition_S(st.sK),
            st.copy_A,
            st.copy_B,
        )
        if cutlass.const_expr(cfg.softcap):  # S = tanh(S * softmax_scale / softcap)
            apply_softcap(acc_S, st.softcap_multiplier)
        if cutlass.const_expr(cfg.alibi):  # S -= slope * |i + offset - j| (t kept for the cap's derivative)
            acc_t = keep_t(acc_S) if cutlass.const_expr(cfg.softcap) else None
            mask.apply_alibi(acc_S, m_block, n_block, st.alibi_slope)
        mask.apply_mask(acc_S, m_block, n_block, cfg.mask_right or cfg.mask_left)
        recompute_probs(acc_S, st.lse_log2, st.scale_log2)
        gemm_ss(
            st.tiled_mma,
            acc_dP,
            st.rdO,
            st.rV,
            st.copy_A.partition_S(st.sdO),
            st.copy_B.partition_S(st.sV),
            st.copy_A,
            st.copy_B,
        )
        softmax_grad(acc_S, acc_dP, st.d_row)
        if cutlass.const_expr(cfg.softcap and cfg.alibi):  # dS *= 1 - t^2, the cap's derivative
            softcap_grad_kept(acc_t, acc_dP)
        elif cutlass.const_expr(cfg.softcap):
            softcap_grad(acc_S, acc_dP, st.lse_log2, st.scale_log2)
        # step 6: dQ += dS K, dS converted to 16 bits in the registers that computed it
        rdS = converted(acc_dP, self.dtype)
        gemm_rs(st.tiled_mma, acc_dQ, acc_as_operand_a(rdS), st.rKt, st.copy_Bt.partition_S(st.sKt), st.copy_Bt)
        cute.arch.sync_threads()  # every warp is done with sK and sV before the next tile loads
