"""Shared test helpers: the same-precision PyTorch baseline and the error budget of design.md."""

from __future__ import annotations

import math

import torch

from flashcute.reference import attention_ref, visibility_mask
from flashcute.validation import validate_attention_args


def attention_same_precision(q, k, v, **options) -> torch.Tensor:
    """Attention computed by plain PyTorch ops in the inputs' own dtype: the error baseline a kernel must match."""
    args = validate_attention_args(q, k, v, **options)
    group = args.qheads_per_kvhead
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * args.softmax_scale
    rows = torch.arange(args.seqlen_q, device=q.device)
    cols = torch.arange(args.seqlen_k, device=q.device)
    scores = scores.masked_fill(~visibility_mask(args, rows, cols), -math.inf)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows that see no key: 0, like the spec
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


def check_against_spec(out, lse, q, k, v, atol=1e-4, **options) -> None:
    """Error of ``out`` against the float64 spec must be <= 2x the same-precision baseline's, + atol; LSE too."""
    ref, ref_lse = attention_ref(q, k, v, return_lse=True, **options)
    base = attention_same_precision(q, k, v, **options)
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert not out.isnan().any(), f"{out.isnan().sum().item()} NaN outputs (unwritten or wrong)"
    err = (out.double() - ref).abs().max().item()
    base_err = (base.double() - ref).abs().max().item()
    assert err <= 2 * base_err + atol, f"max abs error {err:.3g} > 2 x baseline {base_err:.3g} + {atol}"
    ref_norm = ref.norm().item() or 1.0
    rel = (out.double() - ref).norm().item() / ref_norm
    base_rel = (base.double() - ref).norm().item() / ref_norm
    assert rel <= 2 * base_rel + atol, f"relative L2 error {rel:.3g} > 2 x baseline {base_rel:.3g} + {atol}"
    if lse is not None:
        assert lse.shape == ref_lse.shape and lse.dtype == torch.float32
        empty = ref_lse == -math.inf
        assert torch.equal(lse[empty], ref_lse[empty].float()), "rows that see no key must have LSE = -inf"
        lse_err = ((lse.double() - ref_lse).abs() / (1 + ref_lse.abs()))[~empty]
        assert lse_err.numel() == 0 or lse_err.max().item() < 1e-4, f"LSE error {lse_err.max().item():.3g}"
