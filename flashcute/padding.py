"""Between padded batches and packed sequences, with flash_attn's conventions (``flash_attn.bert_padding``).

A padded batch (batch, seqlen, ...) and a mask of its real tokens become the packed layout (total, ...) that
``flash_attn_varlen_func`` takes, with the cumulative sequence lengths it needs; ``pad_input`` puts a packed result
back into the padded batch. Both work on any device and are differentiable in ``hidden_states``: the gather and
the scatter are torch index ops, whose gradients are the scatter and the gather.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def unpad_input(
    hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """Pack the tokens that ``attention_mask`` (or ``unused_mask``) marks, row after row.

    hidden_states: (batch, seqlen, ...). attention_mask: (batch, seqlen), bool or int, nonzero at the real tokens.
    unused_mask: (batch, seqlen) like attention_mask, nonzero at tokens that are kept in the packed tensor (memory
    allocated for them) but not counted as used; the two masks are expected to be disjoint.

    Returns (as flash_attn 2.x does):
        hidden_states (total, ...): the kept tokens, in row-major order of (batch, seqlen).
        indices (total,) int64: each kept token's index in the flattened (batch * seqlen) axis.
        cu_seqlens (batch + 1,) int32: 0, then the running total of the kept tokens per row.
        max_seqlen (int): the most tokens kept in one row (reading it synchronizes with the device).
        seqused (batch,) int32: the tokens of attention_mask per row (what a kernel should attend to).
    """
    if attention_mask.dim() != 2 or hidden_states.shape[:2] != attention_mask.shape:
        raise ValueError(
            f"attention_mask must be (batch, seqlen) = {tuple(hidden_states.shape[:2])} (hidden_states' first two "
            f"dims), got {tuple(attention_mask.shape)}"
        )
    used = attention_mask != 0
    kept = used if unused_mask is None else used | (unused_mask != 0)
    seqlens = kept.sum(dim=-1, dtype=torch.int32)
    indices = kept.flatten().nonzero().flatten()
    cu_seqlens = F.pad(seqlens.cumsum(dim=0, dtype=torch.int32), (1, 0))
    packed = hidden_states.flatten(0, 1).index_select(0, indices)
    max_seqlen = int(seqlens.max()) if seqlens.numel() else 0  # (a batch of no sequence has none)
    return packed, indices, cu_seqlens, max_seqlen, used.sum(dim=-1, dtype=torch.int32)


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """The inverse of ``unpad_input``: hidden_states (total, ...) put at ``indices`` (total,) of a flattened
    (batch * seqlen) axis; returns (batch, seqlen, ...) with zeros at the positions that no index names."""
    padded = hidden_states.new_zeros((batch * seqlen, *hidden_states.shape[1:]))
    return padded.index_copy(0, indices, hidden_states).view(batch, seqlen, *hidden_states.shape[1:])
