"""Step 7: O = U / l goes registers -> shared memory (reusing sQ) -> global memory; LSE goes straight out.

The accumulator layout scatters each thread's values over 8-row strips, which would make narrow, uncoalesced
global stores. Staging through shared memory lets every thread then read 16 contiguous bytes of one row and write
them with one 128-bit store, neighbouring threads covering neighbouring bytes of the row.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from flashcute.kernels.common.copy import head_dim_predicate
from flashcute.kernels.common.layout import acc_rows_cols, converted


@cute.jit
def store_o(
    acc_O: cute.Tensor,
    sO: cute.Tensor,
    gO: cute.Tensor,
    tiled_mma: cute.TiledMma,
    gmem_tiled_copy_O: cute.TiledCopy,
    tidx: Int32,
    rows_left: Int32,
    head_dim: Int32,
    check_head_dim: cutlass.Constexpr[bool],
    barrier_threads: cutlass.Constexpr[int] = 0,
    barrier_id: cutlass.Constexpr[int] = 0,
    sO_acc: cute.Tensor | None = None,
):
    """Write the (block_m, head_dim) tile of O; rows ``>= rows_left`` and columns ``>= head_dim`` stay unwritten.
    ``sO_acc``: the view of sO's bytes that ``tiled_mma``'s accumulator tiles (sO transposed where it holds O^T).

    The caller has synchronised the threads that write, so nobody still reads the shared memory under sO. Between
    the shared-memory writes and reads, the whole thread block meets at a barrier, or with ``barrier_threads`` only
    that many threads (a warp-specialized kernel's consumers) at named barrier ``barrier_id``.
    """
    rO = converted(acc_O, sO.element_type)
    smem_copy_atom_O = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), sO.element_type)
    smem_thr_copy_O = cute.make_tiled_copy_C(smem_copy_atom_O, tiled_mma).get_slice(tidx)
    sO_regs = sO if cutlass.const_expr(sO_acc is None) else sO_acc
    cute.copy(smem_thr_copy_O, smem_thr_copy_O.retile(rO), smem_thr_copy_O.partition_D(sO_regs))
    if cutlass.const_expr(barrier_threads == 0):
        cute.arch.sync_threads()
    else:
        cute.arch.barrier(barrier_id=barrier_id, number_of_threads=barrier_threads)

    gmem_thr_copy_O = gmem_tiled_copy_O.get_slice(tidx)
    tOsO = gmem_thr_copy_O.partition_S(sO)
    tOrO = cute.make_fragment_like(tOsO, sO.element_type)
    cute.autovec_copy(tOsO, tOrO)
    tOgO = gmem_thr_copy_O.partition_D(gO)
    coords = cute.make_identity_tensor(gO.shape)
    tOcO = gmem_thr_copy_O.partition_S(coords)
    t0OcO = gmem_tiled_copy_O.get_slice(0).partition_S(coords)
    pred_k = head_dim_predicate(tOcO, head_dim)
    limit = rows_left - tOcO[0][0]
    for m in cutlass.range_constexpr(cute.size(tOrO.shape[1])):
        if t0OcO[0, m, 0][0] < limit:
            cute.copy(
                gmem_tiled_copy_O,
                tOrO[None, m, None],
                tOgO[None, m, None],
                pred=pred_k[None, m, None] if cutlass.const_expr(check_head_dim) else None,
            )


@cute.jit
def store_lse(
    lse: cute.Tensor,
    gLSE: cute.Tensor,
    thr_mma: cute.TiledMma,
    tile_shape_o: cutlass.Constexpr[tuple],
    rows_left: Int32,
):
    """Write LSE (float32, natural log) for this tile's rows; lane 0 of each quad owns its rows' values.

    ``tile_shape_o`` is the (block_m, head_dim_padded) shape of acc_O, whose row order ``lse`` follows.
    """
    coords = acc_rows_cols(thr_mma.partition_C(cute.make_identity_tensor(tile_shape_o)))
    if coords[0, 0][1] == 0:
        for r in cutlass.range_constexpr(cute.size(lse)):
            row = coords[r, 0][0]
            if row < rows_left:
                gLSE[row] = Float32(lse[r])
