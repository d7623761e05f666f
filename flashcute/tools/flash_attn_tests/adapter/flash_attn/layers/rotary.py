"""``flash_attn.layers.rotary.apply_rotary_emb`` in plain torch: the reference that flash-attention 2's tests rotate
q and k with before they compare ``flash_attn_with_kvcache``'s rotary. It is written apart from flashcute's own
rotation (kvcache.apply_rotary) on purpose: a reference taken from the code under test could not catch its errors.

Rotates the first rotary_dim = 2 * cos.shape[-1] features of x: pairs (2j, 2j + 1) when interleaved, else (j, j +
rotary_dim / 2), by angle j at position seqlen_offsets (an int or a (batch,) tensor) + the token's place in its
sequence (a row of x, or with cu_seqlens its row in its packed sequence); a position past cos's rows rotates by
nothing, as flash-attention 2's kernel loads cos = 1, sin = 0 there. Computed in float32, returned in x's dtype.
"""

from __future__ import annotations

import torch


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None):
    if cu_seqlens is None:  # x (batch, seqlen, nheads, headdim)
        batch, seqlen = x.shape[:2]
        place = torch.arange(seqlen, device=x.device).expand(batch, seqlen)
        sequence = torch.arange(batch, device=x.device)[:, None]
    else:  # x (total, nheads, headdim), sequences packed by cu_seqlens
        starts = cu_seqlens.long()
        rows = torch.arange(x.shape[0], device=x.device)
        sequence = (torch.searchsorted(starts, rows, right=True) - 1).clamp(0, starts.numel() - 2)
        place = rows - starts[sequence]
    offsets = seqlen_offsets.long()[sequence] if torch.is_tensor(seqlen_offsets) else int(seqlen_offsets)
    position = place + offsets
    inside = (position < cos.shape[0])[..., None]
    index = position.clamp(max=cos.shape[0] - 1)
    angle_cos = torch.where(inside, cos.float()[index], 1.0)[..., None, :]  # over the heads
    angle_sin = torch.where(inside, sin.float()[index], 0.0)[..., None, :]
    half = cos.shape[-1]
    features = x[..., : 2 * half].float()
    a, b = (features[..., 0::2], features[..., 1::2]) if interleaved else features.split(half, dim=-1)
    turned = (a * angle_cos - b * angle_sin, a * angle_sin + b * angle_cos)
    turned = torch.stack(turned, dim=-1).flatten(-2) if interleaved else torch.cat(turned, dim=-1)
    out = torch.cat((turned.to(x.dtype), x[..., 2 * half :]), dim=-1)
    return x.copy_(out) if inplace else out
