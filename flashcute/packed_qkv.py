"""Attention on q, k and v stacked in one tensor, flash_attn's ``*_qkvpacked_func`` and ``*_kvpacked_func``.

A model whose one projection makes q, k and v (or k and v) holds them in one tensor, (..., 3, nheads, headdim);
these entries take it as it is: q, k and v are views of it (no copy), run through ``flash_attn_func`` or
``flash_attn_varlen_func``, and autograd gives the stacked tensor's gradient. Options as in those two entries.
"""

from __future__ import annotations

import torch

from flashcute import interface


def _unstack(name: str, t: torch.Tensor, parts: int, layout: str) -> tuple[torch.Tensor, ...]:
    """The ``parts`` views of ``t`` along its stacking dim (the third from last), after checking its layout."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != len(layout.split(",")) or t.shape[-3] != parts:
        raise ValueError(f"{name} must have shape {layout}, got {tuple(t.shape)}")
    return t.unbind(-3)


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    deterministic: bool = False,
    causal_align: str = "bottom_right",
    kernel: str | None = None,
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``flash_attn_func`` on qkv (batch, seqlen, 3, nheads, headdim): q, k, v = qkv[:, :, 0], [:, :, 1], [:, :, 2].
    Returns what flash_attn_func returns; the gradient flows to qkv."""
    q, k, v = _unstack("qkv", qkv, 3, "(batch, seqlen, 3, nheads, headdim)")
    return interface.flash_attn_func(
        q, k, v, softmax_scale, causal, window_size, softcap, return_lse, deterministic, causal_align, kernel,
        learnable_sink, alibi_slopes,
    )  # fmt: skip


def flash_attn_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    deterministic: bool = False,
    causal_align: str = "bottom_right",
    kernel: str | None = None,
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``flash_attn_func`` on q (batch, seqlen_q, nheads, headdim) and kv (batch, seqlen_k, 2, nheads_k, headdim):
    k, v = kv[:, :, 0], kv[:, :, 1]. Returns what flash_attn_func returns; the gradients flow to q and kv."""
    k, v = _unstack("kv", kv, 2, "(batch, seqlen_k, 2, nheads_k, headdim)")
    return interface.flash_attn_func(
        q, k, v, softmax_scale, causal, window_size, softcap, return_lse, deterministic, causal_align, kernel,
        learnable_sink, alibi_slopes,
    )  # fmt: skip


def flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    deterministic: bool = False,
    return_lse: bool = False,
    kernel: str | None = None,
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``flash_attn_varlen_func`` on qkv (total, 3, nheads, headdim), each sequence's queries and keys the same
    rows: cu_seqlens and max_seqlen serve as both cu_seqlens_q / cu_seqlens_k and max_seqlen_q / max_seqlen_k.
    Returns what flash_attn_varlen_func returns; the gradient flows to qkv."""
    q, k, v = _unstack("qkv", qkv, 3, "(total, 3, nheads, headdim)")
    return interface.flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, softmax_scale, causal, window_size, softcap,
        deterministic, return_lse, kernel=kernel, learnable_sink=learnable_sink, alibi_slopes=alibi_slopes,
    )  # fmt: skip


def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    deterministic: bool = False,
    return_lse: bool = False,
    kernel: str | None = None,
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``flash_attn_varlen_func`` on q (total_q, nheads, headdim) and kv (total_k, 2, nheads_k, headdim). Returns
    what flash_attn_varlen_func returns; the gradients flow to q and kv."""
    k, v = _unstack("kv", kv, 2, "(total_k, 2, nheads_k, headdim)")
    return interface.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size, softcap,
        deterministic, return_lse, kernel=kernel, learnable_sink=learnable_sink, alibi_slopes=alibi_slopes,
    )  # fmt: skip
