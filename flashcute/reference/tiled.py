"""The FlashAttention-2 forward on the CPU, one thread block (CTA) at a time, with the GPU kernel's step names.

One CTA owns one tile of block_m query rows of one (batch, head) and walks the K/V tiles of block_n keys that this
Q tile can see, keeping a running row max m, row sum l and output numerator U (the seed article's Table 2):

    q_tile = load_tile(q, m_block)                        Q stays resident (shared memory on the GPU)
    for n_block in n_block_range(...):                    K/V tiles wholly masked for this Q tile are skipped
        acc_s = gemm_qk(q_tile, k_tile)                   S = Q K^T, raw scores (the scale comes later)
        acc_s = apply_softcap(acc_s, ...)                 only when softcap > 0
        acc_s = apply_alibi(acc_s, ...)                   only with alibi_slopes: the bias -slope * |i + offset - j|
        acc_s = apply_mask(acc_s, ...)                    only on tiles crossing the mask edge or the seqlen_k tail
        acc_p, alpha, state = online_softmax(state, acc_s, scale_log2)
        acc_o = rescale_o(acc_o, alpha)                   U *= alpha
        acc_o = gemm_pv(acc_o, acc_p, v_tile)             U += E V
    out, lse = finalize(state, acc_o, scale_log2, sink)   O = U / l, LSE; a learnable sink joins l here

Like the GPU kernel it works in the exp2 domain, exp(s * x) = exp2(scale_log2 * x) with scale_log2 = s * log2(e),
and it loads whole tiles with zero-filled rows past the end of Q, K and V (so tail tiles are masked, not trimmed).

Two number systems run through the same code:
  * float64 (default): numpy float64 arrays.
  * exact (exact=True): numpy object arrays of `fractions.Fraction`, every intermediate exact. exp2 of an integer is
    an exact power of two, so exact mode needs every exp2 argument to be an integer: scale_log2 must be rational
    (softmax_scale a rational multiple of ln 2, e.g. math.log(2), which gives scale_log2 = 1) and scale_log2 times
    each score an integer (integer inputs with scale ln 2 are the seed's example). Anything else raises
    `InexactError`, as do softcap, learnable_sink and alibi_slopes (tanh, exp(sink) and exp(slope * distance) are
    irrational). Exact LSE is reported as lse_arg with LSE = ln(lse_arg) (e.g. ln 8), plus its float value.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from flashcute.reference.naive import alibi_distance, visibility_mask
from flashcute.validation import AttentionArgs, validate_attention_args, validate_tile_sizes

LN2 = math.log(2.0)
LOG2E = math.log2(math.e)


class InexactError(ValueError):
    """Exact mode met a number it cannot keep exact (an exp2 argument that is not an integer, tanh, NaN, ...)."""


@dataclass(frozen=True)
class SoftmaxState:
    """Online softmax state of a Q tile, one entry per query row: m (row_max, in acc_s units) and l (row_sum)."""

    row_max: np.ndarray  # (block_m,) -inf until the row has seen a visible key
    row_sum: np.ndarray  # (block_m,) sum of exp2(S * scale_log2 - m * scale_log2) over the keys seen so far


@dataclass(frozen=True)
class CtaOutput:
    """What one CTA's epilogue produces for its block_m rows (rows past seqlen_q included; the store drops them)."""

    out: np.ndarray  # (block_m, headdim) O = U / l
    lse: np.ndarray  # (block_m,) float64 LSE, natural log
    lse_arg: np.ndarray | None  # (block_m,) exact mode: Fractions with LSE = ln(lse_arg); None in float mode


@dataclass(frozen=True)
class RoundTrace:
    """One round of the main loop: one K/V tile against the Q tile. Arrays are whole tiles (padding included)."""

    n_block: int
    keys: range  # the keys of this tile that exist (< seqlen_k)
    masked: bool  # whether apply_mask ran on this tile
    acc_s: np.ndarray  # (block_m, block_n) S after gemm_qk, apply_softcap, apply_alibi and apply_mask
    row_max: np.ndarray  # (block_m,) m' after this round
    row_sum: np.ndarray  # (block_m,) l' after this round
    alpha: np.ndarray  # (block_m,) factor applied to the old l and U
    acc_p: np.ndarray  # (block_m, block_n) E, this round's unnormalized weights
    d_acc_o: np.ndarray  # (block_m, headdim) dU = E V, what gemm_pv added
    acc_o: np.ndarray  # (block_m, headdim) U after this round


