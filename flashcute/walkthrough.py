"""`flashcute walkthrough`: the seed article's worked example, printed round by round from reference/tiled.py.

Nothing here is precomputed: every table is read from the trace of `tiled_attention`, the CPU model of the kernel.
Only the inputs are the article's (Fig. 2-4): Q = [[1,0],[0,1]], K = [[0,1],[1,0],[2,1],[0,2]],
V = [[1,0],[0,1],[1,1],[2,0]], softmax_scale = ln 2 (so exp(s x) = 2^x), two keys per K/V tile. With these the
arithmetic is exact and the tables are the article's fractions. Readers can pass their own inputs, sizes, tiles,
scale and mask; the trace is exact when it can be and float64 otherwise.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import torch

from flashcute.reference import BlockTrace, InexactError, RoundTrace, TiledResult, attention_ref, tiled_attention
from flashcute.reference.tiled import key_range

SEED_Q = "1,0;0,1"
SEED_K = "0,1;1,0;2,1;0,2"
SEED_V = "1,0;0,1;1,1;2,0"
SEED_BLOCK_N = 2
MATRIX_HELP = "rows separated by ';', entries by ',' (fractions like 1/2 allowed)"

# The seed article's figure showing each quantity. Keys ending in 0 are for round 0; the rest for later rounds.
FIGURES = {
    "S": "Fig. 5",
    "E0": "Fig. 6",
    "E": "Fig. 7",
    "l0": "Fig. 6",
    "l": "text after Fig. 7",
    "dU0": "Fig. 8",
    "dU": "Fig. 9",
    "U0": "Fig. 8",
    "U": "Fig. 10",
    "O": "Fig. 12",
}
MASKED_FIGURES = {"S": "Fig. 11"}
MASK_TITLES = {
    "none": "No mask (the article's main example)",
    "top_left": "Causal, top-left aligned: query i sees key j iff j <= i (the article's rule, Fig. 11)",
    "bottom_right": "Causal, bottom-right aligned: query i sees key j iff j <= i + seqlen_k - seqlen_q (flash_attn)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `flashcute walkthrough`."""
    parser.add_argument("--q", help=f"Q (seqlen_q x headdim), {MATRIX_HELP}; default: Fig. 2, {SEED_Q!r}")
    parser.add_argument("--k", help=f"K (seqlen_k x headdim), {MATRIX_HELP}; default: Fig. 3")
    parser.add_argument("--v", help=f"V (seqlen_k x headdim), {MATRIX_HELP}; default: Fig. 4")
    parser.add_argument("--random", type=int, metavar="SEED", help="random integer Q, K, V in [-2, 2] from SEED")
    parser.add_argument("--seqlen-q", type=int, default=2, help="queries, with --random (default 2)")
    parser.add_argument("--seqlen-k", type=int, default=4, help="keys, with --random (default 4)")
    parser.add_argument("--headdim", type=int, default=2, help="head dimension, with --random (default 2)")
    parser.add_argument("--block-m", type=int, help="queries per Q tile (default: all of them in one tile)")
    parser.add_argument("--block-n", type=int, default=SEED_BLOCK_N, help="keys per K/V tile (default 2)")
    parser.add_argument(
        "--causal",
        choices=tuple(MASK_TITLES),
        default="none",
        help="mask; with 'none' the top-left causal variant of the article's Fig. 11 follows (default none)",
    )
    parser.add_argument(
        "--scale",
        default="ln2",
        help="softmax_scale: a number, 'ln2' (exp(s x) = 2^x, the default) or 'default' (1/sqrt(headdim))",
    )


def run(args: argparse.Namespace) -> int:
    """Print the trace for the chosen inputs; return the exit status (2 for bad input)."""
    try:
        q, k, v = _inputs(args)
        softmax_scale = _parse_scale(args.scale)
        block_m = args.block_m if args.block_m is not None else q.shape[0]
        masks = [args.causal, "top_left"] if args.causal == "none" else [args.causal]
        runs = [_compute(q, k, v, softmax_scale, mask, block_m, args.block_n) for mask in masks]
    except ValueError as error:
        print(f"flashcute walkthrough: error: {error}", file=sys.stderr)
        return 2
    lines = _header(q, k, v, runs[0][0], block_m, args.block_n)
    for mask, (result, inexact_reason) in zip(masks, runs, strict=True):
        lines += _render_run(MASK_TITLES[mask], q, k, v, result, inexact_reason, args.block_n, masked=mask != "none")
    print("\n".join(lines))
    return 0


