"""Step 5: the online softmax, carried across K/V tiles as (row_max m, row_sum l) per query row.

For a new score tile S (already masked):
    m' = max(m, rowmax S)                  in-thread max over the row's columns, then across the 4-lane quad
    alpha = exp2((m - m') * scale_log2)    how much the old state shrinks; the caller rescales U by it
    E = exp2(S * scale_log2 - m' * scale_log2)
    l' = alpha * l + rowsum E              kept per thread; the quad sum is taken once, in finalize
scale_log2 = softmax_scale * log2(e), so exp2 stands for exp(scale * x) and log2(e) is folded in once on the host.
A row that has seen only -inf keeps m = -inf; it then exponentiates against 0 instead, so E = 0 and alpha = 0
rather than exp2(-inf - -inf) = NaN.

Lazy rescaling (``rescale_threshold`` t): a row keeps its old max m unless the new one exceeds it by more than t in
exp2's units, (m' - m) * scale_log2 > t; E is then taken against the kept m (each E at most 2^t, and l with it, so
O = U / l and LSE = scale * m + log l come out the same), and alpha is exactly 1. U's rescale is skipped in a warp
whose rows all kept their max, which after the first few K/V tiles is almost every step.

A ``shift`` (ALiBi's linear form, common/alibi.py): S holds each score less a constant of its (thread, row), so
that a bias linear in the key costs one operation an element; every step takes that constant, one value per row
of this thread, and m, l, alpha and E are those of the scores themselves: the row's max is max(S) + shift before
the quad's reduction, and E = exp2(S * scale_log2 - (m - shift) * scale_log2).
"""

import math

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int32

from flashcute.kernels.common.layout import acc_rows_cols, store_converted

LN2 = math.log(2.0)
LOG2_E = math.log2(math.e)
# Lazy rescaling keeps a row's max until it grows by more than this, in exp2's units: each E at most 2^8, far
# inside fp16 and bf16 (FlashAttention-4's threshold on Blackwell).
RESCALE_THRESHOLD = 8.0


def quad_reduce(value: Float32, op) -> Float32:
    """Reduce over the 4 lanes that share a row of an mma.sync accumulator (lanes 4q .. 4q+3)."""
    value = op(value, cute.arch.shuffle_sync_bfly(value, offset=2))
    return op(value, cute.arch.shuffle_sync_bfly(value, offset=1))


