"""The Hopper backward kernel for head dims over 128 (sm_90a): queries as rows, dK and dV transposed.

FlashAttentionBackwardSm90 keeps dK and dV of 64 key rows in each consumer warpgroup's registers, 2 x 64 x D / 128
fp32 registers a thread: past D = 128 they no longer fit beside S and dP. Here the wgmma's M runs along the head
dim instead (FlashAttention-3's dKV_swapAB), so a warpgroup's share of dK and dV shrinks with the K/V tile:

    S   = Q K^T          (wgmma, both from shared memory; the warpgroups split the keys)
    dP  = dO V^T         (wgmma, both from shared memory)
    P   = exp2(S * scale_log2 - LSE * log2 e)             per row (query) LSE
    dS  = P * (dP - D)                                    per row D = rowsum(dO * O)
    P, dS -> shared memory, both warpgroups' halves
    dV^T += dO^T P       (wgmma from shared memory: dO^T a transposed view of the dO tile, P through one of P's)
    dK^T += Q^T dS       (wgmma from shared memory)
    dQ    = dS K         (wgmma from shared memory, the warpgroups split the head dim)
    (dK times softmax_scale once at the end, dQ in the postprocess that casts it)

The producer warp, the dQ writer warp, the walk over query heads and Q tiles and the host contract are
FlashAttentionBackwardSm90's; see its module for them.
"""

from functools import partial
from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup

from flashcute.kernels.common import tma
from flashcute.kernels.common.alibi import alibi_slope
from flashcute.kernels.common.layout import store_converted
from flashcute.kernels.common.mask import AttentionMask
from flashcute.kernels.common.softcap import apply_softcap, keep_t, softcap_grad, softcap_grad_kept
from flashcute.kernels.common.softmax import recompute_probs, smem_rows, softmax_grad
from flashcute.kernels.common.tile_info import TileInfo
from flashcute.kernels.common.wgmma import gemm, transpose_view
from flashcute.kernels.sm90.bwd import CONSUMER_THREADS, DS_BARRIER, FlashAttentionBackwardSm90, _tiled_mma
from flashcute.kernels.sm90.config import Sm90BwdConfig