def summary() -> str:
    """The worked example's O and LSE as computed by the tiled reference (for `flashcute demo`)."""
    q, k, v = (_parse_matrix(text, name) for text, name in ((SEED_Q, "q"), (SEED_K, "k"), (SEED_V, "v")))
    result, _ = _compute(q, k, v, math.log(2), "none", q.shape[0], SEED_BLOCK_N)
    out = result.out[0, :, 0]
    return "\n".join(
        [
            "Seed worked example (2 queries, 4 keys, head dim 2, s = ln 2, two K/V tiles), tiled reference, exact:",
            f"  O   = [{', '.join('[' + ', '.join(map(_fmt, row)) + ']' for row in out)}]",
            f"  LSE = [{', '.join(_fmt_lse(result, i) for i in range(out.shape[0]))}]",
        ]
    )


# ---- inputs -------------------------------------------------------------------------------------------------


def _parse_matrix(text: str, name: str) -> np.ndarray:
    """'1,0;0,1' -> 2x2 object array of Fractions."""
    try:
        rows = [[Fraction(entry.strip()) for entry in row.split(",")] for row in text.split(";")]
    except ValueError:
        raise ValueError(f"--{name} must be a matrix, {MATRIX_HELP} (e.g. {SEED_Q!r}), got {text!r}") from None
    if len({len(row) for row in rows}) != 1:
        raise ValueError(f"--{name} rows must all have the same number of entries, got {text!r}")
    return np.array(rows, dtype=object)


