"""The FlashAttention backward kernel for sm_80 and newer (mma.sync 16x8x16, cp.async, ldmatrix).

One thread block owns one (block_n, head_dim) tile of K and V for one (batch, kv head) and walks every query
head of its GQA group and every Q tile that sees its keys. dK and dV stay in registers for the whole walk; dQ is
accumulated across thread blocks with fp32 atomic adds into a zeroed buffer that a postprocess scales and casts.
Per Q tile, with P and dS staged through shared memory because their transposes are MMA operands:

    S  = Q K^T                 P  = exp2(S * scale_log2 - LSE * log2 e)      (the forward's probabilities)
    dP = dO V^T                dS = P * (dP - D),   D = rowsum(dO * O) from the preprocess
    dV += P^T dO               dK += dS^T Q         dQ += dS K              (dK and dQ times softmax_scale)

With softcap, S is capped first and dS takes the cap's derivative (kernels/common/softcap.py).
V, dO and dV may have a head dim of their own (v's, at most q's: BwdConfig.head_dim_v_padded): the inner
dimension of dP = dO V^T and the width of dV.

Rows past seqlen_q load as zeros with LSE = +inf, so their P and dS are 0; K/V rows past seqlen_k load as zeros
and their scores are masked, so 0 * garbage never makes a NaN.

The Q tiles are walked as one flat sequence t = 0, 1, ... over (query head, m_block). Q, dO, LSE and D of tile t
live in shared-memory stage t % num_stages, loaded with cp.async. With two stages, tile t + 1 is loaded while
tile t computes:
    wait for tile t, barrier    (tile t landed for every thread; every warp is done with tile t - 1, so its
                                 stage, and sP and sdS, may be written again)
    issue tile t + 1's loads into the other stage
    S, dP, P, dS -> sP, sdS, barrier, dV, dK, dQ
With one stage (head dim 256, for sm_80's shared memory) the next tile's loads go out after a barrier that follows
the dK GEMM, the last reader of sQ and sdO, and overlap the dQ GEMM and its atomics.
"""

import re
from types import SimpleNamespace

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import warp

from flashcute.kernels.common import copy as gcopy
from flashcute.kernels.common.alibi import alibi_slope
from flashcute.kernels.common.atomics import add_tile
from flashcute.kernels.common.dtypes import CUTLASS_DTYPES
from flashcute.kernels.common.epilogue import store_o
from flashcute.kernels.common.gemm import gemm_ss
from flashcute.kernels.common.layout import acc_rows_cols, converted
from flashcute.kernels.common.limits import exact_value_head_dim, value_head_dim
from flashcute.kernels.common.mask import AttentionMask
from flashcute.kernels.common.seqlen import SeqLens
from flashcute.kernels.common.softcap import apply_softcap, keep_t, softcap_grad, softcap_grad_kept, softcap_scales
from flashcute.kernels.common.softmax import d_rows, lse_log2_rows, recompute_probs, softmax_grad
from flashcute.kernels.common.tile_info import TileInfo
from flashcute.kernels.sm80.config import BwdConfig
from flashcute.kernels.sm80.limits import common_limits


def _tiled_mma(dtype, warps_m: int, warps_n: int) -> cute.TiledMma:
    return cute.make_tiled_mma(
        warp.MmaF16BF16Op(dtype, Float32, (16, 8, 16)),
        (warps_m, warps_n, 1),
        permutation_mnk=(warps_m * 16, warps_n * 16, 16),
    )


def _transposed(t: cute.Tensor, rows: int, cols: int, stages: int | None = None) -> cute.Tensor:
    """A (cols, rows) view of a (rows, cols) shared-memory tile, or (cols, rows, stages) of (rows, cols, stages)
    tiles: the same bytes, read with ldmatrix.trans."""
    if stages is None:
        return cute.composition(t, cute.make_layout((cols, rows), stride=(rows, 1)))
    return cute.composition(t, cute.make_layout((cols, rows, stages), stride=(rows, 1, rows * cols)))


