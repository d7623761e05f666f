"""flash_attn_with_kvcache's specification in float64: the cache update on copies of the caches, then
`attention_ref` over each sequence's keys, one sequence and one position at a time."""

from __future__ import annotations

import math

import torch

from flashcute.kvcache import validate_kvcache_args
from flashcute.reference.naive import attention_ref, sequence_slopes


def attention_kvcache_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What ``flashcute.flash_attn_with_kvcache`` computes, with the same arguments (any float dtype, any device),
    spelled out; the caches given are not modified. Sequence b's position p lies in cache row
    (cache_batch_idx[b] or b, p), or in page block_table[b, p // page_block_size] at row p % page_block_size.

    1. Rotary embedding (rotary_cos, rotary_sin given): each pair of features (a, c) of a token at position p, the
       pairs (2j, 2j + 1) if rotary_interleaved else (j, j + rotary_dim / 2), is the complex number a + ic
       multiplied by cos[p, j] + i sin[p, j]. New key i of sequence b is at position cache_seqlens[b] + i; query i
       at cache_seqlens[b] + i if the mask is causal or local (a window side in [0, capacity)), else at
       cache_seqlens[b].
    2. Copies of the caches get new key i (rotated, cast to the cache's dtype) and value i of sequence b at its
       position cache_seqlens[b] + i, sequence after sequence.
    3. Sequence b's keys are its positions cache_leftpad[b] (default 0) .. cache_seqlens[b] + seqlen_new - 1
       (the whole capacity without cache_seqlens) of the updated copies; its queries attend to them by
       `attention_ref` (causal, window and ALiBi distances aligned bottom-right: the last query at the last key's
       position), with learnable_sink (nheads,) and alibi_slopes (nheads,) or (batch, nheads) as there. A
       sequence with no key gets O = 0 and LSE = the sink (-inf without one).

    The values that flash_attn_with_kvcache cannot check without reading them on the host are checked here
    (ValueError): cache_seqlens, cache_leftpad, cache_batch_idx and the pages in use within their ranges, rotary
    positions below seqlen_ro.

    Returns out (batch, seqlen_q, nheads, headdim) float64, lse (batch, nheads, seqlen_q) float64, and the updated
    copies of k_cache and v_cache.
    """
    args = validate_kvcache_args(
        q,
        k_cache,
        v_cache,
        k,
        v,
        rotary_cos,
        rotary_sin,
        cache_seqlens,
        cache_batch_idx,
        cache_leftpad,
        block_table,
        softmax_scale,
        causal,
        window_size,
        softcap,
        rotary_interleaved,
        learnable_sink=learnable_sink,
        alibi_slopes=alibi_slopes,
    )
    sink = args.attention.learnable_sink
    batch, seqlen_q, nheads, _ = q.shape
    capacity, page = args.capacity, args.page_block_size
    if cache_seqlens is None:
        filled = None
    else:
        filled = cache_seqlens.tolist() if isinstance(cache_seqlens, torch.Tensor) else [int(cache_seqlens)] * batch
    starts = [0] * batch if cache_leftpad is None else cache_leftpad.tolist()
    ends = [capacity] * batch if filled is None else [n + args.seqlen_new for n in filled]

    def slot(b: int, p: int) -> tuple[int, int]:
        if block_table is not None:
            block = int(block_table[b, p // page])
            if not 0 <= block < k_cache.shape[0]:
                raise ValueError(f"block_table[{b}, {p // page}] must be in [0, {k_cache.shape[0]}), got {block}")
            return block, p % page
        row = b if cache_batch_idx is None else int(cache_batch_idx[b])
        if not 0 <= row < k_cache.shape[0]:
            raise ValueError(f"cache_batch_idx[{b}] must be in [0, {k_cache.shape[0]}), got {row}")
        return row, p

    for b in range(batch):
        if filled is not None and not 0 <= filled[b] <= capacity - args.seqlen_new:
            raise ValueError(
                f"cache_seqlens[{b}] must be in [0, {capacity - args.seqlen_new}] (capacity less the new keys), "
                f"got {filled[b]}"
            )
        bound = capacity if filled is None else filled[b]
        if not 0 <= starts[b] <= bound:
            raise ValueError(
                f"cache_leftpad[{b}] must be in [0, {bound}] (cache_seqlens[{b}], or the capacity without "
                f"cache_seqlens), got {starts[b]}"
            )

    def rotated(x: torch.Tensor, p: int) -> torch.Tensor:
        """x (..., headdim) float64, as a token at position p."""
        if not args.rotary_dim:
            return x
        if not 0 <= p < rotary_cos.shape[0]:
            raise ValueError(f"rotary position {p} must be in [0, {rotary_cos.shape[0]}) (rotary_cos.shape[0])")
        half = args.rotary_dim // 2
        turn = torch.complex(rotary_cos[p].double(), rotary_sin[p].double())
        if rotary_interleaved:
            pairs = x[..., : args.rotary_dim].unflatten(-1, (half, 2))
            z = torch.complex(pairs[..., 0], pairs[..., 1]) * turn
            turned = torch.stack((z.real, z.imag), dim=-1).flatten(-2)
        else:
            z = torch.complex(x[..., :half], x[..., half : args.rotary_dim]) * turn
            turned = torch.cat((z.real, z.imag), dim=-1)
        return torch.cat((turned, x[..., args.rotary_dim :]), dim=-1)

    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    for b in range(batch):
        for i in range(args.seqlen_new):
            position = filled[b] + i
            k_cache[slot(b, position)] = rotated(k[b, i].double(), position).to(k_cache.dtype)
            v_cache[slot(b, position)] = v[b, i]

    out = torch.zeros((batch, seqlen_q, nheads, v_cache.shape[-1]), dtype=torch.float64, device=q.device)
    lse = torch.full((batch, nheads, seqlen_q), -math.inf, dtype=torch.float64, device=q.device)
    for b in range(batch):
        queries = q[b].double()
        if k is not None:
            per_row = args.q_positions_per_row
            queries = torch.stack([rotated(queries[i], filled[b] + (i if per_row else 0)) for i in range(seqlen_q)])
        positions = range(starts[b], ends[b])
        if not positions:
            if sink is not None:
                lse[b] = sink.to(torch.float64)[:, None]
            continue
        rows, offsets = zip(*(slot(b, p) for p in positions), strict=True)
        rows, offsets = torch.tensor(rows, device=q.device), torch.tensor(offsets, device=q.device)
        keys, values = k_cache[rows, offsets], v_cache[rows, offsets]
        variants = {"learnable_sink": sink, "alibi_slopes": sequence_slopes(args.attention.alibi_slopes, b)}
        options = {"softmax_scale": softmax_scale, "causal": causal, "window_size": window_size, "softcap": softcap}
        out_b, lse_b = attention_ref(queries[None], keys[None], values[None], **options, **variants, return_lse=True)
        out[b], lse[b] = out_b[0], lse_b[0]
    return out, lse, k_cache, v_cache