def _inputs(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q (seqlen_q, headdim), K and V (seqlen_k, headdim) as Fraction arrays."""
    given = {name: getattr(args, name) for name in ("q", "k", "v")}
    if args.random is None:
        defaults = {"q": SEED_Q, "k": SEED_K, "v": SEED_V}
        return tuple(_parse_matrix(text or defaults[name], name) for name, text in given.items())
    if any(given.values()):
        raise ValueError(f"--random cannot be combined with --q/--k/--v, got --random {args.random}")
    for flag, size in (("--seqlen-q", args.seqlen_q), ("--seqlen-k", args.seqlen_k), ("--headdim", args.headdim)):
        if size < 1:
            raise ValueError(f"{flag} must be >= 1, got {size}")
    rng = np.random.default_rng(args.random)
    shapes = ((args.seqlen_q, args.headdim), (args.seqlen_k, args.headdim), (args.seqlen_k, args.headdim))
    return tuple(np.vectorize(Fraction, otypes=[object])(rng.integers(-2, 3, size=shape)) for shape in shapes)


def _parse_scale(text: str) -> float | None:
    if text.replace(" ", "") in ("ln2", "ln(2)"):
        return math.log(2)
    if text == "default":
        return None
    try:
        return float(Fraction(text))
    except ValueError:
        raise ValueError(f"--scale must be a number, 'ln2' or 'default', got {text!r}") from None


def _compute(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, softmax_scale: float | None, mask: str, block_m: int, block_n: int
) -> tuple[TiledResult, str | None]:
    """Run the tiled reference with a trace, exactly if possible; return (result, why not exact or None)."""
    q4, k4, v4 = (x[None, :, None, :] for x in (q, k, v))  # (batch=1, seqlen, nheads=1, headdim)
    options = {
        "softmax_scale": softmax_scale,
        "causal": mask != "none",
        "causal_align": "bottom_right" if mask == "none" else mask,
        "block_m": block_m,
        "block_n": block_n,
        "trace": True,
    }
    try:
        return tiled_attention(q4, k4, v4, exact=True, **options), None
    except InexactError as error:
        return tiled_attention(q4, k4, v4, exact=False, **options), str(error)


# ---- formatting ---------------------------------------------------------------------------------------------


def _fmt(x: object) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _fmt_lse(result: TiledResult, query_idx: int) -> str:
    """LSE of a query of the walkthrough's single (batch, head): 'ln 8' when exact, else the float."""
    if result.lse_arg is None:
        return _fmt(result.lse[0, 0, query_idx])
    arg = result.lse_arg[0, 0, query_idx]
    if arg == 0:
        return "-inf"
    return f"ln {arg}" if Fraction(arg).denominator == 1 else f"ln({arg})"


def _span(keys: Sequence[int]) -> str:
    return f"{keys[0]}..{keys[-1]}" if len(keys) > 1 else str(keys[0])


def _table(title: str, axes: str, row_labels: Sequence[int], col_labels: Sequence[int], values) -> list[str]:
    """A titled matrix with labelled rows and columns, right-aligned."""
    lines = [[axes, *map(str, col_labels)]]
    lines += [[str(r), *map(_fmt, row)] for r, row in zip(row_labels, values, strict=True)]
    widths = [max(len(line[c]) for line in lines) for c in range(len(lines[0]))]
    return [title] + ["    " + "  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)) for line in lines]


def _vector(title: str, values) -> str:
    return f"{title}: {', '.join(map(_fmt, values))}"


def _label(what: str, figures: dict[str, str], key: str, step: str, round_idx: int | None = None) -> str:
    """'what (Fig. N)  [step]', with the figure for round 0 (key + '0') when there is one and this is round 0."""
    figure = figures.get(f"{key}0" if round_idx == 0 and f"{key}0" in figures else key)
    return f"{what}{f' ({figure})' if figure else ''}  [{step}]"


# ---- the report ---------------------------------------------------------------------------------------------


def _header(q: np.ndarray, k: np.ndarray, v: np.ndarray, result: TiledResult, block_m: int, block_n: int) -> list[str]:
    scale = result.args.softmax_scale
    scale_text = f"{scale:.6g} = {result.scale_log2} * ln 2" if result.lse_arg is not None else f"{scale:.6g}"
    return [
        "flashcute walkthrough: one FlashAttention-2 forward, round by round (trace of reference/tiled.py)",
        "Figure numbers name the article's table of the same quantity; [step] names the kernel step producing it.",
        "",
        *_table("Q (Fig. 2)", "q\\d", range(q.shape[0]), range(q.shape[1]), q),
        *_table("K (Fig. 3)", "k\\d", range(k.shape[0]), range(k.shape[1]), k),
        *_table("V (Fig. 4)", "k\\d", range(v.shape[0]), range(v.shape[1]), v),
        f"softmax_scale s = {scale_text}; scale_log2 = s * log2(e) = {_fmt(result.scale_log2)}, "
        f"so exp(s x) = exp2(scale_log2 x)",
        f"block_m = {block_m} queries per Q tile, block_n = {block_n} keys per K/V tile",
    ]


def _render_run(
    title: str,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    result: TiledResult,
    inexact_reason: str | None,
    block_n: int,
    masked: bool,
) -> list[str]:
    arithmetic = "exact (Fractions)" if inexact_reason is None else f"float64 (not exact: {inexact_reason})"
    lines = ["", "=" * 80, title, f"arithmetic: {arithmetic}"]
    figures = MASKED_FIGURES if masked else FIGURES
    for block in result.trace:
        lines += _render_block(block, result, block_n, figures)
    return lines + _check(q, k, v, result)


def _render_block(block: BlockTrace, result: TiledResult, block_n: int, figures: dict[str, str]) -> list[str]:
    args = result.args
    visited = f"K/V tiles {list(block.visited)}" if block.visited else "no K/V tile (no query here sees any key)"
    skipped = [f"{n} (keys {_span(key_range(args, n, block_n))})" for n in block.skipped]
    skip_note = f"skips tile {', '.join(skipped)} whole: every key in it is masked" if skipped else "skips none"
    lines = [
        "",
        f"--- Q tile m_block = {block.m_block}: queries {_span(block.queries)} ---",
        f"n_block_range: visits {visited}; {skip_note}  [n_block_range]",
        *_full_scores(block, args.seqlen_k, figures),
    ]
    for round_idx, record in enumerate(block.rounds):
        lines += _render_round(round_idx, record, block.queries, args.headdim, figures)
    return lines + _render_finalize(block, result, figures)


def _full_scores(block: BlockTrace, seqlen_k: int, figures: dict[str, str]) -> list[str]:
    """S over every key, assembled from the rounds; keys of skipped tiles show as -inf (they are all masked)."""
    n_rows = len(block.queries)
    scores = np.full((n_rows, seqlen_k), -math.inf, dtype=object)
    for record in block.rounds:
        scores[:, record.keys.start : record.keys.stop] = record.acc_s[:n_rows, : len(record.keys)]
    what, step = "S = Q K^T, all keys", "gemm_qk"
    if any(record.masked for record in block.rounds):
        what, step = "S after apply_mask, all keys", "gemm_qk, apply_mask"
    if block.skipped:
        what += " (keys of skipped tiles shown as -inf)"
    title = _label(what, figures, "S", f"{step}, tile by tile in the rounds below")
    return _table(title, "q\\k", block.queries, range(seqlen_k), scores)


def _render_round(
    round_idx: int, record: RoundTrace, queries: range, headdim: int, figures: dict[str, str]
) -> list[str]:
    r, keys = round_idx, record.keys
    dims, n_rows = range(headdim), len(queries)  # tile rows past seqlen_q are not shown
    s_what, s_step = ("S tile after apply_mask", "gemm_qk, apply_mask") if record.masked else ("S tile", "gemm_qk")
    mask_note = (
        "apply_mask ran: this tile crosses the mask edge or the seqlen_k tail"
        if record.masked
        else "apply_mask not needed: every key of this tile is visible to every query of the Q tile"
    )
    alpha_note = "  (m was -inf: nothing to rescale yet)" if r == 0 else ""

    def matrix(what: str, key: str, step: str, values: np.ndarray, axes: str, cols: Sequence[int]) -> list[str]:
        return _table(_label(what, figures, key, step, r), axes, queries, cols, values[:n_rows, : len(cols)])

    return [
        "",
        f"round {r}: K/V tile n_block = {record.n_block}, keys {_span(keys)}",
        *matrix(f"{s_what}, keys {_span(keys)}", "S", s_step, record.acc_s, "q\\k", keys),
        mask_note,
        _vector(f"m{r} = max(m, rowmax S), raw score units  [online_softmax]", record.row_max[:n_rows]),
        _vector(f"alpha = exp2((m - m{r}) * scale_log2)  [online_softmax]", record.alpha[:n_rows]) + alpha_note,
        *matrix(f"E{r} = exp2(S * scale_log2 - m{r} * scale_log2)", "E", "online_softmax", record.acc_p, "q\\k", keys),
        _vector(_label(f"l{r} = alpha * l + rowsum E{r}", figures, "l", "online_softmax", r), record.row_sum[:n_rows]),
        *matrix(f"dU = E{r} V[keys {_span(keys)}]", "dU", "gemm_pv", record.d_acc_o, "q\\d", dims),
        *matrix(f"U{r} = alpha * U + dU", "U", "rescale_o, gemm_pv", record.acc_o, "q\\d", dims),
    ]


def _render_finalize(block: BlockTrace, result: TiledResult, figures: dict[str, str]) -> list[str]:
    queries = block.queries
    out = result.out[0, queries.start : queries.stop, 0]
    lse = [_fmt_lse(result, i) for i in queries]
    if result.lse_arg is not None:
        floats = ", ".join(f"{x:.4f}" for x in result.lse[0, 0, queries.start : queries.stop])
        lse_line = f"LSE = ln(2^(m * scale_log2) * l)  [finalize]: {', '.join(lse)}  (= {floats})"
    else:
        lse_line = f"LSE = (m * scale_log2 + log2 l) * ln 2  [finalize]: {', '.join(lse)}"
    return [
        "",
        "finalize",
        *_table(_label("O = U / l", figures, "O", "finalize"), "q\\d", queries, range(out.shape[1]), out),
        lse_line,
    ]


def _check(q: np.ndarray, k: np.ndarray, v: np.ndarray, result: TiledResult) -> list[str]:
    """Compare with attention_ref, the float64 specification (whole score matrix, no tiles)."""
    q4, k4, v4 = (torch.tensor(x.astype(np.float64))[None, :, None, :] for x in (q, k, v))
    a = result.args
    out_ref, lse_ref = attention_ref(
        q4, k4, v4, a.softmax_scale, a.causal, a.causal_align, (a.window_left, a.window_right), return_lse=True
    )
    out_diff = np.abs(result.out.astype(np.float64) - out_ref.numpy()).max()
    lse_diff = np.abs(np.where(result.lse == lse_ref.numpy(), 0.0, result.lse - lse_ref.numpy())).max()
    return [
        "",
        f"against attention_ref (float64, whole score matrix, no tiles): max |O - O_ref| = {out_diff:.2g}, "
        f"max |LSE - LSE_ref| = {lse_diff:.2g}",
    ]
