"""The specification: attention in float64, computed the obvious way (whole score matrix, no tiles)."""

from __future__ import annotations

import math
from typing import Any

import torch

from flashcute.validation import AttentionArgs, validate_attention_args


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
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention in float64: the specification every kernel is tested against.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim); any float dtype, any device.
    Query head h reads kv head h // (nheads // nheads_k). For each batch, head and query i:

        score[i, j] = s * (q_i . k_j)                              s = softmax_scale, default 1/sqrt(headdim)
        score[i, j] = softcap * tanh(score[i, j] / softcap)        only if softcap > 0
        score[i, j] = -inf                                         where key j is not visible (`visibility_mask`)
        LSE[i]      = log(sum_j exp(score[i, j]))                  natural log
        O[i]        = sum_j exp(score[i, j] - LSE[i]) v_j          = softmax(score[i]) @ V

    A row that sees no key (every score -inf) has LSE = -inf and O = 0, never NaN. NaN and inf in the inputs flow
    through this float math unchanged; note O = P @ V is a matrix product, so 0 * NaN = NaN: a NaN in V reaches
    every query row of that (batch, head), even rows whose mask hides that key.

    Returns out (batch, seqlen_q, nheads, headdim) float64 on the input device, and with return_lse also
    lse (batch, nheads, seqlen_q) float64.
    """
    args = validate_attention_args(q, k, v, softmax_scale, causal, causal_align, window_size, softcap)
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    scores, v = _masked_scores(q, k, v, args)
    lse = torch.logsumexp(scores, dim=-1)  # (batch, nheads, seqlen_q); -inf for a row that sees no key
    probs = torch.exp(scores - lse.masked_fill(lse == -math.inf, 0.0)[..., None])  # such a row: exp(-inf) = 0
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
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`attention_ref` over a packed batch of variable-length sequences (flash_attn_varlen_func's layout), one
    sequence at a time: q (total_q, nheads, headdim), k and v (total_k, nheads_k, headdim), sequence b's rows
    cu_seqlens[b] .. cu_seqlens[b + 1], the first seqused[b] of them where given; each sequence's mask aligned
    bottom-right. Rows outside every counted range, and rows whose sequence has no key, get O = 0 and LSE = -inf.
    Returns out (total_q, nheads, headdim) float64 and, with return_lse, lse (nheads, total_q) float64."""
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), -math.inf, dtype=torch.float64, device=q.device)
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(starts_q) - 1):
        rows_q = starts_q[b + 1] - starts_q[b] if seqused_q is None else int(seqused_q[b])
        rows_k = starts_k[b + 1] - starts_k[b] if seqused_k is None else int(seqused_k[b])
        if rows_q == 0 or rows_k == 0:
            continue
        sq, sk = slice(starts_q[b], starts_q[b] + rows_q), slice(starts_k[b], starts_k[b] + rows_k)
        o, row_lse = attention_ref(
            q[None, sq], k[None, sk], v[None, sk], softmax_scale, causal, "bottom_right", window_size, softcap, True
        )
        out[sq], lse[:, sq] = o[0], row_lse[0]
    return (out, lse) if return_lse else out


def attention_same_precision(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    causal_align: str = "bottom_right",
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> torch.Tensor:
    """The same-precision PyTorch baseline of design.md's error budget: `attention_ref`'s math by plain PyTorch
    ops in the inputs' own dtype (fp16/bf16 scores and softmax), with the same arguments and conventions.

    A kernel passes when its error against `attention_ref` is at most twice this function's error, plus a small
    atol. Returns out (batch, seqlen_q, nheads, headdim) in the input dtype; differentiable (the backward budget
    uses its gradients). A row that sees no key gets O = 0, as in the spec.
    """
    args = validate_attention_args(q, k, v, softmax_scale, causal, causal_align, window_size, softcap)
    scores, v = _masked_scores(q, k, v, args)
    probs = torch.softmax(scores, dim=-1)
    probs = probs.masked_fill((scores == -math.inf).all(dim=-1, keepdim=True), 0.0)  # softmax gives NaN there
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


def _masked_scores(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, args: AttentionArgs
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores (batch, nheads, seqlen_q, seqlen_k) after scale, softcap and mask (-inf), and V expanded for GQA."""
    k = k.repeat_interleave(args.qheads_per_kvhead, dim=2)
    v = v.repeat_interleave(args.qheads_per_kvhead, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * args.softmax_scale
    if args.softcap > 0:
        scores = args.softcap * torch.tanh(scores / args.softcap)
    rows = torch.arange(args.seqlen_q, device=q.device)
    cols = torch.arange(args.seqlen_k, device=q.device)
    return scores.masked_fill(~visibility_mask(args, rows, cols), -math.inf), v