def row_reduce(row: cute.Tensor, op, init: Float32, chains: int) -> Float32:
    """op-reduce one row of a (rows, cols) fragment view into ``init``: with chains > 1 the columns are split
    over that many independent chains, combined pairwise at the end, so the dependent latency is cols / chains
    operations instead of cols (more registers live)."""
    n = cute.size(row.shape)
    if cutlass.const_expr(chains == 1 or n % chains != 0):
        return row.load().reduce(op, init, 0)
    combine = cute.arch.fmax if op == cute.ReductionOp.MAX else (lambda a, b: a + b)
    parts = [row[c] for c in range(chains)]
    for c in range(chains, n):
        parts[c % chains] = combine(parts[c % chains], row[c])
    while len(parts) > 1:
        parts = [combine(parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
    return combine(parts[0], init)


class OnlineSoftmax:
    """Per-thread softmax state for the rows this thread's accumulator fragment holds.

    ``chains`` > 1 splits each row's max into independent chains (see row_reduce), ``sum_chains`` its sum (default:
    as many): the Hopper kernel has the registers for it; the sm80 kernel, at its register limit, keeps one chain.
    ``rescale_threshold``: None rescales U at every update; a number t >= 0 keeps each row's max until it grows by
    more than t (lazy rescaling, above), and any_moved lets rescale_o skip the rescale where no row moved.

    Step 5 comes in three forms: online_softmax (every tile under a mask; the reference's step), and, with lazy
    rescaling on an unmasked tile, online_softmax_kept_max (E against the kept max straight into P) or
    online_softmax_in_place (E into S's registers, ahead of the previous tile's P V).
    """

    def __init__(
        self,
        scale_log2: Float32,
        num_rows: int,
        chains: int = 1,
        sum_chains: int | None = None,
        rescale_threshold: float | None = None,
    ):
        self.scale_log2 = scale_log2
        self.rescale_threshold = rescale_threshold
        self.chains = chains
        self.sum_chains = chains if sum_chains is None else sum_chains
        self.row_max = cute.make_rmem_tensor(num_rows, Float32)
        self.row_sum = cute.make_rmem_tensor(num_rows, Float32)
        self.reset()

    def reset(self):
        """The state before any K/V tile: m = -inf, l = 0."""
        self.row_max.fill(-Float32.inf)
        self.row_sum.fill(0.0)

    @cute.jit
    def online_softmax(self, acc_S: cute.Tensor, shift: list | None = None) -> cute.Tensor:
        """Step 5: replace scores by E in place, update (m, l); return alpha per row for rescale_o."""
        s = acc_rows_cols(acc_S)
        row_scale = cute.make_rmem_tensor(self.row_max.shape, Float32)
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            self.exp_row(s, row_scale, r, self.row_max_of(s, r, shift), shift)
        return row_scale

    @cute.jit
    def row_max_of(self, s: cute.Tensor, r: int, shift: list | None = None) -> Float32:
        """max(m, the row's scores) over the quad's columns."""
        if cutlass.const_expr(shift is None):
            row_max = row_reduce(s[r, None], cute.ReductionOp.MAX, self.row_max[r], self.chains)
        else:
            row_max = row_reduce(s[r, None], cute.ReductionOp.MAX, -Float32.inf, self.chains) + shift[r]
            row_max = cute.arch.fmax(row_max, self.row_max[r])
        return quad_reduce(row_max, cute.arch.fmax)

    @cute.jit
    def exp_row(self, s: cute.Tensor, row_scale: cute.Tensor, r: int, row_max_cur: Float32, shift: list | None = None):
        """Row r of the update against its new max: E in place of the scores, alpha into row_scale, (m, l)."""
        row_max_prev = self.row_max[r]
        if cutlass.const_expr(self.rescale_threshold is not None):
            # Keep the old max unless the row grew by more than the threshold; a first finite max always moves it
            # (inf > t), a row still at -inf stays there (NaN > t is false).
            grew = (row_max_cur - row_max_prev) * self.scale_log2 > self.rescale_threshold
            row_max_cur = row_max_cur if grew else row_max_prev
        row_max_safe = Float32(0.0) if row_max_cur == -Float32.inf else row_max_cur
        max_scaled = row_max_safe * self.scale_log2
        exp_scaled = (
            max_scaled if cutlass.const_expr(shift is None) else self.shifted(row_max_safe, shift, r) * self.scale_log2
        )
        exps = cute.math.exp2(s[r, None].load() * self.scale_log2 - exp_scaled, fastmath=True)
        row_scale[r] = cute.math.exp2(row_max_prev * self.scale_log2 - max_scaled, fastmath=True)
        s[r, None].store(exps)
        row_sum_new = row_reduce(s[r, None], cute.ReductionOp.ADD, Float32.zero, self.sum_chains)
        self.row_sum[r] = row_scale[r] * self.row_sum[r] + row_sum_new
        self.row_max[r] = row_max_cur

    @staticmethod
    def shifted(row_max: Float32, shift: list | None, r: int) -> Float32:
        """The max that S's row r is exponentiated against: m, less the row's shift where S holds one."""
        return row_max if cutlass.const_expr(shift is None) else row_max - shift[r]

    @cute.jit
    def rescale_o(self, acc_O: cute.Tensor, row_scale: cute.Tensor, moved: Boolean | None = None):
        """U *= alpha, row by row (also used by the epilogue with 1 / l); with ``moved`` (warp-uniform: a branch,
        see any_moved) only where it holds."""
        if cutlass.const_expr(moved is None):  # noqa: SIM114 (a compile-time test beside a run-time one)
            self.scale_rows(acc_O, row_scale)
        elif moved:
            self.scale_rows(acc_O, row_scale)

    @cute.jit
    def scale_rows(self, acc_O: cute.Tensor, row_scale: cute.Tensor):
        o = acc_rows_cols(acc_O)
        for r in cutlass.range_constexpr(cute.size(row_scale)):
            o[r, None].store(o[r, None].load() * row_scale[r])

    @cute.jit
    def any_moved(self, row_scale: cute.Tensor) -> Boolean | None:
        """After online_softmax with lazy rescaling: whether some row of this warp moved its max (alpha != 1), so
        rescale_o can skip the multiplies in a warp where none did; None (rescale unconditionally) without."""
        if cutlass.const_expr(self.rescale_threshold is None):
            return None
        moved = row_scale[0] != 1.0
        for r in cutlass.range_constexpr(1, cute.size(row_scale)):
            moved = moved | (row_scale[r] != 1.0)
        return cute.arch.vote_any_sync(moved)

    @cute.jit
    def online_softmax_kept_max(
        self,
        acc_S: cute.Tensor,
        acc_O: cute.Tensor,
        rP: cute.Tensor,
        empty_rows: cutlass.Constexpr[bool] = False,
        shift: list | None = None,
    ):
        """Step 5 with lazy rescaling without the row max, for an unmasked tile after the first: E = exp2(S *
        scale_log2 - m * scale_log2) against the kept max m straight away, P from E into ``rP`` (acc_S's layout, 16
        bits), and only then the check that the tile did not need a new max: every row's sum of this thread's E at most
        2^rescale_threshold (so each E is, too). A warp where some row fails takes the full update from S, which
        acc_S still holds (online_softmax: new max where it grew by more than the threshold, E and P again, U *= alpha).
        Otherwise l += the sums, alpha = 1 and U is left alone: no max, no shuffles and no multiplies of U on the
        common path, and the exponentials wait only for S.

        A row still at m = -inf (it has seen no key yet) fails the check (its E are inf or NaN), unless
        ``empty_rows``: such a row then takes E against 0, and keeps m = 0 if its sum of this thread's E lies
        within [1, 2^rescale_threshold] (l is 0, so alpha does not matter; O = U / l and LSE = scale * m + log l
        hold for any kept m, and a sum of at least 1 keeps P's fp16 rounding where a true max would put it). The
        Hopper kernel's masked walks need it: their first tile, on the diagonal, shows no key to up to block_m - 1
        rows, which reach the free run next."""
        s, p = acc_rows_cols(acc_S), acc_rows_cols(rP)
        bound = Float32(2.0**self.rescale_threshold)
        sums = []
        fine = Boolean(True)
        kept = []
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            kept.append(self.row_max[r])
            if cutlass.const_expr(empty_rows):
                kept[r] = Float32(0.0) if kept[r] == -Float32.inf else kept[r]
            max_scaled = self.shifted(kept[r], shift, r) * self.scale_log2
            exps = cute.math.exp2(s[r, None].load() * self.scale_log2 - max_scaled, fastmath=True)
            sums.append(exps.reduce(cute.ReductionOp.ADD, Float32.zero, 0))
            p[r, None].store(exps.to(rP.element_type))
            fine = fine & (sums[r] <= bound)
            if cutlass.const_expr(empty_rows):
                fine = fine & ((sums[r] >= 1.0) | (self.row_max[r] != -Float32.inf))
        if cute.arch.vote_any_sync(not fine):
            row_scale = self.online_softmax(acc_S, shift)
            self.rescale_o(acc_O, row_scale)
            store_converted(acc_S, rP)
        else:
            self.add_row_sums(sums, kept if empty_rows else None)

    @cute.jit
    def online_softmax_in_place(
        self, acc_S: cute.Tensor, row_scale: cute.Tensor, recompute, shift: list | None = None
    ) -> Boolean:
        """online_softmax_kept_max with E in place of S, so that it need not wait for the P V that still reads P:
        E = exp2(S * scale_log2 - m * scale_log2) against each row's kept max m (0 for a row still at -inf); the
        rows are fine when every row's sum of this thread's E is at most 2^rescale_threshold and, for a row still at
        -inf, at least 1. In a warp where every row was fine: l += the sums, m = the kept max (alpha = 1, U left
        alone). Otherwise (rare) move_kept_max puts E against a new max where a row needs one and writes alpha into
        ``row_scale``; the caller then owes rescale_o(..., moved), once the previous tile's P V is done. Returns
        ``moved``, whether it did (warp-uniform)."""
        s = acc_rows_cols(acc_S)
        bound = Float32(2.0**self.rescale_threshold)
        sums, kept = [], []
        fine = Boolean(True)
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            empty = self.row_max[r] == -Float32.inf
            kept.append(Float32(0.0) if empty else self.row_max[r])
            max_scaled = self.shifted(kept[r], shift, r) * self.scale_log2
            s[r, None].store(cute.math.exp2(s[r, None].load() * self.scale_log2 - max_scaled, fastmath=True))
            sums.append(row_reduce(s[r, None], cute.ReductionOp.ADD, Float32.zero, self.sum_chains))
            fine = fine & (sums[r] <= bound) & ((sums[r] >= 1.0) | (self.row_max[r] != -Float32.inf))
        moved = cute.arch.vote_any_sync(not fine)
        if moved:
            self.move_kept_max(acc_S, sums, kept, row_scale, recompute, shift)
        else:
            self.add_row_sums(sums, kept)
        return moved

    @cute.jit
    def move_kept_max(
        self, acc_S: cute.Tensor, sums: list, kept: list, row_scale: cute.Tensor, recompute, shift: list | None = None
    ):
        """The update of a warp that failed online_softmax_in_place's check, from E: a row whose largest E passed
        2^rescale_threshold, or a row still at -inf whose largest E is below 1, takes m' = m + log2(max E) /
        scale_log2, so its E (and l, and U through ``row_scale``) shrink by alpha = exp2((m - m') * scale_log2),
        in fp32, as exact as E against m' taken from S. Where E cannot say where the max went (E = inf: the scores
        jumped by 2^126 or more; the largest E below 2^-100 for a row at -inf; NaN) the warp gets S back from
        ``recompute()`` and takes the full update from it."""
        s = acc_rows_cols(acc_S)
        bound = Float32(2.0**self.rescale_threshold)
        inv_scale = cute.arch.rcp_approx(self.scale_log2)
        lost = Boolean(False)
        alphas, new_max = [], []
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            e_max = quad_reduce(row_reduce(s[r, None], cute.ReductionOp.MAX, Float32(0.0), self.chains), cute.arch.fmax)
            empty = self.row_max[r] == -Float32.inf
            moves = (e_max > bound) | (empty & (e_max < 1.0))
            readable = (e_max >= Float32(2.0**-100)) & (e_max <= Float32(2.0**126))
            lost = lost | (moves & (not readable))
            new_max.append(kept[r] + cute.math.log2(e_max, fastmath=True) * inv_scale if moves else kept[r])
            alphas.append(cute.math.exp2((kept[r] - new_max[r]) * self.scale_log2, fastmath=True))
        if cute.arch.vote_any_sync(lost):
            recompute()  # S again, in the frame of ``shift``
            row_scale.store(self.online_softmax(acc_S, shift).load())
        else:
            self.shift_rows(acc_S, sums, new_max, alphas, row_scale)

    @cute.jit
    def shift_rows(self, acc_S: cute.Tensor, sums: list, new_max: list, alphas: list, row_scale: cute.Tensor):
        """move_kept_max's update from E: E *= alpha, l = (l + this tile's sums) * alpha, m = the new max."""
        s = acc_rows_cols(acc_S)
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            s[r, None].store(s[r, None].load() * alphas[r])
            self.row_sum[r] = (self.row_sum[r] + sums[r]) * alphas[r]
            self.row_max[r] = new_max[r]
            row_scale[r] = alphas[r]

    @cute.jit
    def add_row_sums(self, sums: list, row_max: list | None = None):
        """l += this tile's sums, row by row (alpha = 1); m = ``row_max`` where given."""
        for r in cutlass.range_constexpr(cute.size(self.row_sum)):
            self.row_sum[r] = self.row_sum[r] + sums[r]
            if cutlass.const_expr(row_max is not None):
                self.row_max[r] = row_max[r]

    @cute.jit
    def finalize(self, sink: Float32 | None = None) -> tuple[cute.Tensor, cute.Tensor]:
        """Step 7's statistics: (the factor that turns U into O per row, LSE per row), the factor 1 / l. A row with
        l = 0 saw no key: O = 0, LSE = -inf.

        ``sink``: a learnable sink's logit, one more term exp(sink) in every row's denominator (the row's head's).
        It joins against the larger of the row's max and itself, so that a sink far above the scores cannot
        overflow: with s = sink * log2(e) and M = max(m * scale_log2, s), l' = l * 2^(m * scale_log2 - M) + 2^(s - M)
        and O = U * 2^(m * scale_log2 - M) / l', LSE = (M + log2 l') ln 2. A row that saw no key gets O = 0 and
        LSE = sink, exactly."""
        inv_sum = cute.make_rmem_tensor(self.row_sum.shape, Float32)
        lse = cute.make_rmem_tensor(self.row_sum.shape, Float32)
        add = lambda a, b: a + b  # noqa: E731
        for r in cutlass.range_constexpr(cute.size(self.row_sum)):
            row_sum = quad_reduce(self.row_sum[r], add)
            empty = row_sum == 0.0
            if cutlass.const_expr(sink is None):
                inv_sum[r] = Float32(0.0) if empty else cute.arch.rcp_approx(row_sum)
                log2_sum = cute.math.log2(row_sum, fastmath=True)
                lse[r] = -Float32.inf if empty else (self.row_max[r] * self.scale_log2 + log2_sum) * LN2
            else:
                # an empty row's m may be -inf: it takes the sink's (any m serves while l = 0)
                sink_log2 = sink * LOG2_E
                max_log2 = sink_log2 if empty else self.row_max[r] * self.scale_log2
                joint_max = cute.arch.fmax(max_log2, sink_log2)
                shrink = cute.math.exp2(max_log2 - joint_max, fastmath=True)
                joint_sum = row_sum * shrink + cute.math.exp2(sink_log2 - joint_max, fastmath=True)
                inv_sum[r] = Float32(0.0) if empty else shrink * cute.arch.rcp_approx(joint_sum)
                log2_sum = cute.math.log2(joint_sum, fastmath=True)
                lse[r] = sink if empty else (joint_max + log2_sum) * LN2
        return inv_sum, lse


@cute.jit
def recompute_probs(acc_S: cute.Tensor, lse_log2: cute.Tensor, scale_log2: Float32):
    """Backward step 5 in place: P = exp2(S * scale_log2 - LSE * log2(e)), the forward's probabilities again.

    ``lse_log2`` holds LSE * log2(e) per row of the fragment, +inf for rows that see no key (so P = 0 there).
    """
    s = acc_rows_cols(acc_S)
    for r in cutlass.range_constexpr(cute.size(lse_log2)):
        s[r, None].store(cute.math.exp2(s[r, None].load() * scale_log2 - lse_log2[r], fastmath=True))


@cute.jit
def column_stats(sStat: cute.Tensor, tScS: cute.Tensor) -> cute.Tensor:
    """The per-column statistic (LSE * log2 e, or D) of each column of an S^T fragment whose (row, col) view is
    ``tScS``, from the Q tile's (block_m,) shared-memory slice ``sStat`` into registers (read ahead of a wait, so
    that the loads' latency hides under the MMAs)."""
    vals = cute.make_rmem_tensor(cute.size(tScS, mode=[1]), Float32)
    for c in cutlass.range_constexpr(cute.size(vals)):
        vals[c] = sStat[tScS[0, c][1]]
    return vals


@cute.jit
def recompute_probs_t(acc_St: cute.Tensor, lse: cute.Tensor, tScS: cute.Tensor | None, scale_log2: Float32):
    """recompute_probs for S^T (rows are keys, columns are queries): P^T = exp2(S^T * scale_log2 - LSE * log2(e)).

    ``lse``: the Q tile's (block_m,) shared-memory slice of LSE * log2(e) read through the fragment's (row, col)
    view ``tScS``, or (``tScS`` None) column_stats of it; +inf for rows past seqlen_q and rows that see no key.
    """
    s = acc_rows_cols(acc_St)
    for c in cutlass.range_constexpr(cute.size(s.shape[1])):
        lse_log2 = lse[c] if tScS is None else lse[tScS[0, c][1]]
        for r in cutlass.range_constexpr(cute.size(s.shape[0])):
            s[r, c] = cute.math.exp2(s[r, c] * scale_log2 - lse_log2, fastmath=True)


@cute.jit
def softmax_grad_t(acc_Pt: cute.Tensor, acc_dPt: cute.Tensor, sD: cute.Tensor, tScS: cute.Tensor):
    """softmax_grad for S^T, in place in acc_dPt: dS^T = P^T * (dP^T - D), D per column from the Q tile's
    (block_m,) shared-memory slice (0 past seqlen_q)."""
    p_rc, dp_rc = acc_rows_cols(acc_Pt), acc_rows_cols(acc_dPt)
    for c in cutlass.range_constexpr(cute.size(p_rc.shape[1])):
        d = sD[tScS[0, c][1]]
        for r in cutlass.range_constexpr(cute.size(p_rc.shape[0])):
            dp_rc[r, c] = p_rc[r, c] * (dp_rc[r, c] - d)


@cute.jit
def load_row_stats(
    gLSE: cute.Tensor,
    gD: cute.Tensor,
    tScS: cute.Tensor,
    row_offset: Int32,
    seqlen_q: Int32,
):
    """Backward: (LSE * log2 e, D) for the rows of a score fragment whose (row, col) view is ``tScS``, from one
    (batch, head)'s (seqlen_q,) rows of LSE and D.

    Rows past seqlen_q, and rows that saw no key in the forward (LSE = -inf), get LSE * log2 e = +inf, so their
    recomputed P is 0; their D is 0.
    """
    lse_log2 = cute.make_rmem_tensor(cute.size(tScS, mode=[0]), Float32)
    d_row = cute.make_rmem_tensor(cute.size(tScS, mode=[0]), Float32)
    for r in cutlass.range_constexpr(cute.size(lse_log2)):
        row = row_offset + tScS[r, 0][0]
        lse_log2[r] = Float32.inf
        d_row[r] = Float32(0.0)
        if row < seqlen_q:
            lse = gLSE[row]
            lse_log2[r] = Float32.inf if lse == -Float32.inf else lse * LOG2_E
            d_row[r] = gD[row]
    return lse_log2, d_row


@cute.jit
def lse_log2_rows(sLSE: cute.Tensor, tScS: cute.Tensor, rows_left: Int32) -> cute.Tensor:
    """Backward: LSE * log2 e for the rows of a score fragment (``tScS`` its (row, col) view), read from a
    (block_m,) shared-memory tile. Rows ``>= rows_left`` (their LSE was never loaded) and rows that saw no key
    in the forward (LSE = -inf) get +inf, so their recomputed P is 0."""
    lse_log2 = cute.make_rmem_tensor(cute.size(tScS, mode=[0]), Float32)
    for r in cutlass.range_constexpr(cute.size(lse_log2)):
        row = tScS[r, 0][0]
        lse = sLSE[row]
        lse_log2[r] = Float32.inf if row >= rows_left or lse == -Float32.inf else lse * LOG2_E
    return lse_log2


@cute.jit
def d_rows(sD: cute.Tensor, tScS: cute.Tensor, rows_left: Int32) -> cute.Tensor:
    """Backward: D = rowsum(dO * O) for the rows of a score fragment, read from a (block_m,) shared-memory tile;
    0 for rows ``>= rows_left`` (never loaded)."""
    d_row = cute.make_rmem_tensor(cute.size(tScS, mode=[0]), Float32)
    for r in cutlass.range_constexpr(cute.size(d_row)):
        row = tScS[r, 0][0]
        d = sD[row]
        d_row[r] = Float32(0.0) if row >= rows_left else d
    return d_row


@cute.jit
def smem_rows(sX: cute.Tensor, tScS: cute.Tensor) -> cute.Tensor:
    """Backward: a (block_m,) shared-memory row statistic that the host padded (the Hopper backward's LSE * log2 e,
    +inf where P must be 0, or D, 0 there) at each row of a score fragment whose (row, col) view is ``tScS``."""
    rows = cute.make_rmem_tensor(cute.size(tScS, mode=[0]), Float32)
    for r in cutlass.range_constexpr(cute.size(rows)):
        rows[r] = sX[tScS[r, 0][0]]
    return rows


@cute.jit
def softmax_grad(acc_P: cute.Tensor, acc_dP: cute.Tensor, d_row: cute.Tensor):
    """Backward, in place in acc_dP: dS = P * (dP - D), D = rowsum(dO * O) per row."""
    p_rc, dp_rc = acc_rows_cols(acc_P), acc_rows_cols(acc_dP)
    for r in cutlass.range_constexpr(cute.size(d_row)):
        dp_rc[r, None].store(p_rc[r, None].load() * (dp_rc[r, None].load() - d_row[r]))
