"""Steps 3 and 6: warp-level GEMMs on mma.sync 16x8x16, operands read from shared memory with ldmatrix.

The k loop is software-pipelined by one step: the ldmatrix for k+1 is issued before the MMAs of k, so shared
memory latency hides behind tensor-core work.
"""

import cutlass
import cutlass.cute as cute


@cute.jit
def gemm_ss(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    tCsA: cute.Tensor,
    tCsB: cute.Tensor,
    smem_thr_copy_A: cute.TiledCopy,
    smem_thr_copy_B: cute.TiledCopy,
):
    """acc += A B^T with both operands in shared memory (S = Q K^T: K is the B operand as stored, no transpose)."""
    tCrA_view = smem_thr_copy_A.retile(tCrA)
    tCrB_view = smem_thr_copy_B.retile(tCrB)
    cute.copy(smem_thr_copy_A, tCsA[None, None, 0], tCrA_view[None, None, 0])
    cute.copy(smem_thr_copy_B, tCsB[None, None, 0], tCrB_view[None, None, 0])
    num_k = cute.size(tCsA.shape[2])
    for k in cutlass.range_constexpr(num_k):
        if cutlass.const_expr(k < num_k - 1):
            cute.copy(smem_thr_copy_A, tCsA[None, None, k + 1], tCrA_view[None, None, k + 1])
            cute.copy(smem_thr_copy_B, tCsB[None, None, k + 1], tCrB_view[None, None, k + 1])
        cute.gemm(tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)


@cute.jit
def gemm_rs(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    tCsB: cute.Tensor,
    smem_thr_copy_B: cute.TiledCopy,
):
    """acc += A B with A already in registers (O += P V: P never leaves the registers it was computed in)."""
    tCrB_view = smem_thr_copy_B.retile(tCrB)
    cute.copy(smem_thr_copy_B, tCsB[None, None, 0], tCrB_view[None, None, 0])
    num_k = cute.size(tCrA.shape[2])
    for k in cutlass.range_constexpr(num_k):
        if cutlass.const_expr(k < num_k - 1):
            cute.copy(smem_thr_copy_B, tCsB[None, None, k + 1], tCrB_view[None, None, k + 1])
        cute.gemm(tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
