"""Step 3's ALiBi bias (MPT, BLOOM; flash_attn's alibi_slopes): the score of query i and key j gets
-slope * |i + diag_offset - j|, after the softcap and before the mask, the diagonal being the one the mask uses
(bottom-right: diag_offset = seqlen_k - seqlen_q of the sequence).

The kernels hold S in the units that the softmax's scale_log2 turns into exp2's: the score is S * scale_log2 /
log2(e) (softmax_scale * q.k, or softcap * t with a cap). So the bias enters S as the slope in S's units,
slope * log2(e) / scale_log2, one value per tile (``alibi_slope``), and each element takes two operations
(AttentionMask.apply_alibi): d = a_r - col_c with a_r = i + diag_offset - the thread's first column, computed once
per row, and col_c a compile-time column of thread 0's fragment, then S -= slope * |d| (an FADD, and an FFMA whose
operand takes the absolute value; any sign of slope). The bias is a constant of the call, so the backward recomputes
P with it and the gradients of S are as without it (the slopes get none, as in flash_attn).

The linear form (the Hopper forward's unmasked tiles, TileInfo.visit_runs' sides): on a tile wholly on one side of
the diagonal, side = +1 where every key j <= i + diag_offset and -1 where every j >= it, |a_r - col_c| = side *
(a_r - col_c), so S - slope * |d| = (S + side * slope * col_c) - side * slope * a_r: one FFMA an element (thread 0's
column an immediate) and a constant of the (thread, row), which the online softmax takes as the row's shift
(common/softmax.py) rather than adding it to every element.
"""

import cutlass.cute as cute
from cutlass import Float32, Int32

from flashcute.kernels.common.softmax import LOG2_E


def alibi_slope(mAlibi: cute.Tensor, batch_idx: Int32, head_idx: Int32, scale_log2: Float32) -> Float32:
    """The slope of (sequence ``batch_idx``, query head ``head_idx``) from the (batch, nheads) float32 slopes, in
    the units of the kernel's S (by the reciprocal's approximation, 1 ulp: an exact division calls a slow path that
    makes kernels at their register limit spill around the call)."""
    return mAlibi[batch_idx, head_idx] * (cute.arch.rcp_approx(scale_log2) * LOG2_E)


def biased(s: Float32, row_term: Float32, slope: Float32, col: int) -> Float32:
    """s - slope * |row_term - col|: one element's ALiBi bias, row_term = i + diag_offset - the thread's first
    column and ``col`` thread 0's column."""
    return s - slope * cute.math.absf(row_term - Float32(col))


def linear_bias(s: Float32, side_slope: Float32, col: int) -> Float32:
    """s + side_slope * col: the linear form's part of one element (``col`` thread 0's column, side_slope = side *
    slope)."""
    return s + side_slope * Float32(col)
