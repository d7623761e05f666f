"""Step 2: global -> shared memory with 128-bit cp.async, predicated for partial tiles.

Rows past the sequence end are skipped with an ``if`` per row (one comparison a row, against a compile-time
coordinate); head-dim columns past the real head dim are predicated per 16-byte vector. A predicated-off cp.async
writes zeros (``src-size = 0``), which matters for two buffers: padded head-dim columns of Q and K must be zero so
that they add nothing to Q K^T, and V rows past seqlen_k must be zero because P is 0 there and 0 * NaN is NaN.
"""

from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

COPY_BITS = 128


def smem_layout_atom(dtype: type[cutlass.Numeric], head_dim_padded: int) -> cute.ComposedLayout:
    """A swizzled (8, 64) or (8, 32) shared-memory atom: ldmatrix of 8 rows then hits 8 different bank groups."""
    block_k = 64 if head_dim_padded % 64 == 0 else 32
    swizzle_bits = 3 if block_k == 64 else 2
    return cute.make_composed_layout(
        cute.make_swizzle(swizzle_bits, 3, 3), 0, cute.make_layout((8, block_k), stride=(block_k, 1))
    )


def make_gmem_tiled_copy(
    dtype: type[cutlass.Numeric],
    head_dim_padded: int,
    num_threads: int,
    is_async: bool,
    values_per_thread: int | None = None,
) -> cute.TiledCopy:
    """Threads laid out row-major over a (rows, head_dim) tile, 16 bytes per thread per copy.

    ``is_async`` picks cp.async (loads into shared memory) or a plain vectorised copy (stores of O).
    ``values_per_thread`` contiguous values of a row go to each thread per pass (default: one 16-byte vector),
    in as many 16-byte copies as they need: an fp32 copy with 8 puts every value on the same thread as a 16-bit
    copy of the same tile does, so a conversion between the two stays in registers.
    """
    elems = values_per_thread or COPY_BITS // dtype.width
    op = cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL) if is_async else cute.nvgpu.CopyUniversalOp()
    atom = cute.make_copy_atom(op, dtype, num_bits_per_copy=COPY_BITS)
    threads_per_row = smem_layout_atom(dtype, head_dim_padded).outer.shape[1] // elems
    thread_layout = cute.make_layout((num_threads // threads_per_row, threads_per_row), stride=(threads_per_row, 1))
    return cute.make_tiled_copy_tv(atom, thread_layout, cute.make_layout((1, elems)))


def make_row_stats_copy(rows: int) -> cute.TiledCopy:
    """A 4-byte cp.async per thread for threads 0 .. rows - 1 over a (rows,) fp32 tile (LSE, or D)."""
    atom = cute.make_copy_atom(cpasync.CopyG2SOp(), cutlass.Float32, num_bits_per_copy=32)
    return cute.make_tiled_copy_tv(atom, cute.make_layout(rows), cute.make_layout(1))


@cute.jit
def head_dim_predicate(tXcX: cute.Tensor, head_dim: cutlass.Int32) -> cute.Tensor:
    """Per-vector predicate over the head-dim mode of a partitioned (CPY, CPY_M, CPY_K) coordinate tensor.

    The M mode has stride 0: the predicate depends only on the column, so one register per column vector.
    """
    pred = cute.make_rmem_tensor(
        cute.make_layout(
            (cute.size(tXcX, mode=[0, 1]), cute.size(tXcX, mode=[1]), cute.size(tXcX, mode=[2])),
            stride=(cute.size(tXcX, mode=[2]), 0, 1),
        ),
        cutlass.Boolean,
    )
    for v in cutlass.range_constexpr(pred.shape[0]):
        for k in cutlass.range_constexpr(pred.shape[2]):
            pred[v, 0, k] = cute.elem_less(tXcX[(0, v), 0, k][1], head_dim)
    return pred


def tile_copy(
    tiled_copy: cute.TiledCopy, tile: tuple, head_dim: cutlass.Int32, check_head_dim: bool, tidx: cutlass.Int32
) -> SimpleNamespace:
    """What copy_rows needs to load one kind of (rows, head_dim) tile: the tiled copy, this thread's and thread 0's
    coordinates in a tile, the head-dim predicate and whether to apply it (fields tiled_copy, tXcX, t0XcX, tXpX,
    check_hdim)."""
    coords = cute.make_identity_tensor(tile)
    tXcX = tiled_copy.get_slice(tidx).partition_S(coords)
    return SimpleNamespace(
        tiled_copy=tiled_copy,
        tXcX=tXcX,
        t0XcX=tiled_copy.get_slice(0).partition_S(coords),
        tXpX=head_dim_predicate(tXcX, head_dim),
        check_hdim=check_head_dim,
    )


@cute.jit
def copy_rows(
    tiled_copy: cute.TiledCopy,
    src: cute.Tensor,
    dst: cute.Tensor,
    tXcX: cute.Tensor,
    t0XcX: cute.Tensor,
    pred_k: cute.Tensor,
    row_limit: cutlass.Int32,
    check_rows: cutlass.Constexpr[bool],
    check_head_dim: cutlass.Constexpr[bool],
    zero_fill_rows: cutlass.Constexpr[bool],
):
    """Copy a (CPY, CPY_M, CPY_K) partition, rows ``>= row_limit`` (tile-local) skipped or zero-filled.

    The row test compares thread 0's compile-time coordinate with ``row_limit - own_row_offset``, so the
    per-row comparison needs no register per row.
    """
    if cutlass.const_expr(not check_rows):
        cute.copy(tiled_copy, src, dst, pred=pred_k if cutlass.const_expr(check_head_dim) else None)
    else:
        limit = row_limit - tXcX[0][0]
        for m in cutlass.range_constexpr(cute.size(dst.shape[1])):
            if t0XcX[0, m, 0][0] < limit:
                cute.copy(
                    tiled_copy,
                    src[None, m, None],
                    dst[None, m, None],
                    pred=pred_k[None, m, None] if cutlass.const_expr(check_head_dim) else None,
                )
            elif cutlass.const_expr(zero_fill_rows):
                dst[None, m, None].fill(0)


@cute.jit
def zero_rows(tiled_copy: cute.TiledCopy, sX: cute.Tensor, first_row: cutlass.Int32, tidx: cutlass.Int32):
    """Zero rows ``first_row`` on of a (rows, cols) shared-memory tile, in ``tiled_copy``'s 16-byte vectors
    (make_gmem_tiled_copy's, not async, for the threads that take part; ``tidx`` among them).

    A TMA box of a packed sequence's last K/V tile runs past its keys into rows that are not its own: the next
    sequence's, or a cache's slots past its length, which may hold anything, NaN included. Masked scores make P 0
    there, but 0 * NaN is NaN in the MMAs that read those rows, so they go to 0 first (the cp.async loads of the
    sm80 kernels write zeros there in the first place)."""
    thr = tiled_copy.get_slice(tidx)
    tXsX = thr.partition_D(sX)
    tXcX = thr.partition_D(cute.make_identity_tensor(cute.product_each(sX.shape)))
    for m in cutlass.range_constexpr(cute.size(tXsX.shape[1])):
        if tXcX[0, m, 0][0] >= first_row:
            tXsX[None, m, None].fill(0)


def operand_copies(
    tiled_copy: cute.TiledCopy,
    tiled_copy_v: cute.TiledCopy,
    tiles: tuple,
    head_dims: tuple,
    check_head_dims: tuple,
    same_width: bool,
    tidx: cutlass.Int32,
) -> tuple:
    """The backward's tile_copy of Q, K, dO and V, each a (rows, width) tile of ``tiles`` (in that order): Q and K
    at q's head dim with ``tiled_copy``, dO and V at v's with ``tiled_copy_v``, or Q's and K's own where
    ``same_width`` (v's head dim is q's). ``head_dims`` and ``check_head_dims``: (q's, v's)."""
    copy_q, copy_k = (tile_copy(tiled_copy, tile, head_dims[0], check_head_dims[0], tidx) for tile in tiles[:2])
    if same_width:
        return copy_q, copy_k, copy_q, copy_k
    copy_do, copy_v = (tile_copy(tiled_copy_v, tile, head_dims[1], check_head_dims[1], tidx) for tile in tiles[2:])
    return copy_q, copy_k, copy_do, copy_v


@cute.jit
def load_tile(copy: SimpleNamespace, gmem: cute.Tensor, smem: cute.Tensor, row_limit: cutlass.Int32, tidx):
    """copy_rows of one (rows, head_dim) tile with ``copy`` (tile_copy's), rows ``>= row_limit`` zero-filled."""
    thr_copy = copy.tiled_copy.get_slice(tidx)
    copy_rows(
        copy.tiled_copy,
        thr_copy.partition_S(gmem),
        thr_copy.partition_D(smem),
        copy.tXcX,
        copy.t0XcX,
        copy.tXpX,
        row_limit,
        True,
        copy.check_hdim,
        True,
    )
