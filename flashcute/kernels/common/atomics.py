"""The backward's dQ: each thread block adds its K/V tile's part of a dQ tile into a float32 buffer in global memory
with reductions (red.global.add), so thread blocks of different K/V tiles never wait for each other."""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32


@cute.jit
def add_tile(
    acc: cute.Tensor,
    tXcX: cute.Tensor,
    gX: cute.Tensor,
    rows_left: Int32,
    head_dim: Int32,
    width: cutlass.Constexpr[int],
):
    """gX[coord] += acc for this thread's elements of a (rows, head_dim) float32 tile, ``width`` neighbouring
    columns per reduction (sm_90 has red.global.add.v2.f32; an accumulator holds pairs of neighbouring columns
    of a row, and head_dim % 8 == 0). ``tXcX`` holds the elements' (row, col); rows ``>= rows_left`` and columns
    ``>= head_dim`` are skipped."""
    for e in cutlass.range_constexpr(0, cute.size(acc), width):
        coord = tXcX[e]  # the first of `width` neighbouring columns
        value = acc[e]
        if cutlass.const_expr(width > 1):
            value = cute.make_tensor(acc.iterator + e, cute.make_layout(width)).load().ir_value()
        if coord[0] < rows_left and coord[1] < head_dim:
            ptr = gX.iterator + cute.crd2idx(coord, gX.layout)
            cute.arch.red(ptr, value, op="add", dtype=Float32, sem="relaxed", scope="gpu")
