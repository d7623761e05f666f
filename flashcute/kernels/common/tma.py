"""Step 2 on Hopper: whole tiles move between global and shared memory by TMA (cp.async.bulk.tensor).

One thread issues a copy of a (rows, head_dim) box described by a tensor map that the host builds per call from
the tensor's real sizes and strides. Rows past seqlen and columns past head_dim are zero-filled on loads and
dropped on stores, so tails and padded head dims need no predicates. Shared-memory tiles use the 128-, 64- or
32-byte swizzle that wgmma reads without bank conflicts, chosen from the head dim.
"""

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum


def smem_layout(
    dtype: type[cutlass.Numeric], rows: int, head_dim: int, stages: int, atom_cols: int | None = None
) -> cute.ComposedLayout:
    """A (rows, head_dim, stages) row-major swizzled shared-memory layout that wgmma and TMA both accept: the widest
    swizzle whose atom divides the head dim, or ``atom_cols`` where an MMA partitions the columns into parts of that
    width."""
    atom = warpgroup.make_smem_layout_atom(
        sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, atom_cols or head_dim), dtype
    )
    return cute.tile_to_shape(atom, (rows, head_dim, stages), (0, 1, 2))


def atom_columns(dtype: type[cutlass.Numeric], head_dim: int) -> int:
    """Columns of the swizzle atom that smem_layout tiles a (rows, head_dim) stage with (64 for 16-bit types at a
    head dim that 64 divides): a stage's rows of those columns lie together, one atom of 8 rows after another."""
    atom = sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, head_dim)
    return cute.size(warpgroup.make_smem_layout_atom(atom, dtype).outer, mode=[1])


def restaged(layout: cute.ComposedLayout, over: cute.ComposedLayout) -> cute.Layout:
    """``layout``'s outer (rows, head_dim, stages) layout with its stages as far apart as ``over``'s: a narrower
    tile kept in a wider one's shared memory, each stage at the start of the other's (O in Q's stages)."""
    stage_stride = cute.cosize(cute.select(over.outer, mode=[0, 1]))
    stages = cute.make_layout(cute.size(layout.outer, mode=[2]), stride=stage_stride)
    return cute.append(cute.select(layout.outer, mode=[0, 1]), stages)


def bshd_to_sdhb(t: cute.Tensor) -> cute.Tensor:
    """View a (batch, seqlen, heads, head_dim) tensor as (seqlen, head_dim, heads, batch), TMA's mode order."""
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 3, 2, 0]))


def make_tma(op, tensor: cute.Tensor, staged_layout: cute.ComposedLayout, rows: int, head_dim: int):
    """(copy atom, coordinate tensor) for (rows, head_dim) boxes of ``tensor`` into one stage of ``staged_layout``."""
    return cpasync.make_tiled_tma_atom(op, tensor, cute.select(staged_layout, mode=[0, 1]), (rows, head_dim))


@cute.jit
def partition_tiles(tma_atom: cute.CopyAtom, sX: cute.Tensor, mX: cute.Tensor, rows: int, head_dim: int):
    """(smem boxes per stage, gmem boxes per tile index) for the (seqlen, head_dim) slice ``mX``."""
    gX = cute.local_tile(mX, (rows, head_dim), (None, 0))
    return cpasync.tma_partition(
        tma_atom, 0, cute.make_layout(1), cute.group_modes(sX, 0, 2), cute.group_modes(gX, 0, 2)
    )


@cute.jit
def partition_boxes(tma_atom: cute.CopyAtom, sX: cute.Tensor, mX: cute.Tensor, rows: int, cols: int):
    """(smem boxes by (row box, column box, stage), gmem boxes by (row box, column box)) of (rows, cols) for the
    (seqlen, head_dim) slice ``mX``: a stage's rows loaded a box at a time, each from rows of its own (K and V in
    the pages of a cache). ``tma_atom`` copies one box: make_tma of smem_layout(dtype, rows, cols, 1), cols the
    atom's columns (atom_columns), so that each box lands in one stretch of the stage."""
    return cpasync.tma_partition(
        tma_atom, 0, cute.make_layout(1), cute.zipped_divide(sX, (rows, cols)), cute.zipped_divide(mX, (rows, cols))
    )


def tx_bytes(dtype: type[cutlass.Numeric], staged_layout: cute.ComposedLayout) -> int:
    """Bytes one stage receives, what the mbarrier of a TMA load waits for (zero-filled bytes count too)."""
    return cute.size_in_bytes(dtype, cute.select(staged_layout, mode=[0, 1]))
