"""The specification: attention in float64, computed the obvious way (whole score matrix, no tiles)."""

from __future__ import annotations

import math
from typing import Any

import torch

from flashcute.validation import AttentionArgs, validate_attention_args, validate_varlen_args


def visibility_mask(args: AttentionArgs, rows: Any, cols: Any) -> Any:
    """visible[i, j]: may query rows[i] attend to key cols[j]?  Boolean, shape (len(rows), len(cols)).

    With offset = args.diagonal_offset, query i sees key j iff j < seqlen_k and
        (window_left < 0 or j >= i + offset - window_left) and (window_right < 0 or j <= i + offset + window_right).
    rows and cols are 1-D integer index arrays, torch or numpy (the tiled reference passes tile coordinates that
    may run past seqlen_q / seqlen_k; keys past seqlen_k are never visible).
    """
    i, j = rows[:, None], cols[None, :]
    diagonal = i + args.diagonal_offset
    left_ok = (args.window_left < 0) | (j >= diagonal - args.window_left)
    right_ok = (args.window_right < 0) | (j <= diagonal + args.window_right)
    return left_ok & right_ok & (j < args.seqlen_k)


def alibi_distance(args: AttentionArgs, rows: Any, cols: Any) -> Any:
    """|i + offset - j|, shape (len(rows), len(cols)): how far key cols[j] lies from query rows[i]'s diagonal, the
    distance that ALiBi multiplies by -slope. offset = args.diagonal_offset, as in `visibility_mask` (flash_attn's
    bottom-right |i + seqlen_k - seqlen_q - j|, or |i - j| top-left). Torch or numpy index arrays, as there."""
    return abs(rows[:, None] + args.diagonal_offset - cols[None, :])


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    causal_align: str = "bottom_right",
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention in float64: the specification every kernel is tested against.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim); any float dtype, any device.
    Query head h reads kv head h // (nheads // nheads_k). For each batch b, head h and query i:

        score[i, j] = s * (q_i . k_j)                              s = softmax_scale, default 1/sqrt(headdim)
        score[i, j] = softcap * tanh(score[i, j] / softcap)        only if softcap > 0
        score[i, j] = score[i, j] - slope * |i + offset - j|       only with alibi_slopes (`alibi_distance`)
        score[i, j] = -inf                                         where key j is not visible (`visibility_mask`)
        LSE[i]      = log(exp(sink) + sum_j exp(score[i, j]))      natural log; exp(sink) only with learnable_sink
        O[i]        = sum_j exp(score[i, j] - LSE[i]) v_j          = softmax(score[i]) @ V without a sink

    learnable_sink (nheads,), any float dtype (flash-attn-4): sink = learnable_sink[h], a logit that joins every
    row's denominator and has no value row; it takes part in autograd (the sink's gradient). alibi_slopes (nheads,)
    or (batch, nheads) (flash_attn 2): slope = alibi_slopes[h] or [b, h], a constant (no gradient); offset =
    seqlen_k - seqlen_q for causal_align="bottom_right", 0 for "top_left", the diagonal the mask uses.

    A row that sees no key (every score -inf) has O = 0 and LSE = sink (-inf without a sink), never NaN. NaN and
    inf in the inputs flow through this float math unchanged; note O = P @ V is a matrix product, so 0 * NaN = NaN:
    a NaN in V reaches every query row of that (batch, head), even rows whose mask hides that key.

    Returns out (batch, seqlen_q, nheads, headdim) float64 on the input device, and with return_lse also
    lse (batch, nheads, seqlen_q) float64.
    """
    args = validate_attention_args(
        q, k, v, softmax_scale, causal, causal_align, window_size, softcap, learnable_sink, alibi_slopes
    )
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    scores, v = _masked_scores(q, k, v, args)
    with_sink = scores if args.learnable_sink is None else torch.cat((scores, _sink_column(scores, args)), dim=-1)
    # (batch, nheads, seqlen_q); -inf for a row with no key and no sink (or a sink of -inf), whose logsumexp is taken
    # of zeros instead, so that its gradient is 0 rather than NaN
    empty = (with_sink == -math.inf).all(dim=-1)
    lse = torch.logsumexp(with_sink.masked_fill(empty[..., None], 0.0), dim=-1).masked_fill(empty, -math.inf)
    probs = torch.exp(scores - lse.masked_fill(empty, 0.0)[..., None])  # such a row: exp(-inf) = 0
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v)
    return (out, lse) if return_lse else out


def attention_varlen_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    seqused_q: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`attention_ref` over a packed batch of variable-length sequences (flash_attn_varlen_func's layout), one
    sequence at a time: q (total_q, nheads, headdim), k and v (total_k, nheads_k, headdim), sequence b's rows
    cu_seqlens[b] .. cu_seqlens[b + 1], the first seqused[b] of them where given; each sequence's mask and ALiBi
    distances aligned bottom-right on its own lengths. learnable_sink (nheads,) joins every sequence's rows;
    alibi_slopes (batch, nheads) give sequence b the slopes alibi_slopes[b]. Rows outside every counted range get
    O = 0 and LSE = -inf; rows whose sequence has no key get O = 0 and LSE = the sink (-inf without one).
    Returns out (total_q, nheads, v's headdim) float64 and, with return_lse, lse (nheads, total_q) float64."""
    options = {"softmax_scale": softmax_scale, "causal": causal, "window_size": window_size, "softcap": softcap}
    totals = q.shape[0], k.shape[0]  # as max_seqlen_q and max_seqlen_k: the totals bound every sequence's length
    variants = {"learnable_sink": learnable_sink, "alibi_slopes": alibi_slopes}
    args = validate_varlen_args(
        q, k, v, cu_seqlens_q, cu_seqlens_k, *totals, seqused_q, seqused_k, **options, **variants
    )
    out = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=torch.float64, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), -math.inf, dtype=torch.float64, device=q.device)
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(starts_q) - 1):
        rows_q = starts_q[b + 1] - starts_q[b] if seqused_q is None else int(seqused_q[b])
        rows_k = starts_k[b + 1] - starts_k[b] if seqused_k is None else int(seqused_k[b])
        sq, sk = slice(starts_q[b], starts_q[b] + rows_q), slice(starts_k[b], starts_k[b] + rows_k)
        if rows_q == 0:
            continue
        if rows_k == 0:
            if args.learnable_sink is not None:
                lse[:, sq] = args.learnable_sink.to(torch.float64)[:, None]
            continue
        sequence = {"learnable_sink": args.learnable_sink, "alibi_slopes": sequence_slopes(args.alibi_slopes, b)}
        o, row_lse = attention_ref(q[None, sq], k[None, sk], v[None, sk], **options, **sequence, return_lse=True)
        out[sq], lse[:, sq] = o[0], row_lse[0]
    return (out, lse) if return_lse else out