def _sm_number(arch: str) -> int:
    """90 for "sm_90a", 80 for "sm_80"."""
    return int(re.fullmatch(r"sm_(\d+)[af]?", arch).group(1))


class FlashAttentionBackwardSm80:
    """dK, dV (and dQ through atomics) on mma.sync tensor cores. Construct from a BwdConfig and the target."""

    def __init__(self, config: BwdConfig, arch: str):
        self.config = config
        # dQ values a red.global.add adds at once: sm_90 has red.global.add.v2.f32, and a thread's dQ accumulator
        # holds pairs of neighbouring columns of a row
        self.dq_red_width = 2 if _sm_number(arch) >= 90 else 1
        self.dtype = CUTLASS_DTYPES[config.dtype]
        self.block_m = config.block_m
        self.block_n = config.block_n
        self.head_dim_padded = config.head_dim_padded
        self.head_dim_v_padded = value_head_dim(config)  # V's, dO's and dV's: q's, or a smaller bucket
        self.num_stages = config.num_stages
        self.num_threads = config.num_warps * 32

    @staticmethod
    def can_implement(config: BwdConfig, arch: str) -> str | None:
        """None if the kernel can be built for ``config`` on target ``arch``, else the reason it cannot."""
        warps = config.num_warps
        for name, rows, warps_along in (
            ("block_m", config.block_m, config.warps_m_sdp),
            ("block_n", config.block_n, warps // config.warps_m_sdp),
            ("block_n", config.block_n, config.warps_n_dkv),
            ("block_m", config.block_m, config.warps_m_dq),
        ):
            if warps % warps_along != 0 or rows % (16 * warps_along) != 0:
                return f"{name}={rows} does not split over {warps_along} of {warps} warps in 16-row MMA atoms"
        head_dim, head_dim_v = config.head_dim_padded, value_head_dim(config)
        for gemm, warps_along_d, width in (
            ("dK", warps // config.warps_n_dkv, head_dim),
            ("dV", warps // config.warps_n_dkv, head_dim_v),
            ("dQ", warps // config.warps_m_dq, head_dim),
        ):
            if width % (16 * warps_along_d) != 0:
                return f"{gemm}: {warps_along_d} warps along the head dim do not tile {width}"
        if config.block_n % 64 != 0 or config.block_m % 8 != 0:
            return "block_n must be a multiple of 64 (the P and dS tiles use a 64-wide swizzle atom)"
        if config.num_stages not in (1, 2):
            return f"num_stages={config.num_stages} is not 1 or 2"
        if config.block_m > warps * 32:
            return f"block_m={config.block_m} is over the {warps * 32} threads that load one LSE and D row each"
        return common_limits(config, warps * 32, config.smem_bytes(), arch)

    # ---------------------------------------------------------------- host side
    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (batch, seqlen_q, nheads, head_dim)
        mK: cute.Tensor,  # (batch, seqlen_k, nheads_k, head_dim)
        mV: cute.Tensor,  # (batch, seqlen_k, nheads_k, head_dim_v)
        mdO: cute.Tensor,  # (batch, seqlen_q, nheads, head_dim_v)
        mLSE: cute.Tensor,  # (batch, nheads, seqlen_q) float32
        mD: cute.Tensor,  # (batch, nheads, seqlen_q) float32: rowsum(dO * O)
        mdQaccum: cute.Tensor | None,  # (batch, seqlen_q, nheads, head_dim) float32, zeroed; None: no dQ here
        mdK: cute.Tensor,  # (batch, seqlen_k, nheads_k, head_dim)
        mdV: cute.Tensor,  # (batch, seqlen_k, nheads_k, head_dim_v)
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
        cfg = self.config
        d, dv = self.head_dim_padded, self.head_dim_v_padded
        atom, atom_v = (gcopy.smem_layout_atom(self.dtype, n) for n in (d, dv))
        # Q and dO (and LSE and D) have num_stages buffers: (block_m, D, num_stages), (block_m, num_stages)
        sQ_layout = cute.tile_to_shape(atom, (self.block_m, d, self.num_stages), (0, 1, 2))
        sdO_layout = cute.tile_to_shape(atom_v, (self.block_m, dv, self.num_stages), (0, 1, 2))
        sK_layout = cute.tile_to_shape(atom, (self.block_n, d), (0, 1))
        sV_layout = cute.tile_to_shape(atom_v, (self.block_n, dv), (0, 1))
        sP_layout = cute.tile_to_shape(gcopy.smem_layout_atom(self.dtype, 64), (self.block_m, self.block_n), (0, 1))
        sLSE_layout = cute.make_layout((self.block_m, self.num_stages))

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sdO_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sP_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sP_layout)], 1024]
            sLSE: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sLSE_layout)], 1024]
            sD: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sLSE_layout)], 1024]

        assert SharedStorage.size_in_bytes() <= cfg.smem_bytes(), "BwdConfig.smem_bytes undercounts the kernel's"

        warps = cfg.num_warps
        tiled_mma_sdp = _tiled_mma(self.dtype, cfg.warps_m_sdp, warps // cfg.warps_m_sdp)
        tiled_mma_dkv = _tiled_mma(self.dtype, cfg.warps_n_dkv, warps // cfg.warps_n_dkv)
        tiled_mma_dq = _tiled_mma(self.dtype, cfg.warps_m_dq, warps // cfg.warps_m_dq)
        gmem_tiled_copy_load = gcopy.make_gmem_tiled_copy(self.dtype, d, self.num_threads, True)
        gmem_tiled_copy_load_v = gcopy.make_gmem_tiled_copy(self.dtype, dv, self.num_threads, True)
        gmem_tiled_copy_store = gcopy.make_gmem_tiled_copy(self.dtype, d, self.num_threads, False)
        gmem_tiled_copy_store_v = gcopy.make_gmem_tiled_copy(self.dtype, dv, self.num_threads, False)
        gmem_tiled_copy_stats = gcopy.make_row_stats_copy(self.block_m)

        batch, seqlen_k = mK.shape[0], mK.shape[1]
        if cutlass.const_expr(mCuSeqlensQ is not None):
            batch, seqlen_k = mSeqUsedK.shape[0], max_seqlen_k
        num_n_blocks = cute.ceil_div(seqlen_k, self.block_n)
        self.kernel(
            mQ,
            mK,
            mV,
            mdO,
            mLSE,
            mD,
            mdQaccum,
            mdK,
            mdV,
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
            num_n_blocks,
            sQ_layout,
            sdO_layout,
            sK_layout,
            sV_layout,
            sP_layout,
            sLSE_layout,
            gmem_tiled_copy_load,
            gmem_tiled_copy_load_v,
            gmem_tiled_copy_store,
            gmem_tiled_copy_store_v,
            gmem_tiled_copy_stats,
            tiled_mma_sdp,
            tiled_mma_dkv,
            tiled_mma_dq,
            SharedStorage,
        ).launch(
            grid=[num_n_blocks * mK.shape[2] * batch, 1, 1],
            block=[self.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
        )

    # ---------------------------------------------------------------- device side
    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mD: cute.Tensor,
        mdQaccum: cute.Tensor | None,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
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
        num_n_blocks: Int32,
        sQ_layout: cute.ComposedLayout,
        sdO_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout,
        sLSE_layout: cute.Layout,
        gmem_tiled_copy_load: cute.TiledCopy,
        gmem_tiled_copy_load_v: cute.TiledCopy,
        gmem_tiled_copy_store: cute.TiledCopy,
        gmem_tiled_copy_store_v: cute.TiledCopy,
        gmem_tiled_copy_stats: cute.TiledCopy,
        tiled_mma_sdp: cute.TiledMma,
        tiled_mma_dkv: cute.TiledMma,
        tiled_mma_dq: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        cfg = self.config
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()

        # ---- step 1: our K/V tile, and the Q tiles and query heads that see it
        nheads_k = mK.shape[2]
        n_block = bidx % num_n_blocks
        kv_head_idx = (bidx // num_n_blocks) % nheads_k
        batch_idx = bidx // num_n_blocks // nheads_k
        qheads_per_kvhead = mQ.shape[2] // nheads_k
        seq = SeqLens(batch_idx, mQ.shape[1], mK.shape[1], diag_offset, mCuSeqlensQ, mCuSeqlensK, mSeqUsedQ, mSeqUsedK)
        seqlen_q, seqlen_k = seq.seqlen_q, seq.seqlen_k
        head_dim = mQ.shape[3]
        head_dim_v = head_dim if cutlass.const_expr(cfg.head_dim_v_padded is None) else mV.shape[3]
        check_hdim, check_hdim_v = not cfg.exact_head_dim, not exact_value_head_dim(cfg)
        tile_info = TileInfo.of(cfg, seqlen_q, seqlen_k, seq.diag_offset, window_left, window_right)
        m_block_min, m_block_max = tile_info.m_block_range(n_block)
        if cutlass.const_expr(seq.packed):  # noqa: SIM102 (a compile-time test around a run-time one)
            if n_block * self.block_n >= seqlen_k:  # past a shorter sequence's end: no keys, no Q tile to walk
                m_block_max = m_block_min
        scale_log2, softcap_multiplier = softcap_scales(softmax_scale, softcap)

        tile_q = (self.block_m, self.head_dim_padded)
        tile_do = (self.block_m, self.head_dim_v_padded)
        tile_k = (self.block_n, self.head_dim_padded)
        tile_v = (self.block_n, self.head_dim_v_padded)
        gK = cute.local_tile(seq.rows_k(mK, kv_head_idx), tile_k, (n_block, 0))
        gV = cute.local_tile(seq.rows_k(mV, kv_head_idx), tile_v, (n_block, 0))

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)  # (block_m, D, num_stages)
        sdO = storage.sdO.get_tensor(sdO_layout)  # (block_m, Dv, num_stages)
        sK = storage.sK.get_tensor(sK_layout)
        sV = storage.sV.get_tensor(sV_layout)
        sP = storage.sP.get_tensor(sP_layout)
        sdS = storage.sdS.get_tensor(sP_layout)
        sLSE = storage.sLSE.get_tensor(sLSE_layout)  # (block_m, num_stages)
        sD = storage.sD.get_tensor(sLSE_layout)
        sPt = _transposed(sP, self.block_m, self.block_n)  # (block_n, block_m)
        sdSt = _transposed(sdS, self.block_m, self.block_n)
        sQt = _transposed(sQ, self.block_m, self.head_dim_padded, self.num_stages)  # (D, block_m, num_stages)
        sdOt = _transposed(sdO, self.block_m, self.head_dim_v_padded, self.num_stages)  # (Dv, block_m, num_stages)
        sKt = _transposed(sK, self.block_n, self.head_dim_padded)  # (D, block_n)

        # ---- step 2: K and V once; Q, dO, LSE and D per Q tile (rows past seqlen_q zero-filled)
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
        kv_rows_left = seqlen_k - n_block * self.block_n
        for g, s, c in ((gK, sK, copy_k), (gV, sV, copy_v)):
            gcopy.load_tile(c, g, s, kv_rows_left, tidx)
        cute.arch.cp_async_commit_group()

        # ---- MMA partitions and the shared -> register copies of every operand
        thr_mma_sdp = tiled_mma_sdp.get_slice(tidx)
        thr_mma_dkv = tiled_mma_dkv.get_slice(tidx)
        thr_mma_dq = tiled_mma_dq.get_slice(tidx)
        ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        ldsm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype)
        copy_A_sdp = cute.make_tiled_copy_A(ldsm, tiled_mma_sdp).get_slice(tidx)
        copy_B_sdp = cute.make_tiled_copy_B(ldsm, tiled_mma_sdp).get_slice(tidx)
        copy_A_dkv = cute.make_tiled_copy_A(ldsm_t, tiled_mma_dkv).get_slice(tidx)
        copy_B_dkv = cute.make_tiled_copy_B(ldsm_t, tiled_mma_dkv).get_slice(tidx)
        copy_A_dq = cute.make_tiled_copy_A(ldsm, tiled_mma_dq).get_slice(tidx)
        copy_B_dq = cute.make_tiled_copy_B(ldsm_t, tiled_mma_dq).get_slice(tidx)
        frag = SimpleNamespace(  # register fragments of every MMA operand
            rQ=thr_mma_sdp.make_fragment_A(thr_mma_sdp.partition_A(sQ[None, None, 0])),
            rdO=thr_mma_sdp.make_fragment_A(thr_mma_sdp.partition_A(sdO[None, None, 0])),
            rK=thr_mma_sdp.make_fragment_B(thr_mma_sdp.partition_B(sK)),
            rV=thr_mma_sdp.make_fragment_B(thr_mma_sdp.partition_B(sV)),
            rPt=thr_mma_dkv.make_fragment_A(thr_mma_dkv.partition_A(sPt)),
            rdSt=thr_mma_dkv.make_fragment_A(thr_mma_dkv.partition_A(sdSt)),
            rdOt=thr_mma_dkv.make_fragment_B(thr_mma_dkv.partition_B(sdOt[None, None, 0])),
            rQt=thr_mma_dkv.make_fragment_B(thr_mma_dkv.partition_B(sQt[None, None, 0])),
            rdS=thr_mma_dq.make_fragment_A(thr_mma_dq.partition_A(sdS)),
            rKt=thr_mma_dq.make_fragment_B(thr_mma_dq.partition_B(sKt)),
        )
        acc_dK = cute.make_rmem_tensor(thr_mma_dkv.partition_shape_C(tile_k), Float32)
        acc_dV = cute.make_rmem_tensor(thr_mma_dkv.partition_shape_C(tile_v), Float32)
        acc_dK.fill(0.0)
        acc_dV.fill(0.0)
        mask = AttentionMask(tile_info, thr_mma_sdp, tiled_mma_sdp.get_slice(0))
        store_P = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype), tiled_mma_sdp)
        store_P = store_P.get_slice(tidx)
        gmem_thr_copy_stats = gmem_tiled_copy_stats.get_slice(tidx)

        st = SimpleNamespace(
            mQ=mQ,
            mdO=mdO,
            mLSE=mLSE,
            mD=mD,
            mdQaccum=mdQaccum,
            sLSE=sLSE,
            sD=sD,
            # the tile sequence: tile t is query head kv_head_idx * qheads_per_kvhead + t // num_m_blocks,
            # Q tile m_block_min + t % num_m_blocks
            num_m_blocks=m_block_max - m_block_min,
            m_block_min=m_block_min,
            first_head_idx=kv_head_idx * qheads_per_kvhead,
            # step 2's copies and partitions of Q, dO, LSE, D (smem sides with their stage mode last)
            copy_q=copy_q,
            copy_do=copy_do,
            tQsQ=copy_q.tiled_copy.get_slice(tidx).partition_D(sQ),
            tdOsdO=copy_do.tiled_copy.get_slice(tidx).partition_D(sdO),
            gmem_tiled_copy_stats=gmem_tiled_copy_stats,
            gmem_thr_copy_stats=gmem_thr_copy_stats,
            tLSEsLSE=gmem_thr_copy_stats.partition_D(sLSE),
            tDsD=gmem_thr_copy_stats.partition_D(sD),
            # steps 3 and 6: the ldmatrix partitions of every GEMM's operands
            tiled_mma_sdp=tiled_mma_sdp,
            tiled_mma_dkv=tiled_mma_dkv,
            tiled_mma_dq=tiled_mma_dq,
            thr_mma_sdp=thr_mma_sdp,
            thr_mma_dq=thr_mma_dq,
            copy_A_sdp=copy_A_sdp,
            copy_B_sdp=copy_B_sdp,
            copy_A_dkv=copy_A_dkv,
            copy_B_dkv=copy_B_dkv,
            copy_A_dq=copy_A_dq,
            copy_B_dq=copy_B_dq,
            tSsQ=copy_A_sdp.partition_S(sQ),
            tSsK=copy_B_sdp.partition_S(sK),
            tdPsdO=copy_A_sdp.partition_S(sdO),
            tdPsV=copy_B_sdp.partition_S(sV),
            tdVsPt=copy_A_dkv.partition_S(sPt),
            tdVsdOt=copy_B_dkv.partition_S(sdOt),
            tdKsdSt=copy_A_dkv.partition_S(sdSt),
            tdKsQt=copy_B_dkv.partition_S(sQt),
            tdQsdS=copy_A_dq.partition_S(sdS),
            tdQsKt=copy_B_dq.partition_S(sKt),
            store_P=store_P,
            tPsP=store_P.partition_D(sP),
            tdSsdS=store_P.partition_D(sdS),
            # (row, col) of each S element, for LSE and D per row
            tScS=acc_rows_cols(thr_mma_sdp.partition_C(cute.make_identity_tensor((self.block_m, self.block_n)))),
            # dQ: this thread's elements of a (block_m, D) tile and their coordinates, for the atomic adds
            tdQcdQ=thr_mma_dq.partition_C(cute.make_identity_tensor(tile_q)),
            tidx=tidx,
            seq=seq,
            seqlen_q=seqlen_q,
            head_dim=head_dim,
            scale_log2=scale_log2,
            softcap_multiplier=softcap_multiplier,
            alibi=mAlibi,
        )
        num_tiles = qheads_per_kvhead * st.num_m_blocks
        if num_tiles > 0:
            self.load_q_tile(st, st.first_head_idx, m_block_min, 0)
        cute.arch.cp_async_commit_group()
        for t in cutlass.range(num_tiles, unroll=1):
            self.compute_one_m_block(st, frag, mask, acc_dK, acc_dV, t, num_tiles, n_block)

        # ---- step 7: dK *= softmax_scale; dK and dV leave through shared memory (sK's and sV's bytes)
        acc_dK.store(acc_dK.load() * softmax_scale)
        gdK = cute.local_tile(seq.rows_k(mdK, kv_head_idx), tile_k, (n_block, 0))
        gdV = cute.local_tile(seq.rows_k(mdV, kv_head_idx), tile_v, (n_block, 0))
        cute.arch.cp_async_wait_group(0)  # the loop may have run zero times: K and V may still be landing
        cute.arch.sync_threads()  # every warp is done reading sK and sV
        store_o(acc_dK, sK, gdK, tiled_mma_dkv, gmem_tiled_copy_store, tidx, kv_rows_left, head_dim, check_hdim)
        store_o(acc_dV, sV, gdV, tiled_mma_dkv, gmem_tiled_copy_store_v, tidx, kv_rows_left, head_dim_v, check_hdim_v)

    def tile_coords(self, st: SimpleNamespace, t: Int32) -> tuple[Int32, Int32]:
        """(head_idx, m_block) of tile t of the walk."""
        return st.first_head_idx + t // st.num_m_blocks, st.m_block_min + t % st.num_m_blocks

    def stage(self, t: Int32) -> Int32:
        """The shared-memory stage that holds tile t's Q, dO, LSE and D."""
        return t % self.num_stages if cutlass.const_expr(self.num_stages > 1) else 0

    @cute.jit
    def load_q_tile(self, st: SimpleNamespace, head_idx: Int32, m_block: Int32, stage: Int32):
        """Step 2 for one Q tile: cp.async of Q and dO (rows past seqlen_q zero-filled), LSE and D (rows past
        seqlen_q left unloaded) into ``stage``. The caller commits the group."""
        tile_q = (self.block_m, self.head_dim_padded)
        tile_do = (self.block_m, self.head_dim_v_padded)
        rows_left = st.seqlen_q - m_block * self.block_m
        gQ = cute.local_tile(st.seq.rows_q(st.mQ, head_idx), tile_q, (m_block, 0))
        gdO = cute.local_tile(st.seq.rows_q(st.mdO, head_idx), tile_do, (m_block, 0))
        for g, tXsX, c in ((gQ, st.tQsQ, st.copy_q), (gdO, st.tdOsdO, st.copy_do)):
            gcopy.copy_rows(
                c.tiled_copy,
                c.tiled_copy.get_slice(st.tidx).partition_S(g),
                tXsX[None, None, None, stage],
                c.tXcX,
                c.t0XcX,
                c.tXpX,
                rows_left,
                True,
                c.check_hdim,
                True,
            )
        # thread r < block_m loads row r's LSE and D (partitioned out here: a method called on a value inside a
        # dynamic `if` makes the DSL thread that value through the branch)
        gLSE = cute.local_tile(st.seq.row_stats(st.mLSE, head_idx), (self.block_m,), (m_block,))
        gD = cute.local_tile(st.seq.row_stats(st.mD, head_idx), (self.block_m,), (m_block,))
        tLSEgLSE = st.gmem_thr_copy_stats.partition_S(gLSE)
        tDgD = st.gmem_thr_copy_stats.partition_S(gD)
        if st.tidx < cutlass.min(rows_left, self.block_m):
            cute.copy(st.gmem_tiled_copy_stats, tLSEgLSE, st.tLSEsLSE[None, None, stage])
            cute.copy(st.gmem_tiled_copy_stats, tDgD, st.tDsD[None, None, stage])

    @cute.jit
    def compute_one_m_block(
        self,
        st: SimpleNamespace,
        frag: SimpleNamespace,
        mask: AttentionMask,
        acc_dK: cute.Tensor,
        acc_dV: cute.Tensor,
        t: Int32,
        num_tiles: Int32,
        n_block: Int32,
    ):
        """Tile t of the walk (one Q tile of one query head) against this thread block's K/V tile: steps 3 to 6,
        with tile t + 1's loads in flight (see the module docstring for the barriers)."""
        cfg = self.config
        tile_q = (self.block_m, self.head_dim_padded)
        head_idx, m_block = self.tile_coords(st, t)
        stage = self.stage(t)
        rows_left = st.seqlen_q - m_block * self.block_m
        cute.arch.cp_async_wait_group(0)  # tile t (the first time: and K, V) has landed ...
        cute.arch.sync_threads()  # ... for every thread, and every warp is done with tile t - 1's smem
        if cutlass.const_expr(self.num_stages == 2):
            if t + 1 < num_tiles:
                next_head_idx, next_m_block = self.tile_coords(st, t + 1)
                self.load_q_tile(st, next_head_idx, next_m_block, self.stage(t + 1))  # the stage tile t - 1 used
            cute.arch.cp_async_commit_group()

        # step 3: S = Q K^T and dP = dO V^T
        acc_S = cute.make_rmem_tensor(st.thr_mma_sdp.partition_shape_C((self.block_m, self.block_n)), Float32)
        acc_dP = cute.make_rmem_tensor(st.thr_mma_sdp.partition_shape_C((self.block_m, self.block_n)), Float32)
        acc_S.fill(0.0)
        acc_dP.fill(0.0)
        tSsQ = st.tSsQ[None, None, None, stage]
        gemm_ss(st.tiled_mma_sdp, acc_S, frag.rQ, frag.rK, tSsQ, st.tSsK, st.copy_A_sdp, st.copy_B_sdp)
        if cutlass.const_expr(cfg.softcap):  # S = tanh(S * softmax_scale / softcap)
            apply_softcap(acc_S, st.softcap_multiplier)
        if cutlass.const_expr(cfg.alibi):  # S -= slope * |i + offset - j| (t kept for the cap's derivative)
            acc_t = keep_t(acc_S) if cutlass.const_expr(cfg.softcap) else None
            slope = alibi_slope(st.alibi, st.seq.batch_idx, head_idx, st.scale_log2)
            mask.apply_alibi(acc_S, m_block, n_block, slope)
        # step 4: mask; step 5: P = exp2(S * scale_log2 - LSE log2 e)
        mask.apply_mask(acc_S, m_block, n_block, cfg.mask_right or cfg.mask_left)
        lse_log2 = lse_log2_rows(st.sLSE[None, stage], st.tScS, rows_left)
        recompute_probs(acc_S, lse_log2, st.scale_log2)
        tdPsdO = st.tdPsdO[None, None, None, stage]
        gemm_ss(st.tiled_mma_sdp, acc_dP, frag.rdO, frag.rV, tdPsdO, st.tdPsV, st.copy_A_sdp, st.copy_B_sdp)
        softmax_grad(acc_S, acc_dP, d_rows(st.sD[None, stage], st.tScS, rows_left))  # acc_dP becomes dS
        if cutlass.const_expr(cfg.softcap and cfg.alibi):  # dS *= 1 - t^2, the cap's derivative
            softcap_grad_kept(acc_t, acc_dP)
        elif cutlass.const_expr(cfg.softcap):
            softcap_grad(acc_S, acc_dP, lse_log2, st.scale_log2)
        # P and dS -> shared memory in 16 bits: their transposes are the A operands of dV and dK
        rP = converted(acc_S, self.dtype)
        rdS = converted(acc_dP, self.dtype)
        cute.copy(st.store_P, st.store_P.retile(rP), st.tPsP)
        cute.copy(st.store_P, st.store_P.retile(rdS), st.tdSsdS)
        cute.arch.sync_threads()  # P and dS are in shared memory for every warp

        # step 6: dV += P^T dO, dK += dS^T Q
        tdVsdOt = st.tdVsdOt[None, None, None, stage]
        gemm_ss(st.tiled_mma_dkv, acc_dV, frag.rPt, frag.rdOt, st.tdVsPt, tdVsdOt, st.copy_A_dkv, st.copy_B_dkv)
        tdKsQt = st.tdKsQt[None, None, None, stage]
        gemm_ss(st.tiled_mma_dkv, acc_dK, frag.rdSt, frag.rQt, st.tdKsdSt, tdKsQt, st.copy_A_dkv, st.copy_B_dkv)
        if cutlass.const_expr(self.num_stages == 1):
            cute.arch.sync_threads()  # every warp is done with sQ and sdO (the dQ GEMM reads sdS and sK only)
            if t + 1 < num_tiles:
                next_head_idx, next_m_block = self.tile_coords(st, t + 1)
                self.load_q_tile(st, next_head_idx, next_m_block, 0)
            cute.arch.cp_async_commit_group()
        if cutlass.const_expr(cfg.accumulate_dq):
            # dQ += dS K, added into the fp32 buffer (other thread blocks add their K/V tiles' parts)
            acc_dQ = cute.make_rmem_tensor(st.thr_mma_dq.partition_shape_C(tile_q), Float32)
            acc_dQ.fill(0.0)
            gemm_ss(st.tiled_mma_dq, acc_dQ, frag.rdS, frag.rKt, st.tdQsdS, st.tdQsKt, st.copy_A_dq, st.copy_B_dq)
            gdQ = cute.local_tile(st.seq.rows_q(st.mdQaccum, head_idx), tile_q, (m_block, 0))
            add_tile(acc_dQ, st.tdQcdQ, gdQ, rows_left, st.head_dim, self.dq_red_width)
