"""Steps 3 and 6 on Hopper: warpgroup MMAs (wgmma.mma_async), 64 rows of the output per warpgroup.

S = Q K^T reads both operands from shared memory through descriptors; O += P V takes P from the registers that
held S (converted to 16 bits) and V^T from a transposed view of the V tile, so V is never copied. wgmma runs
asynchronously: ``gemm`` issues the k-steps and commits them as one group, and the caller waits for the group
with ``warpgroup.wait_group`` before it reads the accumulator, so softmax can run while the tensor cores work.
"""

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup


def make_tiled_mmas(dtype: type[cutlass.Numeric], block_n: int, head_dim: int) -> tuple[cute.TiledMma, cute.TiledMma]:
    """(Q K^T, P V) MMAs of one warpgroup: (64, block_n) scores from smem x smem, (64, head_dim) output from
    registers x smem (V is N-major: its rows are keys, its contiguous dim the head dim)."""
    qk = sm90_utils.make_trivial_tiled_mma(
        dtype, dtype, OperandMajorMode.K, OperandMajorMode.K, Float32, (1, 1, 1), (64, block_n)
    )
    pv = sm90_utils.make_trivial_tiled_mma(
        dtype,
        dtype,
        OperandMajorMode.K,
        OperandMajorMode.MN,
        Float32,
        (1, 1, 1),
        (64, head_dim),
        warpgroup.OperandSource.RMEM,
    )
    return qk, pv


def transpose_view(sX: cute.Tensor) -> cute.Tensor:
    """(rows, cols, stages) -> (cols, rows, stages) over the same (swizzled) bytes: V^T for the P V MMA."""
    return cute.make_tensor(sX.iterator, cute.select(sX.layout, mode=[1, 0, 2]))


@cute.jit
def gemm(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    tCrA: cute.Tensor,
    tCrB: cute.Tensor,
    zero_init: cutlass.Constexpr[bool],
    wait: cutlass.Constexpr[int],
):
    """acc (+)= A B over all k-steps, as one committed wgmma group; then wait until at most ``wait`` groups are
    in flight (-1: do not wait).

    The accumulate flag is set on a fresh MMA atom of the same op (one warpgroup's tiled MMA is one atom): set on
    the caller's object inside a run-time loop or branch, its value would escape that region.
    """
    mma = cute.make_mma_atom(tiled_mma.op)
    warpgroup.fence()
    mma.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for k in cutlass.range_constexpr(cute.size(tCrA.shape[2])):
        cute.gemm(mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
        mma.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()
    if cutlass.const_expr(wait >= 0):
        warpgroup.wait_group(wait)


@cute.jit
def store_probs(acc_S: cute.Tensor, tOrP: cute.Tensor):
    """P in 16 bits into the P V MMA's A fragment. With 64-row warpgroup tiles the accumulator's element order,
    ((2, 2, N/8), 1, 1), is the A fragment's ((2, 2, 2), 1, N/16), so a plain element-wise store converts it."""
    cute.make_tensor(tOrP.iterator, acc_S.layout).store(acc_S.load().to(tOrP.element_type))
