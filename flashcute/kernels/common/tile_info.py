"""Step 1 (tile selection) and step 4's tile skipping: which K/V tiles a Q tile visits, and which need masks.

Query row i sees key j iff j < seqlen_k and, when the mask is on,
    j <= i + diag_offset + window_right        (mask_right: causal is window_right = 0)
    j >= i + diag_offset - window_left         (mask_left: sliding window)
with diag_offset = seqlen_k - seqlen_q for the bottom-right alignment (flash_attn's causal) and 0 for the seed's
top-left rule. The main loop walks K/V tiles from the last one down to the first and splits them in three runs:
tiles that cross the right boundary or the seqlen_k tail (masked), tiles wholly inside every row's window (no
mask), tiles that cross the left boundary (masked). Tiles outside [n_block_min, n_block_max) are never loaded.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32


class TileInfo:
    """Tile bounds for one Q tile, computed once per thread block.

    Plain Python arithmetic (branches only on the compile-time mask flags): inside a kernel the sizes are Int32
    values and this traces into device code; given Python ints it runs on the CPU, which is how
    tests/test_tile_info.py holds this very code to the spec's visibility mask.
    """

    def __init__(
        self,
        block_m: int,
        block_n: int,
        mask_right: bool,
        mask_left: bool,
        seqlen_q: Int32,
        seqlen_k: Int32,
        diag_offset: Int32,
        window_left: Int32,
        window_right: Int32,
    ):
        self.block_m = block_m
        self.block_n = block_n
        self.mask_right = mask_right
        self.mask_left = mask_left
        self.seqlen_q = seqlen_q
        self.seqlen_k = seqlen_k
        self.diag_offset = diag_offset
        self.window_left = window_left
        self.window_right = window_right

    @classmethod
    def of(cls, config, seqlen_q: Int32, seqlen_k: Int32, diag_offset: Int32, window_left: Int32, window_right: Int32):
        """The bounds for a kernel configured by ``config`` (its block_m, block_n and mask flags) and one call's
        sizes and window."""
        return cls(
            config.block_m,
            config.block_n,
            config.mask_right,
            config.mask_left,
            seqlen_q,
            seqlen_k,
            diag_offset,
            window_left,
            window_right,
        )

    def n_block_range(self, m_block: Int32):
        """(n_block_min, n_block_max): the K/V tiles that hold at least one key some row of this tile sees."""
        n_block_max = cute.ceil_div(self.seqlen_k, self.block_n)
        if cutlass.const_expr(self.mask_right):
            row_end = cutlass.min((m_block + 1) * self.block_m, self.seqlen_q)
            col_end = row_end + self.diag_offset + self.window_right
            n_block_max = cutlass.min(n_block_max, cute.ceil_div(cutlass.max(col_end, 0), self.block_n))
        n_block_min = 0
        if cutlass.const_expr(self.mask_left):
            col_start = m_block * self.block_m + self.diag_offset - self.window_left
            n_block_min = cutlass.max(col_start, 0) // self.block_n
        return n_block_min, n_block_max

    def m_block_range(self, n_block: Int32):
        """(m_block_min, m_block_max): the Q tiles with at least one row that sees a key of K/V tile n_block.

        The backward pass walks this range for a fixed K/V tile; it is n_block_range read the other way round.
        """
        m_block_max = cute.ceil_div(self.seqlen_q, self.block_m)
        m_block_min = 0
        if cutlass.const_expr(self.mask_right):
            # the tile's first key n * block_n is seen by rows i >= n * block_n - offset - right
            first_row = n_block * self.block_n - self.diag_offset - self.window_right
            m_block_min = cutlass.max(first_row, 0) // self.block_m
        if cutlass.const_expr(self.mask_left):
            # the tile's last key is seen by rows i <= (n + 1) * block_n - 1 - offset + left
            last_row = (n_block + 1) * self.block_n - 1 - self.diag_offset + self.window_left
            m_block_max = cutlass.min(m_block_max, cute.ceil_div(cutlass.max(last_row + 1, 0), self.block_m))
        return m_block_min, m_block_max

    def masked_runs(self, m_block: Int32, n_block_min: Int32, n_block_max: Int32):
        """Split [n_block_min, n_block_max) into [min, left_end) masked, [left_end, right_start) free,
        [right_start, max) masked. The last tile visited first always gets the full mask (seqlen_k tail)."""
        right_start = cutlass.max(n_block_min, n_block_max - 1)
        if cutlass.const_expr(self.mask_right):
            # tile n needs no right mask iff its last key (n + 1) * block_n - 1 <= first row + offset + right
            first_free = cutlass.max(m_block * self.block_m + self.diag_offset + self.window_right + 1, 0)
            right_start = cutlass.max(n_block_min, cutlass.min(first_free // self.block_n, n_block_max - 1))
        left_end = n_block_min
        if cutlass.const_expr(self.mask_left):
            # tile n needs no left mask iff its first key n * block_n >= last row + offset - left
            row_last = cutlass.min((m_block + 1) * self.block_m, self.seqlen_q) - 1
            first_unmasked = cute.ceil_div(cutlass.max(row_last + self.diag_offset - self.window_left, 0), self.block_n)
            left_end = cutlass.max(n_block_min, cutlass.min(right_start, first_unmasked))
        return left_end, right_start

    def visit_runs(self, m_block: Int32, n_block_min: Int32, n_block_max: Int32, sides: bool = False) -> list[tuple]:
        """The Hopper forward's walk after its first tile (n_block_max - 1, masked): runs of (first n_block,
        count, masked, side, step), each walked from its first tile by step (+1 or -1) a tile. The free run comes
        first (mainloop says why), then the rest of the right-masked run and the left-masked run, each only when its
        mask is on (it is empty otherwise); all walk downwards but one.

        side is 0 but with ``sides`` (ALiBi's linear form, common/alibi.py), where free tiles wholly left of every
        row's diagonal key i + diag_offset (each key j <= it) take side +1 and those wholly right of it (j >= it)
        -1. Without a right mask the free run comes in three: across the diagonal (0), then right of it walked
        upwards, then left of it: each walk moves away from the diagonal, where the bias falls, so that the kept
        max rarely has to move (towards the diagonal, a steep slope raises a row's max by more than the lazy
        rescaling's threshold at every tile). With a right mask, the right-masked run starts where the free tiles
        stop being left of the diagonal (the same tiles as without sides unless window_right > 0), so that the walk
        has one free run, as without sides."""
        left_end, right_start = self.masked_runs(m_block, n_block_min, n_block_max)
        runs = [(right_start - 1, right_start - left_end, False, 0, -1)]
        if cutlass.const_expr(sides):
            first_row = m_block * self.block_m + self.diag_offset  # the diagonal's key in the tile's first row
            # tile n is left of it iff its last key (n + 1) * block_n - 1 <= first_row
            left_of = cutlass.min(cutlass.max(cutlass.max(first_row + 1, 0) // self.block_n, left_end), right_start)
            if cutlass.const_expr(self.mask_right):
                right_start = left_of
                runs = [(left_of - 1, left_of - left_end, False, 1, -1)]
            else:
                # and right of it iff its first key n * block_n >= the last row's diagonal key
                right_of = cute.ceil_div(cutlass.max(first_row + self.block_m - 1, 0), self.block_n)
                right_of = cutlass.min(cutlass.max(right_of, left_of), right_start)
                runs = [
                    (right_of - 1, right_of - left_of, False, 0, -1),
                    (right_of, right_start - right_of, False, -1, 1),
                    (left_of - 1, left_of - left_end, False, 1, -1),
                ]
        if cutlass.const_expr(self.mask_right):
            runs.append((n_block_max - 2, n_block_max - 1 - right_start, True, 0, -1))
        if cutlass.const_expr(self.mask_left):
            runs.append((left_end - 1, left_end - n_block_min, True, 0, -1))
        return runs

    def masked_m_runs(self, n_block: Int32, m_block_min: Int32, m_block_max: Int32):
        """The backward's split of [m_block_min, m_block_max) for K/V tile n_block: [min, free_start) masked,
        [free_start, free_end) free, [free_end, max) masked. With the seqlen_k tail in this K/V tile every Q tile
        is masked."""
        free_start, free_end = m_block_min, m_block_max
        if cutlass.const_expr(self.mask_right):
            # Q tile m needs no right mask iff its first row m * block_m sees the tile's last key
            last_key = (n_block + 1) * self.block_n - 1
            first_free = cute.ceil_div(cutlass.max(last_key - self.diag_offset - self.window_right, 0), self.block_m)
            free_start = cutlass.min(cutlass.max(m_block_min, first_free), m_block_max)
        if cutlass.const_expr(self.mask_left):
            # Q tile m needs no left mask iff its last row (m + 1) * block_m - 1 sees the tile's first key
            last_free_row = n_block * self.block_n - self.diag_offset + self.window_left
            last_free = cutlass.max(last_free_row + 1, 0) // self.block_m
            free_end = cutlass.max(free_start, cutlass.min(m_block_max, last_free))
        # the seqlen_k tail: all masked (tail is 1 if this K/V tile holds it, else 0)
        tail = cutlass.min(cutlass.max((n_block + 1) * self.block_n - self.seqlen_k, 0), 1)
        return cutlass.max(free_start, tail * m_block_max), cutlass.max(free_end, tail * m_block_max)
