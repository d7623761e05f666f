"""Step 4: set masked scores to -inf (only on the tiles TileInfo.masked_runs marks; the rest skip this); and step
3's ALiBi bias, which needs the same coordinates on every tile (kernels/common/alibi.py)."""

import copy

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from flashcute.kernels.common.alibi import biased, linear_bias
from flashcute.kernels.common.layout import acc_rows_cols
from flashcute.kernels.common.tile_info import TileInfo


class AttentionMask:
    """Masks one (block_m, block_n) score tile held in mma accumulator fragments.

    Each thread compares its columns as ``thread 0's column (a compile-time constant) < limit - own offset``:
    the fragment of every thread is thread 0's shifted by a fixed (row, col), so only the limit is computed at
    run time, once per row.

    By default the MMA covers the whole (block_m, block_n) tile. A Hopper consumer warpgroup covers only its
    ``mma_rows`` rows of it, starting ``row_offset`` rows into the tile.

    Each element is written through a select (``-inf if ... else s``), never under an ``if``: a run-time ``if``
    that writes a fragment element makes the DSL carry the whole fragment out of the branch, and ptxas then emits
    about 15 FSEL an element (sm90 d64 causal, 192-row tile: 996 FSEL and 14 spills in a masked main-loop step of
    1507 instructions, against 66 FSEL, no spills and 558 instructions with selects).
    """

    def __init__(
        self,
        tile_info: TileInfo,
        thr_mma: cute.TiledMma,
        thr0_mma: cute.TiledMma,
        mma_rows: int | None = None,
        row_offset: Int32 = 0,
    ):
        self.tile_info = tile_info
        self.row_offset = row_offset
        coords = cute.make_identity_tensor((mma_rows or tile_info.block_m, tile_info.block_n))
        self.tScS = acc_rows_cols(thr_mma.partition_C(coords))
        self.t0ScS = acc_rows_cols(thr0_mma.partition_C(coords))

    def with_tile_info(self, tile_info: TileInfo) -> "AttentionMask":
        """The same mask for another tile's bounds (a packed batch's sequences each have their own)."""
        other = copy.copy(self)
        other.tile_info = tile_info
        return other

    @cute.jit
    def apply_mask(self, acc_S: cute.Tensor, m_block: Int32, n_block: Int32, mask_rows: cutlass.Constexpr[bool]):
        """Mask keys past seqlen_k and, with ``mask_rows``, keys outside each row's causal/window range."""
        info = self.tile_info
        s = acc_rows_cols(acc_S)
        col_offset = n_block * info.block_n + self.tScS[0, 0][1]
        seqlen_limit = info.seqlen_k - col_offset
        for r in cutlass.range_constexpr(cute.size(s.shape[0])):
            hi = seqlen_limit
            lo = Int32(0)
            if cutlass.const_expr(mask_rows):
                row = m_block * info.block_m + self.row_offset + self.tScS[r, 0][0]
                if cutlass.const_expr(info.mask_right):
                    hi = cutlass.min(hi, row + info.diag_offset + info.window_right + 1 - col_offset)
                if cutlass.const_expr(info.mask_left):
                    lo = row + info.diag_offset - info.window_left - col_offset
            for c in cutlass.range_constexpr(cute.size(s.shape[1])):
                col = self.t0ScS[0, c][1]
                if cutlass.const_expr(mask_rows and info.mask_left):
                    s[r, c] = -Float32.inf if col >= hi or col < lo else s[r, c]
                else:
                    s[r, c] = -Float32.inf if col >= hi else s[r, c]

    @cute.jit
    def apply_alibi(self, acc_S: cute.Tensor, m_block: Int32, n_block: Int32, slope: Float32):
        """S -= slope * |i + diag_offset - j| in place (``slope`` in S's units: alibi.alibi_slope)."""
        info = self.tile_info
        s = acc_rows_cols(acc_S)
        col_offset = n_block * info.block_n + self.tScS[0, 0][1]
        for r in cutlass.range_constexpr(cute.size(s.shape[0])):
            row = m_block * info.block_m + self.row_offset + self.tScS[r, 0][0]
            row_term = Float32(row + info.diag_offset - col_offset)
            for c in cutlass.range_constexpr(cute.size(s.shape[1])):
                s[r, c] = biased(s[r, c], row_term, slope, self.t0ScS[0, c][1])

    @cute.jit
    def apply_alibi_on_side(
        self, acc_S: cute.Tensor, m_block: Int32, n_block: Int32, slope: Float32, side: cutlass.Constexpr[int]
    ) -> list:
        """apply_alibi's linear form on a tile wholly on one ``side`` of the diagonal (+1: every key at or before
        its row's i + diag_offset, -1: at or after it; common/alibi.py): S += side * slope * thread 0's column in
        place, and the rest of the bias, -side * slope * (i + diag_offset - the thread's first column), returned per
        row of this thread: OnlineSoftmax's shift."""
        info = self.tile_info
        s = acc_rows_cols(acc_S)
        col_offset = n_block * info.block_n + self.tScS[0, 0][1]
        side_slope = slope if cutlass.const_expr(side > 0) else -slope
        shift = []
        for r in cutlass.range_constexpr(cute.size(s.shape[0])):
            row = m_block * info.block_m + self.row_offset + self.tScS[r, 0][0]
            shift.append(-side_slope * Float32(row + info.diag_offset - col_offset))
            for c in cutlass.range_constexpr(cute.size(s.shape[1])):
                s[r, c] = linear_bias(s[r, c], side_slope, self.t0ScS[0, c][1])
        return shift