@dataclass(frozen=True)
class BlockTrace:
    """Everything one CTA did: which K/V tiles it visited or skipped, and each round in order."""

    batch_idx: int
    head_idx: int
    m_block: int
    queries: range  # the query rows this CTA writes (< seqlen_q)
    visited: range  # n_block_range
    skipped: tuple[int, ...]  # K/V tiles never loaded because every key in them is masked for these queries
    rounds: list[RoundTrace]


@dataclass(frozen=True)
class TiledResult:
    """Output of `tiled_attention` (numpy arrays; Fractions in exact mode)."""

    out: np.ndarray  # (batch, seqlen_q, nheads, headdim)
    lse: np.ndarray  # (batch, nheads, seqlen_q) float64, natural log
    lse_arg: np.ndarray | None  # exact mode: (batch, nheads, seqlen_q) Fractions, LSE = ln(lse_arg); else None
    scale_log2: float | Fraction
    args: AttentionArgs
    trace: list[BlockTrace] | None  # per (batch, head, m_block), in that order; None unless trace=True


# ---- number systems -----------------------------------------------------------------------------------------


def _zeros(shape: int | tuple[int, ...], exact: bool) -> np.ndarray:
    return np.full(shape, Fraction(0), dtype=object) if exact else np.zeros(shape)


def _to_fraction(value: Any) -> Fraction:
    try:
        return Fraction(value)
    except (ValueError, OverflowError, TypeError) as error:
        raise InexactError(f"exact mode needs finite rational inputs, got {value!r}") from error