def sequence_slopes(alibi_slopes: torch.Tensor | None, b: int) -> torch.Tensor | None:
    """The ALiBi slopes of sequence b alone, as `attention_ref` takes them for a batch of one: (1, nheads) rows of
    (batch, nheads) slopes; (nheads,) slopes serve every sequence as they are."""
    if alibi_slopes is None or alibi_slopes.dim() == 1:
        return alibi_slopes
    return alibi_slopes[b : b + 1]


def attention_same_precision(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    causal_align: str = "bottom_right",
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """The same-precision PyTorch baseline of design.md's error budget: `attention_ref`'s math by plain PyTorch
    ops in the inputs' own dtype (fp16/bf16 scores and softmax), with the same arguments and conventions.

    The ALiBi bias and the sink are rounded to the inputs' dtype, as a model holding them in that dtype would; the
    sink is one more column of the softmax, dropped after it. A kernel passes when its error against `attention_ref`
    is at most twice this function's error, plus a small atol. Returns out (batch, seqlen_q, nheads, headdim) in the
    input dtype; differentiable (the backward budget uses its gradients). A row that sees no key gets O = 0, as in
    the spec.
    """
    args = validate_attention_args(
        q, k, v, softmax_scale, causal, causal_align, window_size, softcap, learnable_sink, alibi_slopes
    )
    scores, v = _masked_scores(q, k, v, args)
    logits = scores if args.learnable_sink is None else torch.cat((scores, _sink_column(scores, args)), dim=-1)
    empty = (logits == -math.inf).all(dim=-1, keepdim=True)  # no key and no sink: softmax would give NaN
    probs = torch.softmax(logits.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    if args.learnable_sink is not None:
        probs = probs[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


def _masked_scores(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, args: AttentionArgs
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores (batch, nheads, seqlen_q, seqlen_k) after scale, softcap, ALiBi and mask (-inf), and V expanded for
    GQA."""
    k = k.repeat_interleave(args.qheads_per_kvhead, dim=2)
    v = v.repeat_interleave(args.qheads_per_kvhead, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * args.softmax_scale
    if args.softcap > 0:
        scores = args.softcap * torch.tanh(scores / args.softcap)
    rows = torch.arange(args.seqlen_q, device=q.device)
    cols = torch.arange(args.seqlen_k, device=q.device)
    if args.alibi_slopes is not None:
        slopes = args.alibi_slopes.detach().to(torch.float64).reshape(-1, args.nheads)[:, :, None, None]
        scores = scores - (slopes * alibi_distance(args, rows, cols)).to(scores.dtype)  # (batch or 1, nheads, ...)
    return scores.masked_fill(~visibility_mask(args, rows, cols), -math.inf), v


def _sink_column(scores: torch.Tensor, args: AttentionArgs) -> torch.Tensor:
    """learnable_sink as one more key column of ``scores`` (batch, nheads, seqlen_q, 1), in the scores' dtype: the
    sink of head h in every row of head h."""
    sink = args.learnable_sink.to(scores.dtype)[None, :, None, None]
    return sink.expand(*scores.shape[:-1], 1)