class TransposedMask:
    """Masks one (block_n, block_m) tile of S^T (rows are keys, columns are queries), the Hopper backward's layout.

    As in AttentionMask, each thread compares thread 0's compile-time column with a limit computed once per row.
    Key rows past seqlen_k are masked whole.
    """

    def __init__(self, tile_info: TileInfo, thr_mma: cute.TiledMma, thr0_mma: cute.TiledMma):
        self.tile_info = tile_info
        coords = cute.make_identity_tensor((tile_info.block_n, tile_info.block_m))
        self.tScS = acc_rows_cols(thr_mma.partition_C(coords))
        self.t0ScS = acc_rows_cols(thr0_mma.partition_C(coords))

    @cute.jit
    def apply_mask(self, acc_St: cute.Tensor, m_block: Int32, n_block: Int32):
        """Mask keys past seqlen_k and queries that do not see a key (causal / window), in place."""
        info = self.tile_info
        s = acc_rows_cols(acc_St)
        col_offset = m_block * info.block_m + self.tScS[0, 0][1]
        for r in cutlass.range_constexpr(cute.size(s.shape[0])):
            key = n_block * info.block_n + self.tScS[r, 0][0]
            # query q sees the key iff key - offset - right <= q <= key - offset + left; as thread-0 columns:
            lo = Int32(0)
            if cutlass.const_expr(info.mask_right):
                lo = key - info.diag_offset - info.window_right - col_offset
            if key >= info.seqlen_k:
                lo = Int32(info.block_m)  # past every column: the whole row
            hi = key - info.diag_offset + info.window_left - col_offset
            for c in cutlass.range_constexpr(cute.size(s.shape[1])):
                col = self.t0ScS[0, c][1]
                if cutlass.const_expr(info.mask_left):
                    s[r, c] = -Float32.inf if col < lo or col > hi else s[r, c]
                else:
                    s[r, c] = -Float32.inf if col < lo else s[r, c]

    @cute.jit
    def apply_alibi(self, acc_St: cute.Tensor, m_block: Int32, n_block: Int32, slope: Float32):
        """S^T -= slope * |q + diag_offset - key| in place, rows keys and columns queries (``slope`` in S's units:
        alibi.alibi_slope)."""
        info = self.tile_info
        s = acc_rows_cols(acc_St)
        col_offset = m_block * info.block_m + self.tScS[0, 0][1]
        for r in cutlass.range_constexpr(cute.size(s.shape[0])):
            key = n_block * info.block_n + self.tScS[r, 0][0]
            # |q + offset - key| = |(key - offset - col_offset) - thread 0's column|
            row_term = Float32(key - info.diag_offset - col_offset)
            for c in cutlass.range_constexpr(cute.size(s.shape[1])):
                s[r, c] = biased(s[r, c], row_term, slope, self.t0ScS[0, c][1])
