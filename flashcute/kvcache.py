"""flash_attn_with_kvcache: attention over a key/value cache with in-place append, flash_attn's conventions.

One call is one step of incremental decoding: the new keys (and q) get their rotary embedding, the new keys and
values are written into the cache in place, and q attends to each sequence's cached keys. The attention is one call
to ``flash_attn_varlen_func``: a cache indexed by batch is read where it lies, as a packed batch whose sequence b
starts at row b * seqlen_cache + cache_leftpad[b]; so are pages (``block_table``) by the kernels that load each
box of rows from its page (the Hopper family's); a cache reached through ``cache_batch_idx``, or pages for the
kernels that read one packed tensor, is first gathered into a contiguous copy. Nothing reads a device value on the
host, so a whole step can be captured in a CUDA graph and replayed with new ``cache_seqlens``.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from flashcute import interface, splitkv
from flashcute.kernels import registry
from flashcute.kernels.common import prepost
from flashcute.validation import KvcacheArgs, pads_head_dims, validate_kvcache_args, validate_kvcache_kernel_inputs


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, interleaved: bool
) -> torch.Tensor:
    """x (batch, seqlen, nheads, headdim) with its first rotary_dim = 2 * cos.shape[1] features rotated, as
    flash_attn's apply_rotary_emb: token (b, s) at position p = positions[b, s] turns each pair (x_a, x_c) by
    angle j (cos[p, j], sin[p, j]) into (x_a cos - x_c sin, x_a sin + x_c cos). The pairs are features
    (2j, 2j + 1) when ``interleaved`` (GPT-J style), else (j, j + rotary_dim / 2) (GPT-NeoX style); features past
    rotary_dim pass through. Computed in float32 (or x's dtype if wider) and returned in x's dtype."""
    rotary_dim = 2 * cos.shape[1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    cos, sin = (t[positions].to(dtype)[:, :, None, :] for t in (cos, sin))  # (batch, seqlen, 1, rotary_dim / 2)
    rotated = x[..., :rotary_dim].to(dtype)
    if interleaved:
        first, second = rotated[..., 0::2], rotated[..., 1::2]
    else:
        first, second = rotated.chunk(2, dim=-1)
    pair = (first * cos - second * sin, first * sin + second * cos)
    rotated = torch.stack(pair, dim=-1).flatten(-2) if interleaved else torch.cat(pair, dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., rotary_dim:]), dim=-1)


def flash_attn_with_kvcache(
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
    num_splits: int = 0,
    return_lse: bool = False,
    kernel: str | None = None,
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    return_softmax_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of q over a key/value cache, after appending new keys and values to it in place: one step of
    incremental decoding, with flash_attn 2's conventions (``flash_attn.flash_attn_with_kvcache``). CUDA fp16 /
    bf16 tensors. Inference only, as in flash_attn: it runs under ``torch.no_grad()`` and builds no autograd graph.

    q: (batch, seqlen_q, nheads, headdim). k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim), where
    sequence b uses cache row cache_batch_idx[b] (int32 (batch,); default b, so batch_cache >= batch), or, with
    block_table (int32 (batch, max_num_blocks_per_seq)), a paged cache (num_blocks, page_block_size, nheads_k,
    headdim) whose position p of sequence b lies in page block_table[b, p // page_block_size] at row
    p % page_block_size (any page size). A sequence's capacity is seqlen_cache, or max_num_blocks_per_seq *
    page_block_size. nheads % nheads_k == 0 (grouped-query attention). v_cache (and v) may have a head dim of their
    own, as flash_attn_func's v (out then has it). A head dim that is not a multiple of 8 runs, as in flash_attn, on
    zero-padded copies of q and the caches, whose appended rows are then copied back (a copy of each cache a call).

    cache_seqlens: int, or int32 (batch,): the keys already in each sequence's cache; None (only without k) means
    the whole capacity. k, v (batch, seqlen_new, nheads_k, headdim), optional (with them seqlen_q must be at most
    the capacity, flash_attn's rule): written in place at positions
    cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 of sequence b's cache (if cache_batch_idx repeats an
    index, which sequence's values that row keeps is unspecified, as in flash_attn). cache_leftpad, int32
    (batch,): the position where each sequence's keys start (default 0). Sequence b then attends to its keys at
    positions [cache_leftpad[b], cache_seqlens[b] + seqlen_new), with causal and window masks aligned bottom-right
    on that range (flash_attn_func's conventions); a query that sees no key gets O = 0 and LSE = -inf.

    rotary_cos, rotary_sin (seqlen_ro, rotary_dim / 2), any float dtype, seqlen_ro >= the capacity, rotary_dim <=
    headdim, only with k: the new keys are rotated (``apply_rotary``, ``rotary_interleaved`` picks the pairs) at
    positions cache_seqlens[b] + i before they are written, and q with them: at cache_seqlens[b] + i when causal or
    local (a window side below the capacity), else every row of q at cache_seqlens[b]. Positions are cache
    positions: cache_leftpad does not shift them (as in flash_attn). q itself is not modified.

    Values are not read on the host, so they are not checked: the caller keeps 0 <= cache_leftpad[b] <=
    cache_seqlens[b], cache_seqlens[b] + seqlen_new <= the capacity, cache_batch_idx and block_table's pages for
    those positions in [0, batch_cache) and [0, num_blocks), and rotary positions below seqlen_ro
    (attention_kvcache_ref checks them all). A new key or value whose slot lies outside the cache (a position past
    the capacity, a cache row or page out of range) is not written, and a rotary position past seqlen_ro fails a
    device index check; attention only reads each sequence's own capacity.

    The attention runs on the packed-batch kernels: a cache indexed by batch (no cache_batch_idx, no block_table)
    is read where it lies, when its (batch, seqlen_cache) dims merge into one (else those rows are copied). A paged
    cache is read where it lies by the Hopper kernels, a box of rows at a time from its page (on the split-KV path,
    when its (num_blocks, page_block_size) dims merge into one and registry.reads_pages says so: keys before a
    sequence's first page boundary or in the tail of several masked rows are copied out for a launch of their own).
    Else, and with cache_batch_idx, the kernels take
    one packed tensor, so each sequence's cache row or pages are first gathered into a (batch, capacity, nheads_k,
    headdim) copy of k and of v (a page that holds none of its keys is never read: page 0 stands in for it): that
    copy is the cost of those layouts. A call with one query
    row (its causal mask and window are a range of keys) or without a mask takes the split-KV path (splitkv.py):
    the query heads of a kv head share its tiles, and each sequence's keys are cut into ``num_splits`` chunks
    walked by thread blocks of their own (0: a heuristic from the batch, heads, capacity and SM count; 1: no
    split), merged in fp32. A few query rows under a causal mask (or one bounded on the right alone: seqlen_q times
    the query heads of a kv head at most 128, a packed tile) split the keys they all see alike, and attend each
    sequence's last seqlen_q - 1 keys, which the mask hides from some of them, in a masked launch of their own,
    merged as one more split; more rows (a chunk of prefill) or a left window run as one packed launch, whatever
    num_splits says.
    softcap > 0 caps the scores, softcap * tanh(score / softcap), learnable_sink (nheads,) joins every row's softmax
    denominator, and alibi_slopes (nheads,) or (batch, nheads) bias the scores by -slope * |i + offset - j| over the
    attended keys, as in flash_attn_func (with ALiBi the keys are not split: a split's keys lose their positions).
    ``kernel`` picks a kernel family by name, as in flash_attn_func.

    No device value is read on the host: with tensor cache_seqlens a whole step (write and attention) can be
    captured in a CUDA graph and replayed after new values are copied into q, k, v and cache_seqlens.

    Returns out (batch, seqlen_q, nheads, v's headdim) and, with return_lse, lse (batch, nheads, seqlen_q) float32,
    natural log; ``return_softmax_lse`` is flash_attn's name for return_lse, taken alike.
    """
    if torch.is_grad_enabled():  # (under no_grad or inference_mode, as decoding loops run, not entered again: a
        with torch.no_grad():  # decorator's no_grad took 3 us a call)
            return flash_attn_with_kvcache(
                q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, num_splits, return_lse,
                kernel, learnable_sink, alibi_slopes, return_softmax_lse,
            )  # fmt: skip
    options = (softmax_scale, causal, window_size, softcap, rotary_interleaved, num_splits, return_lse)
    options += (learnable_sink, alibi_slopes, return_softmax_lse)
    tensors = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad)
    values_read = isinstance(alibi_slopes, torch.Tensor) and alibi_slopes.device.type == "cpu"  # (checked finite)
    key = None if values_read else _signature(*tensors, block_table, *options, kernel)
    checked = _checked.get(key) if key is not None else None
    if checked is None:
        args = _validate(*tensors, block_table, *options, kernel)
        if q.is_cuda and torch.cuda.is_current_stream_capturing():  # (a step keeps tensors: none in a graph's pool)
            key = None
        step = None if key is None else DecodeStep.of(args, *tensors[:3], *tensors[7:], block_table, num_splits, kernel)
        if key is not None:  # (kept without the tensors: the calls pass their own)
            if len(_checked) >= MAX_SIGNATURES:
                _checked.clear()
            _checked[key] = (dataclasses.replace(args, attention=args.attention.without_tensors()), step)
    else:
        args, step = checked
    return_lse = return_lse or return_softmax_lse
    if step is not None:
        out, lse = step(q, k_cache, v_cache, k, v, cache_seqlens, block_table, learnable_sink)
        return (out, lse) if return_lse else out
    if pads_head_dims(args.attention):  # (not multiples of 8: zero-padded copies, the caches' included)
        q, k_padded, v_padded, k, v = interface.pad_head_dims(q, k_cache, v_cache, k, v)
        options = {"window_size": window_size, "softcap": softcap, "rotary_interleaved": rotary_interleaved}
        options |= {"num_splits": num_splits, "kernel": kernel, "learnable_sink": learnable_sink}
        out, lse = flash_attn_with_kvcache(
            q, k_padded, v_padded, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
            block_table, args.attention.softmax_scale, causal, return_lse=True, alibi_slopes=alibi_slopes, **options
        )  # fmt: skip
        if k is not None:  # the appended rows (rotated where rotary applies) into the caller's caches
            k_cache.copy_(k_padded[..., : k_cache.shape[-1]])
            v_cache.copy_(v_padded[..., : v_cache.shape[-1]])
        out = out[..., : v_cache.shape[-1]]
        return (out, lse) if return_lse else out
    q = interface.readable("q", q)
    batch, seqlen_q, nheads, headdim = q.shape
    nheads_k, capacity, device = k_cache.shape[2], args.capacity, q.device
    if cache_seqlens is None or isinstance(cache_seqlens, torch.Tensor):
        filled = None
    else:  # one length for every sequence: its keys' end is the same constant at every such call
        filled = int(cache_seqlens)
        cache_seqlens = splitkv.filled(batch, filled, device)

    if k is not None and args.rotary_dim:  # q's rows at their own positions, or every row at cache_seqlens[b]
        new_positions = cache_seqlens[:, None] + splitkv.indices(args.seqlen_new, device)  # (batch, seqlen_new)
        rows = splitkv.indices(seqlen_q if args.q_positions_per_row else 1, device)
        q = apply_rotary(q, rotary_cos, rotary_sin, cache_seqlens[:, None] + rows, rotary_interleaved)
        k = apply_rotary(k, rotary_cos, rotary_sin, new_positions, rotary_interleaved)

    a = args.attention
    window_left, window_right = interface.kernel_window(a)
    # the split path takes unmasked calls, one query row (its mask is a key range) and a few under a right-bounded
    # mask (the keys that they see alike, and a tail of the last keys under the mask: splitkv.tail_keys), as many as
    # a tile holds packed (more, a chunk of prefill, run as one masked launch)
    tail_keys = splitkv.tail_keys(seqlen_q, window_left, window_right)
    if tail_keys and seqlen_q * (nheads // nheads_k) > splitkv.ROWS_PER_TILE:
        tail_keys = None
    split_keys = tail_keys is not None and alibi_slopes is None
    windowed = split_keys and seqlen_q == 1 and a.window_left >= 0
    # Sequence b's keys: positions [start, end) of its cache, kept inside its capacity (start None: 0). The split
    # path's chunks of a plain decoding step come from cache_seqlens directly (SplitPlan.appended_chunks).
    aligned = split_keys and not windowed and not tail_keys and cache_leftpad is None
    # A paged cache is read where it lies on the split path: the kernels load each box of a page's rows from its
    # page, so the chunks start on a page, and the keys before the first page boundary (a window's or the left
    # padding's start) or after the chunks (the tail of several masked rows) are copied out of their pages for a
    # launch of their own (_page_rows). Keys with both, and the masked packed path, gather the pages first.
    in_place = (
        block_table is not None
        and split_keys
        and not (tail_keys and cache_leftpad is not None)
        and _pages_in_place(k_cache, v_cache, kernel, args.page_block_size)
    )
    if cache_seqlens is None or filled is not None:
        end = splitkv.filled(batch, capacity if filled is None else min(filled + args.seqlen_new, capacity), device)
    elif aligned and (block_table is None or in_place):
        end = None
    else:
        end = (cache_seqlens + args.seqlen_new).clamp(0, capacity)
    start = None if cache_leftpad is None else torch.minimum(cache_leftpad.clamp(min=0), end)
    split = splitkv.plan(batch, seqlen_q, nheads, nheads_k, capacity, num_splits, device) if split_keys else None
    # The new keys and values into the cache, and where a plain decoding step's chunks end (end None: the keys
    # count from cache_seqlens, SplitPlan.appended_chunks), in one launch before anything reads the cache.
    appended = split.appended_chunks(capacity) if end is None else None
    table = None if block_table is None else _kernel_table(block_table)
    if (k is not None and args.seqlen_new) or appended is not None:
        new = (k, v) if k is not None and args.seqlen_new else (None, None)
        chunks = (appended[1], split.chunk) if appended is not None else (None,)
        prepost.append(cache_seqlens, *new, k_cache, v_cache, cache_batch_idx, table, *chunks)
    pages = ()
    if in_place:  # the pages' rows; the launches number sequence b's positions from b * capacity
        keys, values = _cache_rows(k_cache, v_cache)
        pages = (table, args.page_block_size, capacity)
    else:
        if block_table is not None:
            keys, values = _gather_pages(k_cache, v_cache, block_table, args.page_block_size, start, end)
        elif cache_batch_idx is not None:
            index = cache_batch_idx.long()
            keys, values = k_cache[index], v_cache[index]
        else:
            keys, values = k_cache[:batch], v_cache[:batch]
        keys, values = (t.reshape(batch * capacity, nheads_k, t.shape[-1]) for t in (keys, values))
    first_rows = splitkv.row_starts(batch, capacity, device)
    name = kernel or "auto"
    if split_keys:
        tail = None
        constant = cache_leftpad is None and (cache_seqlens is None or filled is not None)  # one key range for all
        last = capacity if filled is None else min(filled + args.seqlen_new, capacity)
        if in_place and (tail_keys or start is not None or windowed):
            if windowed:  # (one query row: a window is the range of keys its query sees)
                window_start = end - 1 - min(a.window_left, capacity)
                start = window_start.clamp_(min=0) if start is None else torch.maximum(start, window_start)
            cache = (k_cache, v_cache, block_table, args.page_block_size)
            chunks, tail = _split_tail(split, first_rows, start, end, tail_keys, window_right, batch * capacity, cache)
        elif tail_keys and constant:
            chunks, tail = split.constant_tail(capacity, last, tail_keys, window_right)
        elif tail_keys:
            chunks, tail = _split_tail(split, first_rows, start, end, tail_keys, window_right, batch * capacity)
        elif constant:
            chunks = split.constant_chunks(capacity, max(last - 1 - a.window_left, 0) if windowed else 0, last)
        elif end is None:
            chunks = (appended[0], appended[1].view(-1))
        else:
            if windowed:
                window_start = end - 1 - min(a.window_left, capacity)
                start = window_start.clamp_(min=0) if start is None else torch.maximum(start, window_start)
            if start is None:
                chunks = split.key_chunks(first_rows, end, batch * capacity)
            else:
                chunks = split.key_chunks(first_rows + start, end - start, batch * capacity)
        scores = (a.softcap, learnable_sink, tail)
        out, lse = split.attention(q, keys, values, chunks, a.softmax_scale, name, *scores, pages=pages)
        return (out, lse) if return_lse else out

    if start is None:
        cu_seqlens_k, key_count = splitkv.row_starts(batch + 1, capacity, device), end
    else:
        cu_seqlens_k, key_count = F.pad(first_rows + start, (0, 1), value=batch * capacity), end - start
    cu_seqlens_q = splitkv.row_starts(batch + 1, seqlen_q, device)
    packed = (cu_seqlens_q, cu_seqlens_k, None, key_count, seqlen_q, capacity)
    out, lse = interface.varlen_outputs(
        q.reshape(batch * seqlen_q, nheads, headdim),
        keys,
        values,
        *packed,
        a.softmax_scale,
        window_left,
        window_right,
        name,
        a.softcap,
        learnable_sink,
        alibi_slopes,
        pages=pages,
    )
    out = out.view(batch, seqlen_q, nheads, v_cache.shape[-1])
    if not return_lse:
        return out
    return out, lse.view(nheads, batch, seqlen_q).transpose(0, 1).contiguous()


class DecodeStep:
    """What one call signature of the calls decoding loops repeat decides once: one query row a sequence (or a few
    without a mask, or a few under a causal mask: a masked tail of their last keys) on the split path, no left
    padding, rotary embedding, cache_batch_idx or ALiBi, head dims that are multiples of 8, and a cache read where
    it lies (indexed by batch, or pages the family reads in place; under a masked tail by batch only). A call then
    runs the writes and key counts (prepost.append, which also finds the tail's keys) and the split attention
    (SplitPlan.attention) with the split plan and the constant tensors its first call found: the launches the
    general path makes for such a call, less the host's time deciding them again (docs/decoding.md, Host time)."""

    __slots__ = (
        "appends", "batch", "capacity", "chunks", "kernel", "lengths", "mask", "page_size", "scalars", "split", "tail"
    )  # fmt: skip

    def __init__(self, args: KvcacheArgs, q, cache_seqlens, block_table, num_splits, kernel):
        batch, seqlen_q, nheads, _ = q.shape
        a = args.attention
        self.batch, self.capacity, self.appends, self.kernel = batch, args.capacity, args.seqlen_new > 0, kernel
        self.split = split = splitkv.plan(batch, seqlen_q, nheads, a.nheads_k, self.capacity, num_splits, q.device)
        self.page_size = args.page_block_size if block_table is not None else 0
        self.scalars = (a.softmax_scale, a.softcap)
        window_left, window_right = interface.kernel_window(a)
        tail_keys = splitkv.tail_keys(seqlen_q, window_left, window_right)
        self.mask = (tail_keys, window_right) if tail_keys else None  # a masked tail's
        self.lengths = self.chunks = self.tail = None  # (tensor lengths: the append kernel counts chunk keys)
        if not isinstance(cache_seqlens, torch.Tensor):  # one length for every sequence, or the whole capacity
            filled = self.capacity if cache_seqlens is None else int(cache_seqlens)
            self.lengths = splitkv.filled(batch, filled, q.device)
            last = min(filled + args.seqlen_new, self.capacity)
            if tail_keys:
                self.chunks, self.tail = split.constant_tail(self.capacity, last, tail_keys, window_right)
            else:
                self.chunks = split.constant_chunks(self.capacity, 0, last)

    @classmethod
    def of(cls, args: KvcacheArgs, q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
           num_splits, kernel) -> DecodeStep | None:  # fmt: skip
        """The signature's step, or None where the call takes the general path."""
        a = args.attention
        _, seqlen_q, nheads, _ = q.shape
        tail_keys = splitkv.tail_keys(seqlen_q, *interface.kernel_window(a))
        fits = seqlen_q * (nheads // a.nheads_k) <= splitkv.ROWS_PER_TILE  # (else one masked launch, unsplit)
        masked_tail = bool(tail_keys) and block_table is None and fits
        # (one query's window, a masked tail in pages: the general path's key ranges)
        keys_alike = (tail_keys == 0 or masked_tail) and not (seqlen_q == 1 and a.window_left >= 0)
        plain = (
            keys_alike and not pads_head_dims(a) and args.rotary_dim == 0 and cache_batch_idx is None
            and cache_leftpad is None and a.alibi_slopes is None and q.numel() > 0 and args.capacity > 0
            and interface.readable("q", q) is q
        )  # fmt: skip
        if block_table is None:  # the rows of the first batch sequences as one tensor
            plain = plain and all(t.stride(0) == t.shape[1] * t.stride(1) for t in (k_cache, v_cache))
        else:
            in_place = _pages_in_place(k_cache, v_cache, kernel, args.page_block_size)
            plain = plain and block_table.stride(1) == 1 and in_place
        if not plain:
            return None
        return cls(args, q, cache_seqlens, block_table, num_splits, kernel or "auto")

    def __call__(self, q, k_cache, v_cache, k, v, cache_seqlens, block_table, learnable_sink):
        split, batch = self.split, self.batch
        new = (k, v) if self.appends else (None, None)
        tail = self.tail
        if self.chunks is None:  # the writes and each chunk's key count (and the tail's keys), from the lengths
            if self.mask is None:
                (cu_seqlens_k, counts), found = split.appended_chunks(self.capacity), None
            else:
                (cu_seqlens_k, counts), rows, tail = split.appended_tail(self.capacity, *self.mask)
                found = (rows, self.mask[0], self.capacity)  # (prepost.append's tail)
            prepost.append(cache_seqlens, *new, k_cache, v_cache, None, block_table, counts, split.chunk, found)
            chunks = (cu_seqlens_k, counts.view(-1))
        else:
            if self.appends:
                prepost.append(self.lengths, *new, k_cache, v_cache, None, block_table)
            chunks = self.chunks
        pages = (block_table, self.page_size, self.capacity) if self.page_size else ()
        if not pages and k_cache.shape[0] != batch:  # (the first batch sequences' rows)
            k_cache, v_cache = k_cache[:batch], v_cache[:batch]
        keys, values = _cache_rows(k_cache, v_cache)
        softmax_scale, softcap = self.scalars
        return split.attention(
            q, keys, values, chunks, softmax_scale, self.kernel, softcap, learnable_sink, tail, pages=pages
        )


def _validate(q, k_cache, v_cache, *rest) -> KvcacheArgs:
    """flash_attn_with_kvcache's arguments checked in full (validate_kvcache_args, the kernels' needs of the tensors
    read where they lie, the kernel's name), before anything is written; ``rest`` in the entry's order, then
    kernel."""
    *arguments, kernel = rest
    args = validate_kvcache_args(q, k_cache, v_cache, *arguments)
    validate_kvcache_kernel_inputs(q, k_cache, v_cache, args)
    if kernel is not None:
        if not isinstance(kernel, str):
            raise TypeError(f"kernel must be a str or None, got {kernel!r}")
        registry.pick(q.device, kernel)  # an unknown or unavailable name fails before the cache is written
    return args


# The checked arguments of the call signatures seen so far: a decoding loop repeats one signature every step, and
# the full checks took about a quarter of a call's host time. Starts over past MAX_SIGNATURES.
_checked: dict[tuple, tuple[KvcacheArgs, DecodeStep | None]] = {}
MAX_SIGNATURES = 1024
_SCALAR_TYPES = (type(None), bool, int, float, str)


def _signature(*arguments) -> tuple | None:
    """What _validate's outcome depends on, as a dict key: each tensor's shape, strides, dtype, device and whether
    it starts on a 16-byte boundary (validate_pointers), each other argument itself with its type (True == 1 ==
    1.0 must not share a key), a window's pair alike; None where an argument is of another kind (or under
    torch.compile), which then takes the full checks, as a call whose checks read tensor values does."""
    if torch.compiler.is_compiling():
        return None
    key = []
    for a in arguments:
        if a is None:  # (most of them: the first test)
            key.append(None)
            continue
        kind = type(a)
        if kind is torch.Tensor or isinstance(a, torch.Tensor):
            key.append((a.shape, a.stride(), a.dtype, a.device, a.data_ptr() % 16))
        elif kind in _SCALAR_TYPES:
            key.append((kind, a))
        elif kind is tuple and len(a) == 2 and type(a[0]) in _SCALAR_TYPES and type(a[1]) in _SCALAR_TYPES:
            key.append((tuple, type(a[0]), a[0], type(a[1]), a[1]))
        else:
            return None
    return tuple(key)


def paged_keys(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    page_size: int,
    key_counts: torch.Tensor,
    kernel: str | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple]:
    """A paged cache's keys as the packed launch (interface.varlen_outputs) takes them, sequence b's first
    key_counts[b] positions of its pages (block_table[b]): (keys, values, cu_seqlens_k, pages), sequence b's
    positions numbered from b * capacity. The pages where they lie (``pages`` for the launch) where the family reads
    them so, else each sequence's pages gathered into one copy (``pages`` empty)."""
    batch, capacity = block_table.shape[0], block_table.shape[1] * page_size
    cu_seqlens_k = splitkv.row_starts(batch + 1, capacity, block_table.device)
    if _pages_in_place(k_cache, v_cache, kernel, page_size):
        keys, values = _cache_rows(k_cache, v_cache)
        return keys, values, cu_seqlens_k, (_kernel_table(block_table), page_size, capacity)
    keys, values = _gather_pages(k_cache, v_cache, block_table, page_size, None, key_counts)
    keys, values = (t.view(batch * capacity, *t.shape[2:]) for t in (keys, values))
    return keys, values, cu_seqlens_k, ()


def _cache_rows(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache as the packed kernels read it where it lies: (rows, nheads_k, head dim), its first two dims merged
    (pages * page_size, or batch * seqlen_cache rows; a view where they merge, as the callers check)."""
    return k_cache.flatten(0, 1), v_cache.flatten(0, 1)


def _kernel_table(block_table: torch.Tensor) -> torch.Tensor:
    """A block table in the kernels' layout, a unit last stride (a copy where it has another)."""
    return block_table if block_table.stride(1) == 1 else block_table.contiguous()


def _pages_in_place(k_cache: torch.Tensor, v_cache: torch.Tensor, kernel: str | None, page_size: int) -> bool:
    """Whether the forward that runs reads the pages where they lie (registry.reads_pages): as one tensor of rows,
    each cache's (pages, page_size) dims merged into one."""
    if any(t.stride(0) != t.shape[1] * t.stride(1) for t in (k_cache, v_cache)):
        return False
    head_dims = (k_cache.shape[-1], v_cache.shape[-1])
    return registry.reads_pages(k_cache.device, kernel, *head_dims, page_size)


def _split_tail(
    split: splitkv.SplitPlan,
    first_rows: torch.Tensor,
    start: torch.Tensor | None,
    end: torch.Tensor,
    tail_keys: int,
    window_right: int,
    key_rows: int,
    cache: tuple | None = None,
) -> tuple[tuple[torch.Tensor, torch.Tensor], splitkv.Tail]:
    """Sequence b's keys, positions [start, end) of its rows from first_rows[b] (start None: 0), as the split path
    takes them under a right-bounded mask: the chunks of all but its last ``tail_keys`` (fewer where it holds
    fewer), which every query sees, and those last keys as the tail. ``cache``: (k_cache, v_cache, block_table,
    page_size) of a paged cache read where it lies, whose chunks must start on a page: the tail's keys are copied
    out of their pages (start None), or with ``tail_keys`` 0 (one query row or no mask, which sees every key) the
    chunks start at the first page boundary at or past start and the keys before it are the tail."""
    if cache is not None and not tail_keys:  # (fewer than a page, unmasked)
        boundary = torch.minimum((start + (cache[3] - 1)) // cache[3] * cache[3], end)
        tail = _page_rows(*cache, start, boundary - start, cache[3], -1)
        return split.key_chunks(first_rows + boundary, end - boundary, key_rows), tail
    count = end if start is None else end - start
    first = first_rows if start is None else first_rows + start
    in_tail = count.clamp(max=tail_keys)
    common = count - in_tail
    if cache is None:
        tail = splitkv.Tail(F.pad(first + common, (0, 1), value=key_rows), in_tail, tail_keys, window_right)
    else:
        tail = _page_rows(*cache, common, in_tail, tail_keys, window_right)
    return split.key_chunks(first, common, key_rows), tail


def _page_rows(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    page_size: int,
    first: torch.Tensor,
    count: torch.Tensor,
    width: int,
    window_right: int,
) -> splitkv.Tail:
    """The Tail of each sequence's positions first[b] .. first[b] + count[b] - 1 (count <= width) of a paged cache,
    copied into a packed batch of its own, sequence b's rows from b * width; attended under a bottom-right window
    (-1, window_right) (-1: none). Rows past count copy page 0's first row, which no sequence reads."""
    batch, device = block_table.shape[0], block_table.device
    offsets = splitkv.indices(width, device)
    used = offsets < count[:, None]
    positions = torch.where(used, first[:, None] + offsets, 0)
    pages = block_table.gather(1, positions // page_size).long()
    rows = torch.where(used, pages * page_size + positions % page_size, 0).flatten()
    keys, values = (t.view(-1, *t.shape[2:])[rows] for t in (k_cache, v_cache))
    cu_seqlens_k = splitkv.row_starts(batch + 1, width, device)
    return splitkv.Tail(cu_seqlens_k, count, width, window_right, keys, values)


def _gather_pages(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    page_block_size: int,
    start: torch.Tensor | None,
    end: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's pages in order, (batch, capacity, nheads_k, headdim) copies of k_cache and v_cache. A page
    that holds none of a sequence's keys [start, end) may have any value in block_table (flash_attn never reads
    it), so page 0 stands in for it; its rows are never attended. ``start`` None: 0."""
    page_starts = torch.arange(block_table.shape[1], device=block_table.device) * page_block_size
    first = page_starts[None] if start is None else torch.maximum(page_starts, start[:, None])
    used = first < torch.minimum(page_starts + page_block_size, end[:, None])
    pages = block_table.masked_fill(~used, 0).long()
    batch, capacity = block_table.shape[0], block_table.shape[1] * page_block_size
    return tuple(t[pages].view(batch, capacity, *t.shape[2:]) for t in (k_cache, v_cache))