class FlashAttentionBackwardSm90Wide(FlashAttentionBackwardSm90):
    """dK, dV (and dQ through TMA reduce-adds) on Hopper at head dims over 128. Construct from a Sm90BwdConfig;
    compile for sm_90a."""

    DKV_TRANSPOSED = True  # the dK and dV accumulators are (head_dim, block_n)

    @staticmethod
    def tile_reason(config: Sm90BwdConfig) -> str | None:
        """Why the kernel cannot take ``config``'s tiles and head dim, or None."""
        if config.block_m != 64:
            return f"block_m={config.block_m} is not 64 (one row of warpgroup tiles for S and dP)"
        if config.block_n % 32 != 0:
            return f"block_n={config.block_n} is not a multiple of 32 (a warpgroup's keys, by 16-column stmatrix)"
        if config.head_dim_padded % 64 != 0:
            return f"head_dim_padded={config.head_dim_padded} is not a multiple of 64 (wgmma tiles of dK^T and dV^T)"
        return None

    # ---------------------------------------------------------------- host side: layouts and GEMMs
    def smem_layouts(self) -> tuple:
        """As the keys-as-rows kernel's, but the dS buffers hold two of P and two of dS (P of odd steps, of even,
        then dS's), each a (block_m, block_n) tile, keys contiguous: a warpgroup writes a step's P and dS while
        the other may still read the step before's. Swizzle atoms of the widest kind that divides a warpgroup's
        keys (32 columns of 32 keys, 16 of 48), which the dV^T and dK^T MMAs partition their B operands into."""
        layouts = list(super().smem_layouts())
        layouts[3] = tma.smem_layout(self.dtype, self.block_m, self.block_n, 4, atom_cols=self.block_n // 2)
        return tuple(layouts)

    def tiled_mmas(self) -> SimpleNamespace:
        """S and dP split by keys between the warpgroups; dV^T and dK^T (head dim as M) likewise; dQ split by
        head dim."""
        d, bn = self.head_dim_padded, self.block_n
        K, MN = OperandMajorMode.K, OperandMajorMode.MN
        return SimpleNamespace(
            # S and dP: (block_m, block_n), A = Q or dO, B = K or V
            sdp=_tiled_mma(self.dtype, K, K, (1, 2), bn // 2),
            # dV^T and dK^T: (head_dim, block_n), A = dO^T or Q^T, B = P or dS (transposed views of their tiles)
            dkv=_tiled_mma(self.dtype, MN, MN, (1, 2), bn // 2),
            # dQ: (block_m, head_dim), A = dS, B = K^T (a transposed view of K)
            dq=_tiled_mma(self.dtype, K, MN, (1, 2), d // 2),
        )

    # ---------------------------------------------------------------- steps 3 to 7: the consumer warpgroups
    def operands(self, smem: SimpleNamespace, thr: SimpleNamespace, wg: SimpleNamespace) -> dict:
        """The step's GEMM operands, all from shared memory, and dK^T's and dV^T's accumulators (acc_dK, acc_dV)."""
        d, bn = self.head_dim_padded, self.block_n
        sQt, sdOt, sKt = (transpose_view(s) for s in (smem.sQ, smem.sdO, smem.sK))  # (D, rows, stage)
        sPt = transpose_view(smem.sdS)  # P (two buffers) and dS (two): (block_n, block_m, 4)
        return dict(
            tSrQ=wg.sdp.make_fragment_A(wg.sdp.partition_A(smem.sQ)),
            tSrK=wg.sdp.make_fragment_B(wg.sdp.partition_B(smem.sK))[None, None, None, 0],
            tdPrdO=wg.sdp.make_fragment_A(wg.sdp.partition_A(smem.sdO)),
            tdPrV=wg.sdp.make_fragment_B(wg.sdp.partition_B(smem.sV))[None, None, None, 0],
            tdVrdOt=wg.dkv.make_fragment_A(wg.dkv.partition_A(sdOt)),
            tdKrQt=wg.dkv.make_fragment_A(wg.dkv.partition_A(sQt)),
            tdKVrPdS=wg.dkv.make_fragment_B(wg.dkv.partition_B(sPt)),  # P at buffer b, dS at 2 + b
            tdQrdS=wg.dq.make_fragment_A(wg.dq.partition_A(smem.sdS)),
            tdQrKt=wg.dq.make_fragment_B(wg.dq.partition_B(sKt))[None, None, None, 0],
            acc_dK=thr.dkv.make_fragment_C(thr.dkv.partition_shape_C((d, bn))),
            acc_dV=thr.dkv.make_fragment_C(thr.dkv.partition_shape_C((d, bn))),
        )

    def make_mask(self, tile_info: TileInfo, thr_sdp, thr0_sdp) -> AttentionMask:
        """The mask of S's tiles, also the (query, key) coordinates of its elements."""
        return AttentionMask(tile_info, thr_sdp, thr0_sdp)

    @cute.jit
    def one_q_tile(
        self,
        smem: SimpleNamespace,
        pipes: SimpleNamespace,
        mma: SimpleNamespace,
        mask: AttentionMask,
        work: SimpleNamespace,
        scale_log2: Float32,
        softcap_multiplier: Float32 | None,
        softmax_scale: Float32,
        state,
        head_idx: Int32,
        m_block: Int32,
        masked: cutlass.Constexpr[bool],
    ):
        """Steps 3 to 6 for one Q tile of one query head; returns the advanced pipeline state."""
        bm, bn, d = self.block_m, self.block_n, self.head_dim_padded
        stage = state.index  # one Q/dO stage (Sm90BwdConfig.num_stages)
        buffer = state.phase  # P's and dS's buffers alternate step by step, as the pipeline's phase does
        # step 3: S = Q K^T, then dP = dO V^T, both in flight while softmax waits for S
        acc_S = mma.thr_sdp.make_fragment_C(mma.thr_sdp.partition_shape_C((bm, bn)))
        acc_dP = mma.thr_sdp.make_fragment_C(mma.thr_sdp.partition_shape_C((bm, bn)))
        pipes.q.consumer_wait(state)
        gemm(mma.tiled_mma_sdp, acc_S, mma.tSrQ[None, None, None, stage], mma.tSrK, True, -1)
        pipes.do.consumer_wait(state)
        gemm(mma.tiled_mma_sdp, acc_dP, mma.tdPrdO[None, None, None, stage], mma.tdPrV, True, 1)
        if cutlass.const_expr(self.config.softcap):  # S = tanh(S * softmax_scale / softcap)
            apply_softcap(acc_S, softcap_multiplier)
        if cutlass.const_expr(self.config.alibi):  # S -= slope * |q + offset - key| (t kept for the cap's derivative)
            acc_t = keep_t(acc_S) if cutlass.const_expr(self.config.softcap) else None
            slope = alibi_slope(mma.alibi, work.seq.batch_idx, head_idx, scale_log2)
            mask.apply_alibi(acc_S, m_block, work.n_block, slope)
        # steps 4 and 5: mask, P = exp2(S * scale_log2 - LSE log2 e)
        if cutlass.const_expr(masked):
            mask.apply_mask(acc_S, m_block, work.n_block, True)
        lse_log2 = smem_rows(smem.sLSE[None, stage], mask.tScS)
        recompute_probs(acc_S, lse_log2, scale_log2)
        warpgroup.wait_group(0)  # dP
        softmax_grad(acc_S, acc_dP, smem_rows(smem.sD[None, stage], mask.tScS))  # acc_dP becomes dS
        if cutlass.const_expr(self.config.softcap and self.config.alibi):  # dS *= 1 - t^2, the cap's derivative
            softcap_grad_kept(acc_t, acc_dP)
        elif cutlass.const_expr(self.config.softcap):  # t from the fp32 P
            softcap_grad(acc_S, acc_dP, lse_log2, scale_log2)
        # step 6: P and dS to shared memory, then dQ = dS K, dV^T += dO^T P and dK^T += Q^T dS from there
        for acc, b in ((acc_S, buffer), (acc_dP, 2 + buffer)):
            rX = cute.make_fragment_like(acc, self.dtype)
            store_converted(acc, rX)
            cute.copy(mma.store_scores, mma.store_scores.retile(rX), mma.tScores[None, None, None, b])
        cute.arch.fence_view_async_shared()  # the generic-proxy writes, visible to wgmma
        cute.arch.barrier(barrier_id=DS_BARRIER, number_of_threads=CONSUMER_THREADS)  # both halves of P and dS
        acc_dQ = mma.thr_dq.make_fragment_C(mma.thr_dq.partition_shape_C((bm, d)))
        dq = partial(gemm, mma.tiled_mma_dq, acc_dQ, mma.tdQrdS[None, None, None, 2 + buffer], mma.tdQrKt, True)
        dkv = partial(gemm, mma.tiled_mma_dkv)
        dO_t, Q_t = mma.tdVrdOt[None, None, None, stage], mma.tdKrQt[None, None, None, stage]
        P, dS = mma.tdKVrPdS[None, None, None, buffer], mma.tdKVrPdS[None, None, None, 2 + buffer]
        # dV's and dK's MMAs first, so that the next Q and dO load while dQ's MMA runs and leaves
        dkv(mma.acc_dV, dO_t, P, False, -1)
        dkv(mma.acc_dK, Q_t, dS, False, -1)
        dq(1)  # dV and dK are done with dO and Q
        pipes.do.consumer_release(state)
        pipes.q.consumer_release(state)
        warpgroup.wait_group(0)
        self.stage_dq(mma, acc_dQ)
        state.advance()
        return state