def _as_array(x: Any, exact: bool) -> np.ndarray:
    """x as a float64 array, or (exact) as an object array of Fractions; torch tensors are read on the CPU."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        x = x.tolist() if exact else x.double().numpy()
    if not exact:
        return np.asarray(x, dtype=np.float64)
    return np.vectorize(_to_fraction, otypes=[object])(np.asarray(x, dtype=object))


def _exact_exp2(x: Any) -> Fraction:
    if x == -math.inf:
        return Fraction(0)
    if isinstance(x, float) or Fraction(x).denominator != 1:
        raise InexactError(
            f"exact mode needs every exp2 argument (scale_log2 times a score difference or a row max) to be an "
            f"integer, got {x}; make scale_log2 times every score an integer (e.g. integer inputs with softmax_scale "
            f"= ln 2) or use exact=False"
        )
    return Fraction(2) ** int(x)


def exp2(x: np.ndarray) -> np.ndarray:
    """2**x elementwise: np.exp2 on float arrays; an exact power of two on Fraction arrays (exp2(-inf) = 0)."""
    if x.dtype != object:
        return np.exp2(x)
    return np.vectorize(_exact_exp2, otypes=[object])(x)


def resolve_scale_log2(args: AttentionArgs, exact: bool) -> float | Fraction:
    """The exponent scale of the exp2 domain: exp(s * x) = exp2(scale_log2 * x), scale_log2 = s * log2(e).

    With softcap the kernel's score is tanh(s * S / softcap) and softcap moves into the exponent, as in flash_attn:
    scale_log2 = softcap * log2(e). Exact mode needs scale_log2 rational, so softmax_scale must be a rational multiple
    of ln 2; it is recovered from the float as the nearest fraction with denominator <= 1000 (math.log(2) -> 1).
    """
    if exact and args.learnable_sink is not None:
        raise InexactError("exact mode cannot add learnable_sink (exp(sink) is irrational); use exact=False")
    if exact and args.alibi_slopes is not None:
        raise InexactError(
            "exact mode cannot apply alibi_slopes (exp(slope * distance) is irrational); use exact=False"
        )
    if args.softcap > 0:
        if exact:
            raise InexactError(f"exact mode cannot apply softcap={args.softcap} (tanh is irrational); use exact=False")
        return args.softcap * LOG2E
    if not exact:
        return args.softmax_scale * LOG2E
    ratio = Fraction(args.softmax_scale / LN2).limit_denominator(1000)
    if not math.isclose(float(ratio), args.softmax_scale / LN2, rel_tol=1e-12):
        raise InexactError(
            f"exact mode needs softmax_scale to be a rational multiple of ln 2 (e.g. math.log(2)), "
            f"got {args.softmax_scale!r}; use exact=False"
        )
    return ratio


# ---- the kernel's steps -------------------------------------------------------------------------------------


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def query_range(args: AttentionArgs, m_block: int, block_m: int) -> range:
    """The query rows of Q tile m_block that exist (< seqlen_q): the rows its epilogue stores."""
    return range(m_block * block_m, min((m_block + 1) * block_m, args.seqlen_q))


def key_range(args: AttentionArgs, n_block: int, block_n: int) -> range:
    """The keys of K/V tile n_block that exist (< seqlen_k)."""
    return range(n_block * block_n, min((n_block + 1) * block_n, args.seqlen_k))


def load_tile(x: np.ndarray, tile_idx: int, tile_size: int) -> np.ndarray:
    """Rows [tile_idx * tile_size, (tile_idx + 1) * tile_size) of x (seqlen, headdim), rows past the end zero-filled.

    The GPU's predicated cp.async zero-fills out-of-bounds rows too. It matters for V: a key past seqlen_k gets
    weight 0, and 0 times uninitialized memory could be NaN.
    """
    tile = _zeros((tile_size, x.shape[1]), exact=x.dtype == object)
    rows = x[tile_idx * tile_size : (tile_idx + 1) * tile_size]
    tile[: len(rows)] = rows
    return tile


def n_block_range(args: AttentionArgs, m_block: int, block_m: int, block_n: int) -> range:
    """The K/V tiles Q tile m_block must visit; every other tile is wholly masked and is skipped (never loaded).

    For the tile's rows i in query_range (rows past seqlen_q are computed but never stored, so they do not count),
    the first row sees keys from i + offset - window_left and the last row up to i + offset + window_right; a negative
    window side is unbounded, and causal is window_right = 0. A partial tile at the seqlen_k tail is visited (and
    masked). An empty range means no row of the tile sees any key.
    """
    queries = query_range(args, m_block, block_m)
    key_lo = 0 if args.window_left < 0 else max(0, queries[0] + args.diagonal_offset - args.window_left)
    key_hi = args.seqlen_k
    if args.window_right >= 0:
        key_hi = min(key_hi, queries[-1] + args.diagonal_offset + args.window_right + 1)
    if key_hi <= key_lo:
        return range(0)
    return range(key_lo // block_n, ceil_div(key_hi, block_n))


def tile_needs_mask(args: AttentionArgs, m_block: int, n_block: int, block_m: int, block_n: int) -> bool:
    """Does tile (m_block, n_block) hold a score that must be masked? Only those tiles pay for apply_mask.

    A tile is wholly visible when it ends inside seqlen_k, its last key is within the first row's right edge
    (i + offset + window_right) and its first key is within the last row's left edge (i + offset - window_left).
    With a causal mask that leaves the tiles on the diagonal; without one, only the partial tile at the seqlen_k tail.
    """
    queries = query_range(args, m_block, block_m)
    first_key, last_key = n_block * block_n, (n_block + 1) * block_n - 1
    crosses_tail = last_key >= args.seqlen_k
    crosses_right = args.window_right >= 0 and last_key > queries[0] + args.diagonal_offset + args.window_right
    crosses_left = args.window_left >= 0 and first_key < queries[-1] + args.diagonal_offset - args.window_left
    return crosses_tail or crosses_right or crosses_left


def gemm_qk(q_tile: np.ndarray, k_tile: np.ndarray) -> np.ndarray:
    """acc_s = Q_tile K_tile^T: (block_m, headdim) x (block_n, headdim) -> (block_m, block_n) raw scores.

    K is the B operand as stored, (key, dim): the GPU needs no transposed copy either.
    """
    return q_tile @ k_tile.T


def apply_softcap(acc_s: np.ndarray, args: AttentionArgs) -> np.ndarray:
    """acc_s = tanh(s * S / softcap): the softcapped score divided by softcap (softcap sits in scale_log2)."""
    return np.tanh(acc_s * (args.softmax_scale / args.softcap))


def score_unit(args: AttentionArgs) -> float:
    """c with score = c * acc_s after apply_softcap: softmax_scale, or softcap when the scores are capped (softcap
    moved into scale_log2 = c * log2(e)). A bias in score units enters acc_s divided by c."""
    return args.softcap if args.softcap > 0 else args.softmax_scale


def apply_alibi(acc_s: np.ndarray, args: AttentionArgs, m_block: int, n_block: int, slope: float) -> np.ndarray:
    """S -= (slope / c) * |i + offset - j|: the ALiBi bias -slope * |i + offset - j| of the score, in acc_s units
    (c = `score_unit`, as flash_attn's kernels divide the slope by their softmax scale), on every tile: unlike the
    mask it changes visible scores. Rows and keys past the ends get a bias too; the store drops those rows and
    apply_mask hides those keys, as the tail tile is always masked."""
    block_m, block_n = acc_s.shape
    rows = m_block * block_m + np.arange(block_m)
    cols = n_block * block_n + np.arange(block_n)
    return acc_s - (slope / score_unit(args)) * alibi_distance(args, rows, cols)


def apply_mask(acc_s: np.ndarray, args: AttentionArgs, m_block: int, n_block: int) -> np.ndarray:
    """Set the scores of keys a query may not see (future keys, keys outside the window, keys >= seqlen_k) to -inf.

    exp2(-inf) = 0, so masked keys then drop out of the online softmax and of U with no special case.
    """
    block_m, block_n = acc_s.shape
    rows = m_block * block_m + np.arange(block_m)
    cols = n_block * block_n + np.arange(block_n)
    return np.where(visibility_mask(args, rows, cols), acc_s, -math.inf)


def online_softmax(
    state: SoftmaxState, acc_s: np.ndarray, scale_log2: float | Fraction, rescale_threshold: float | None = None
) -> tuple[np.ndarray, np.ndarray, SoftmaxState]:
    """One round of the online softmax in the exp2 domain; returns (acc_p = E, alpha, new state).

        m'    = max(m, rowmax S)
        alpha = exp2((m - m') * scale_log2)                  moves the old l and U onto the new max
        E     = exp2(S * scale_log2 - m' * scale_log2)       this round's weights, not yet divided by l
        l'    = alpha * l + rowsum E

    While a row has seen no visible key, m' = -inf; the kernel then uses 0 for m' * scale_log2 so that the exponents
    are -inf (alpha = E = 0) rather than -inf - (-inf) = NaN.

    Lazy rescaling (``rescale_threshold`` t, as the kernel's FwdConfig.rescale_threshold): a row keeps m unless
    (m' - m) * scale_log2 > t, so alpha = 1 and U needs no rescale; E is then at most 2^t, and U / l and the LSE come
    out the same. (The kernels reach the same values in another order on unmasked tiles: E against the kept m first,
    the row max only where a row's sum of E passed 2^t: softmax.online_softmax_kept_max. The Hopper kernel's masked
    walks may also keep m = 0 for a row that reaches such a tile still at -inf, where its E against 0 are not too
    small or too large; l is 0 there, so U / l and the LSE come out the same for that m too.)
    """
    row_max = np.maximum(state.row_max, acc_s.max(axis=1))
    if rescale_threshold is not None:
        with np.errstate(invalid="ignore"):  # a row still at -inf: -inf - (-inf) = NaN, not > t, keeps -inf
            grew = (row_max - state.row_max) * scale_log2 > rescale_threshold
        row_max = np.where(grew, row_max, state.row_max)
    max_scaled = np.where(row_max == -math.inf, 0, row_max * scale_log2)
    alpha = exp2(state.row_max * scale_log2 - max_scaled)
    acc_p = exp2(acc_s * scale_log2 - max_scaled[:, None])
    row_sum = alpha * state.row_sum + acc_p.sum(axis=1)
    return acc_p, alpha, SoftmaxState(row_max=row_max, row_sum=row_sum)


def rescale_o(acc_o: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """U = alpha * U: the output numerator follows the row max, with the same alpha as l."""
    return acc_o * alpha[:, None]


def gemm_pv(acc_o: np.ndarray, acc_p: np.ndarray, v_tile: np.ndarray) -> np.ndarray:
    """U += E V: (block_m, block_n) x (block_n, headdim). On the GPU E is first rounded to fp16/bf16 in registers."""
    return acc_o + acc_p @ v_tile


def finalize(
    state: SoftmaxState, acc_o: np.ndarray, scale_log2: float | Fraction, sink: float | None = None
) -> CtaOutput:
    """Epilogue: O = U / l and LSE = (m * scale_log2 + log2 l) * ln 2 = ln(2^(m * scale_log2) * l).

    A learnable sink (the head's logit, in score units) first joins l as one more key whose row of V is zero: one
    more online_softmax round on a column of scores sink / c (c = scale_log2 / log2(e), so that its exponent is
    sink * log2(e)), U rescaled by its alpha. flash-attn-4's epilogue adds the same term exp2(sink * log2(e) -
    m * scale_log2) to l against the row max it holds (against sink * log2(e) for a row that saw no key); the round
    also moves the max when the sink is above it, so that the term cannot overflow.

    A row that saw no key gets O = 0 and LSE = sink (its only term), or without a sink (l = 0) LSE = -inf. Exact
    mode keeps lse_arg = 2^(m * scale_log2) * l.
    """
    if sink is not None:
        sink_scores = np.full((len(state.row_sum), 1), sink * LOG2E / scale_log2)
        _, alpha, state = online_softmax(state, sink_scores, scale_log2)
        acc_o = rescale_o(acc_o, alpha)
    no_key = state.row_sum == 0
    out = np.where(no_key[:, None], 0, acc_o / np.where(no_key, 1, state.row_sum)[:, None])
    max_scaled = state.row_max * scale_log2
    if acc_o.dtype != object:
        with np.errstate(divide="ignore"):  # log2(0) = -inf for a row that saw no key
            return CtaOutput(out=out, lse=(max_scaled + np.log2(state.row_sum)) * LN2, lse_arg=None)
    lse_arg = exp2(max_scaled) * state.row_sum
    lse = np.array([math.log(arg) if arg > 0 else -math.inf for arg in lse_arg])
    return CtaOutput(out=out, lse=lse, lse_arg=lse_arg)


# ---- one CTA, and the grid ----------------------------------------------------------------------------------


def attention_cta(
    q_head: np.ndarray,
    k_head: np.ndarray,
    v_head: np.ndarray,
    args: AttentionArgs,
    m_block: int,
    block_m: int,
    block_n: int,
    scale_log2: float | Fraction,
    rounds: list[RoundTrace] | None = None,
    rescale_threshold: float | None = None,
    alibi_slope: float | None = None,
    sink: float | None = None,
) -> CtaOutput:
    """One thread block: Q tile m_block of one head against every K/V tile it can see.

    Rounds go in increasing n_block, as in the seed article. The GPU kernel walks the same tiles from the last one
    down (so that the masked tiles come first); the online softmax gives the same result in any order (up to float
    rounding; exactly in exact mode).

    q_head: (seqlen_q, headdim); k_head, v_head: (seqlen_k, headdim) of the kv head this query head reads.
    Appends a RoundTrace per visited K/V tile to `rounds` when given. ``rescale_threshold``: online_softmax's.
    ``alibi_slope`` and ``sink``: this (batch, head)'s ALiBi slope and learnable sink, in score units, or None.
    """
    exact = q_head.dtype == object
    q_tile = load_tile(q_head, m_block, block_m)
    state = SoftmaxState(row_max=np.full(block_m, -math.inf, dtype=q_tile.dtype), row_sum=_zeros(block_m, exact))
    acc_o = _zeros((block_m, args.headdim_v), exact)
    for n_block in n_block_range(args, m_block, block_m, block_n):
        k_tile, v_tile = load_tile(k_head, n_block, block_n), load_tile(v_head, n_block, block_n)
        acc_s = gemm_qk(q_tile, k_tile)
        if args.softcap > 0:
            acc_s = apply_softcap(acc_s, args)
        if alibi_slope is not None:
            acc_s = apply_alibi(acc_s, args, m_block, n_block, alibi_slope)
        masked = tile_needs_mask(args, m_block, n_block, block_m, block_n)
        if masked:
            acc_s = apply_mask(acc_s, args, m_block, n_block)
        acc_p, alpha, state = online_softmax(state, acc_s, scale_log2, rescale_threshold)
        acc_o_rescaled = rescale_o(acc_o, alpha)
        acc_o = gemm_pv(acc_o_rescaled, acc_p, v_tile)
        if rounds is not None:
            keys = key_range(args, n_block, block_n)
            d_acc_o = acc_o - acc_o_rescaled
            rounds.append(
                RoundTrace(n_block, keys, masked, acc_s, state.row_max, state.row_sum, alpha, acc_p, d_acc_o, acc_o)
            )
    return finalize(state, acc_o, scale_log2, sink)


def tiled_attention(
    q: Any,
    k: Any,
    v: Any,
    softmax_scale: float | None = None,
    causal: bool = False,
    causal_align: str = "bottom_right",
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    block_m: int = 64,
    block_n: int = 64,
    exact: bool = False,
    trace: bool = False,
    rescale_threshold: float | None = None,
    learnable_sink: Any = None,
    alibi_slopes: Any = None,
) -> TiledResult:
    """Attention computed tile by tile, exactly as the forward kernel does, one CTA per (batch, head, m_block).

    Same arguments and layout as `attention_ref` (q: (batch, seqlen_q, nheads, headdim), k, v: (batch, seqlen_k,
    nheads_k, headdim), GQA), given as torch tensors, numpy arrays or (exact) arrays of ints/Fractions;
    learnable_sink (nheads,) and alibi_slopes (nheads,) or (batch, nheads) are torch tensors, as there.
    exact=True computes in Fractions (see the module docstring for when that is possible); trace=True records every
    round of every CTA; rescale_threshold (None, or t >= 0 in exp2 units) is the lazy rescaling of online_softmax.
    """
    args = validate_attention_args(
        q, k, v, softmax_scale, causal, causal_align, window_size, softcap, learnable_sink, alibi_slopes
    )
    validate_tile_sizes(block_m, block_n)
    scale_log2 = resolve_scale_log2(args, exact)
    q, k, v = (_as_array(x, exact) for x in (q, k, v))
    sinks = None if args.learnable_sink is None else _as_array(args.learnable_sink, exact=False)  # (nheads,)
    if args.alibi_slopes is not None:  # (batch, nheads); (nheads,) slopes serve every batch
        slopes = np.broadcast_to(_as_array(args.alibi_slopes, exact=False), (args.batch, args.nheads))
    out = _zeros((*q.shape[:-1], args.headdim_v), exact)
    lse = np.zeros((args.batch, args.nheads, args.seqlen_q))
    lse_arg = _zeros(lse.shape, exact) if exact else None
    traces: list[BlockTrace] | None = [] if trace else None
    grid = itertools.product(range(args.batch), range(args.nheads), range(ceil_div(args.seqlen_q, block_m)))
    for batch_idx, head_idx, m_block in grid:
        kv_head_idx = head_idx // args.qheads_per_kvhead
        rounds: list[RoundTrace] | None = [] if trace else None
        q_head, k_head, v_head = q[batch_idx, :, head_idx], k[batch_idx, :, kv_head_idx], v[batch_idx, :, kv_head_idx]
        variants = {
            "alibi_slope": None if args.alibi_slopes is None else float(slopes[batch_idx, head_idx]),
            "sink": None if sinks is None else float(sinks[head_idx]),
        }
        cta = attention_cta(
            q_head, k_head, v_head, args, m_block, block_m, block_n, scale_log2, rounds, rescale_threshold, **variants
        )
        queries = query_range(args, m_block, block_m)  # the epilogue stores only rows < seqlen_q
        rows, n_rows = slice(queries.start, queries.stop), len(queries)
        out[batch_idx, rows, head_idx] = cta.out[:n_rows]
        lse[batch_idx, head_idx, rows] = cta.lse[:n_rows]
        if exact:
            lse_arg[batch_idx, head_idx, rows] = cta.lse_arg[:n_rows]
        if trace:
            visited = n_block_range(args, m_block, block_m, block_n)
            skipped = tuple(n for n in range(ceil_div(args.seqlen_k, block_n)) if n not in visited)
            traces.append(BlockTrace(batch_idx, head_idx, m_block, queries, visited, skipped, rounds))
    return TiledResult(out=out, lse=lse, lse_arg=lse_arg, scale_log2=scale_log2, args=args, trace=traces)
