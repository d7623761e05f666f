"""Split-KV attention (flash-decoding): a few query rows against many keys, on the packed kernels of any family.

Decoding attends one or a few new query rows per sequence to a long key/value cache, so its cost is reading K and
V. Launched as it comes, one thread block per (sequence, query tile, head) holds a tile of 64-192 query rows with 1
to 4 of them used, and batch x heads such blocks leave most of the GPU waiting on too few K/V walks. Two changes
fill it, both as one packed variable-length launch (``interface.varlen_outputs``) and one combine:

- grouped-query packing: the query heads that share a kv head become rows of that kv head's tile, rows (position,
  head in the group), so a tile holds seqlen_q x group rows. A row's mask depends on its position, which packed
  rows no longer give the kernel, so only calls without a mask are packed (a single query row's mask is a range of
  keys, ``one_query_key_range``, which the callers cut before they come here);
- split-KV: each sequence's keys are cut into chunks, each one sequence of the packed batch (its queries copied per
  chunk), so batch x kv heads x splits thread blocks walk the keys; the splits' partial O and LSE then merge in
  fp32 (kernels/common/combine.py), which also writes flash_attn's layouts.

Nothing here reads a device value on the host: a call can be captured in a CUDA graph and replayed with new
lengths. ``num_splits`` says how the keys are cut; the measurements behind it are in docs/decoding.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
import torch.nn.functional as F

from flashcute.kernels import registry
from flashcute.kernels.common import prepost
from flashcute.kernels.launch import dtype_name, num_sms

KEY_TILE = 128
"""Split lengths are whole multiples of this many keys (the largest K/V tile), so only a sequence's last tile is
partial."""
MIN_SPLIT_KEYS = 512
"""No split is cut shorter: a walk of fewer K/V tiles barely pays for its partial O's write and read."""
MAX_SPLITS = 128
"""No more splits: the combine's loop over them runs in every row's threads."""
ROWS_PER_TILE = 128
"""Query rows of a forward tile as the split count reckons them (64 to 192 across the families' tiles)."""
WAVE_FILL = 0.9
"""The share of the SMs a split count's walks must keep busy in every wave (docs/decoding.md, How many splits)."""


def num_splits(tiles: int, max_keys: int, sms: int) -> int:
    """How many chunks each sequence's keys are cut into, for ``tiles`` (sequence, kv head, query tile) walks of up
    to ``max_keys`` keys on ``sms`` SMs: the fewest whose walks fill whole waves of the SMs (WAVE_FILL; walks of one
    call are about as long, so a last wave that few walks share leaves the other SMs idle for a walk's time), or the
    count that fills them best; none shorter than MIN_SPLIT_KEYS, at most MAX_SPLITS; 1 when the query side fills
    the GPU already."""
    if tiles >= sms:
        return 1
    most = max(1, min(math.ceil(max_keys / MIN_SPLIT_KEYS), MAX_SPLITS))
    fill = [tiles * s / (sms * math.ceil(tiles * s / sms)) for s in range(1, most + 1)]
    return next((s for s, f in enumerate(fill, 1) if f >= WAVE_FILL), fill.index(max(fill)) + 1)


def packed_tiles(batch: int, seqlen_q: int, nheads: int, nheads_k: int) -> int:
    """The (sequence, kv head, query tile) walks of a grouped-query-packed call."""
    return batch * nheads_k * math.ceil(seqlen_q * (nheads // nheads_k) / ROWS_PER_TILE)


def one_query_key_range(position: int, seqlen_k: int, window_left: int, window_right: int) -> tuple[int, int]:
    """The keys [lo, hi) that a single query at key position ``position`` sees through a window (-1: unbounded;
    causal is window_right = 0): its mask as a range, so that it runs unmasked."""
    lo = 0 if window_left < 0 else min(max(position - window_left, 0), seqlen_k)
    hi = seqlen_k if window_right < 0 else min(max(position + window_right + 1, 0), seqlen_k)
    return lo, max(lo, hi)


class SplitPlan:
    """How the calls of one kind (sizes, device, split count asked) run on the split-KV path: the split count and
    length, and the launch's constant index tensors, made at its first call (``plan`` makes each once)."""

    def __init__(self, batch: int, seqlen_q: int, nheads: int, nheads_k: int, max_keys: int, splits: int, device):
        self.batch, self.seqlen_q, self.nheads_k, self.device = batch, seqlen_q, nheads_k, device
        self.group = nheads // nheads_k
        self.rows = seqlen_q * self.group  # a sequence's packed query rows
        if splits == 0:
            splits = num_splits(packed_tiles(batch, seqlen_q, nheads, nheads_k), max_keys, num_sms(device))
        self.chunk = KEY_TILE * max(1, math.ceil(max_keys / (splits * KEY_TILE)))
        self.splits = max(1, math.ceil(max_keys / self.chunk))  # none left empty by the rounding
        self.max_keys = max_keys
        self._offsets: torch.Tensor | None = None
        self._query_rows: tuple[torch.Tensor, torch.Tensor] | None = None
        self._constant_chunks: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._constant_tails: dict[tuple[int, int, int, int], Tail] = {}
        self._appended: dict[int, torch.Tensor] = {}

    def key_chunks(
        self, first_key: torch.Tensor, key_count: torch.Tensor, key_rows: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(cu_seqlens_k, seqused_k) of the packed batch: sequence (b, s) is chunk s of sequence b's keys, rows
        first_key[b] .. first_key[b] + key_count[b] - 1 (int32 (batch,), key_count[b] <= max_keys) of the
        ``key_rows`` rows of keys; a chunk past the keys is empty and starts at their end, so the starts stay in
        order."""
        if self.splits == 1:  # the keys as they are
            return F.pad(first_key, (0, 1), value=key_rows), key_count
        offsets = self.offsets()
        starts = first_key[:, None] + torch.minimum(offsets, key_count[:, None])
        used = (key_count[:, None] - offsets).clamp_(0, self.chunk)
        return F.pad(starts.flatten(), (0, 1), value=key_rows), used.flatten()

    def offsets(self) -> torch.Tensor:
        """int32 (splits,): where each chunk starts in its sequence's keys, s * chunk (made once)."""
        offsets = self._offsets
        if offsets is None:
            offsets = torch.arange(0, self.splits * self.chunk, self.chunk, dtype=torch.int32, device=self.device)
            self._offsets = _kept(offsets)
        return offsets

    def query_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(cu_seqlens_q, seqused_q) of the packed batch, made once: int32 (batch * splits + 1,), where each
        (sequence, chunk) pair's packed query rows start, and its view (batch * splits,) from the second on, where
        they end (the rows a pair uses are all of its rows)."""
        rows = self._query_rows
        if rows is None:
            cu_seqlens_q = row_starts(self.batch * self.splits + 1, self.rows, self.device)
            rows = (cu_seqlens_q, cu_seqlens_q[1:])
            if _kept(cu_seqlens_q) is not None:
                self._query_rows = rows
        return rows

    def constant_chunks(self, seq_rows: int, first: int, last: int) -> tuple[torch.Tensor, torch.Tensor]:
        """key_chunks when every sequence attends its keys first .. last - 1, sequence b's rows starting at b *
        seq_rows (a cache filled to one length): the same tensors at every such call, made once (a few lengths
        kept; a length that changes every call makes them anew, as key_chunks would)."""
        key = (seq_rows, first, last)
        chunks = self._constant_chunks.get(key)
        if chunks is None:
            starts = row_starts(self.batch, seq_rows, self.device)
            count = filled(self.batch, last - first, self.device)
            chunks = self.key_chunks(starts + first if first else starts, count, self.batch * seq_rows)
            _remember(self._constant_chunks, key, chunks, chunks[0])
        return chunks

    def constant_tail(
        self, seq_rows: int, last: int, tail_keys: int, window_right: int
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], Tail]:
        """Every sequence's keys 0 .. last - 1 (rows from b * seq_rows) under a right-bounded mask: the chunks of all
        but the last ``tail_keys`` (fewer where there are fewer), which every query sees (constant_chunks'), and
        those last keys as the Tail under the kernels' window (-1, window_right); made once, as constant_chunks'."""
        in_tail = min(last, tail_keys)
        key = (seq_rows, last, tail_keys, window_right)
        tail = self._constant_tails.get(key)
        if tail is None:
            starts = row_starts(self.batch, seq_rows, self.device) + (last - in_tail)
            cu_seqlens_k = F.pad(starts, (0, 1), value=self.batch * seq_rows)
            tail = Tail(cu_seqlens_k, filled(self.batch, in_tail, self.device), tail_keys, window_right)
            _remember(self._constant_tails, key, tail, cu_seqlens_k)
        return self.constant_chunks(seq_rows, 0, last - in_tail), tail

    def appended_chunks(self, seq_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """key_chunks for a cache indexed by batch, sequence b's keys at rows b * seq_rows on, min(lengths[b] +
        seqlen_new, seq_rows) of them (lengths: each cache's keys before seqlen_new new ones; seq_rows at least
        max_keys): (cu_seqlens_k, counts), counts an empty int32 (batch, splits) that prepost.append fills on the
        device, counts[b, s] = max(lengths[b] + seqlen_new - s * chunk, 0). Chunk s of sequence b starts at row b *
        seq_rows + s * chunk at every call (where key_chunks moves a chunk past the keys to their end), so the
        starts are made once, and each chunk's span, up to the next start, is at most chunk keys and none past the
        sequence's rows: the kernels read min(span, count) keys of a chunk, so a count needs no upper bound."""
        cu_seqlens_k = self._appended.get(seq_rows)
        if cu_seqlens_k is None:
            starts = row_starts(self.batch, seq_rows, self.device)[:, None] + self.offsets()
            cu_seqlens_k = F.pad(starts.flatten(), (0, 1), value=self.batch * seq_rows)
            _remember(self._appended, seq_rows, cu_seqlens_k, cu_seqlens_k)
        return cu_seqlens_k, self.offsets().new_empty((self.batch, self.splits))

    def appended_tail(
        self, seq_rows: int, tail_keys: int, window_right: int
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor, Tail]:
        """appended_chunks for the keys before each sequence's last ``tail_keys`` (fewer where it holds fewer),
        which several query rows see under a right-bounded mask: (cu_seqlens_k, counts), an empty int32 (2, batch +
        1) that prepost.append fills on the device beside the counts (row 0 where the tail's keys start, its
        launch's cu_seqlens_k; row 1 how many there are), and the Tail that reads it, under the kernels' window (-1,
        window_right)."""
        cu_seqlens_k, counts = self.appended_chunks(seq_rows)
        rows = counts.new_empty((2, self.batch + 1))
        return (cu_seqlens_k, counts), rows, Tail(rows[0], rows[1, : self.batch], tail_keys, window_right)

    def attention(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        key_chunks: tuple[torch.Tensor, torch.Tensor],
        softmax_scale: float,
        kernel: str,
        softcap: float = 0.0,
        learnable_sink: torch.Tensor | None = None,
        tail: Tail | None = None,
        pages: tuple = (),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Unmasked attention of q (batch, seqlen_q, nheads, headdim) to the rows of keys and values (rows,
        nheads_k, headdim; values may have a head dim of their own) that ``key_chunks`` name, ``kernel`` a family
        name or "auto", scores capped by ``softcap`` (> 0), ``learnable_sink`` (nheads,) in every row's denominator
        (joined by the combine, where each row's head is known), and the keys of ``tail`` under its mask; ``pages``:
        keys and values are a cache's pages, read where they lie (interface.varlen_outputs). Returns
        out (batch, seqlen_q, nheads, values' head dim) and lse (batch, nheads, seqlen_q) float32; a query with no
        key gets O = 0 and LSE = -inf (the sink, with one). Validated inputs only (the callers' checks)."""
        from flashcute.interface import kernel_sink

        batch, seqlen_q, nheads, headdim = q.shape
        nheads_k, group, rows, splits = self.nheads_k, self.group, self.rows, self.splits
        headdim_v = values.shape[-1]
        out = q.new_empty((batch, seqlen_q, nheads, headdim_v))
        lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q.device)
        sink = kernel_sink(learnable_sink)
        if self.max_keys == 0 or q.numel() == 0:
            if sink is None:
                lse.fill_(-math.inf)
            else:
                lse.copy_(sink[:, None].expand(nheads, seqlen_q))
            return out.zero_(), lse
        # sequence (b, s) of the packed batch: the queries of b, packed by kv head, and chunk s of b's keys
        queries = q.view(batch, 1, seqlen_q, nheads_k, group, headdim).transpose(3, 4)
        queries = queries.expand(batch, splits, seqlen_q, group, nheads_k, headdim)
        queries = queries.reshape(1, batch * splits * rows, nheads_k, headdim)  # (the launch's batch of one)
        partial_out, partial_lse = self.attend(queries, keys, values, key_chunks, softmax_scale, kernel, softcap, pages)
        partial_out = partial_out.view(batch, splits, rows, nheads_k, headdim_v)
        partial_lse = partial_lse.view(nheads_k, batch, splits, rows)
        if tail is not None:
            partial_out, partial_lse = self._with_tail(
                q, keys, values, tail, partial_out, partial_lse, softmax_scale, kernel, softcap, pages
            )
        prepost.combine(
            partial_out,
            partial_lse,
            out.view(batch * seqlen_q, nheads_k, group, headdim_v).transpose(1, 2),
            lse.view(batch, nheads_k, group, seqlen_q),
            None if sink is None else sink.view(nheads_k, group),
        )
        return out, lse

    def attend(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        key_chunks: tuple[torch.Tensor, torch.Tensor],
        softmax_scale: float,
        kernel: str,
        softcap: float,
        pages: tuple,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The packed launch of the (sequence, chunk) pairs' queries (1, rows, nheads_k, headdim), unmasked
        (interface.varlen_outputs' launch for validated, non-empty inputs, without its general cases: a decoding
        call's host time is mostly such steps): partial out (1, rows, nheads_k, values' head dim) and partial lse
        (1, nheads_k, rows) float32. Each tensor operation costs the host a few microseconds, so the tensors are
        made in the launch's layouts, not viewed into them."""
        cu_seqlens_q, seqused_q = self.query_rows()
        total, headdim_v = queries.shape[1], values.shape[-1]
        partial_out = queries.new_empty((1, total, self.nheads_k, headdim_v))
        partial_lse = queries.new_empty((1, self.nheads_k, total), dtype=torch.float32)
        scores = {"softcap": softcap > 0, "head_dim_v": headdim_v, "page_size": pages[1] if pages else 0}
        name, dtype = None if kernel == "auto" else kernel, dtype_name(queries)
        launch = registry.forward_launcher(self.device, dtype, queries.shape[-1], -1, -1, name, True, **scores)
        if keys.data_ptr() % 16 or values.data_ptr() % 16:  # (the kernels' 128-bit loads: a copy that starts on one)
            from flashcute.interface import aligned_inputs

            keys, values = aligned_inputs(keys, values)
        packed = (cu_seqlens_q, key_chunks[0], seqused_q, key_chunks[1], self.rows, self.chunk)
        paged = {"pages": pages} if pages else {}
        launch(
            queries, keys[None], values[None], partial_out, partial_lse, softmax_scale, 0, packed,
            softcap, None, None, **paged,
        )  # fmt: skip
        return partial_out, partial_lse

    def _with_tail(self, q, keys, values, tail, partial_out, partial_lse, softmax_scale, kernel, softcap, pages):
        """The splits' partial O and LSE with the tail's as one more split: the tail's keys attended by a masked
        packed launch of q's rows as they lie (a mask needs each row's position, which packed rows do not give the
        kernels), its O and LSE then laid out as the packed rows' (position, head in the group)."""
        from flashcute.interface import varlen_outputs

        batch, seqlen_q, nheads, headdim = q.shape
        nheads_k, group, splits, headdim_v = self.nheads_k, self.group, self.splits, values.shape[-1]
        cu_seqlens_q = row_starts(batch + 1, seqlen_q, self.device)
        if tail.keys is not None:  # a copy of its own, not in the split's keys (nor in their pages)
            keys, values, pages = tail.keys, tail.values, ()
        tail_out, tail_lse = varlen_outputs(
            q.reshape(batch * seqlen_q, nheads, headdim), keys, values, cu_seqlens_q, tail.cu_seqlens_k, None,
            tail.seqused_k, seqlen_q, tail.max_keys, softmax_scale, -1, tail.window_right, kernel, softcap, pages=pages,
        )  # fmt: skip
        tail_out = tail_out.view(batch, 1, seqlen_q, nheads_k, group, headdim_v).transpose(3, 4)
        out = torch.cat((partial_out.view(batch, splits, seqlen_q, group, nheads_k, headdim_v), tail_out), dim=1)
        tail_lse = tail_lse.view(nheads_k, group, batch, 1, seqlen_q).permute(0, 2, 3, 4, 1)
        lse = torch.cat((partial_lse.view(nheads_k, batch, splits, seqlen_q, group), tail_lse), dim=2)
        return out.view(batch, splits + 1, self.rows, nheads_k, headdim_v), lse.view(nheads_k, batch, splits + 1, -1)


@dataclasses.dataclass(frozen=True)
class Tail:
    """Keys of each sequence attended by a launch of their own beside the split chunks, merged as one more split:
    its last keys, which its several query rows see under a right-bounded mask (causal, bottom-right) where they
    see every key before them alike (``tail_keys``), or keys a paged cache's chunks leave out (kvcache.py).
    ``seqused_k`` (batch,) of them from ``cu_seqlens_k``'s starts (batch + 1,), at most ``max_keys``, under the
    kernels' window (-1, window_right) aligned bottom-right (-1: none); in ``keys`` and ``values`` where they are
    a copy of their own, else in the split's."""

    cu_seqlens_k: torch.Tensor
    seqused_k: torch.Tensor
    max_keys: int
    window_right: int
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None


def tail_keys(seqlen_q: int, window_left: int, window_right: int) -> int:
    """How many of a sequence's last keys its seqlen_q queries see in part under a mask that a kernel window
    (window_left, window_right) aligned bottom-right makes: query p of seqlen_q sees key j of seqlen_k keys when
    j <= p + seqlen_k - seqlen_q + window_right, so every query sees the keys up to seqlen_k - seqlen_q +
    window_right alike, and the seqlen_q - 1 - window_right after them are a tail that, as keys of their own
    (seqlen_k' of them), the same window_right aligned bottom-right masks as before. 0 when every query sees the
    same keys (no mask, one query, window_right >= seqlen_q - 1); None where a left window bounds the keys too."""
    if window_left >= 0 and seqlen_q > 1:
        return None
    return max(seqlen_q - 1 - window_right, 0) if window_right >= 0 else 0


@functools.lru_cache(maxsize=256)
def plan(batch: int, seqlen_q: int, nheads: int, nheads_k: int, max_keys: int, splits: int, device) -> SplitPlan:
    """The SplitPlan of these sizes on ``device``: ``splits`` chunks of up to ``max_keys`` keys a sequence (0:
    ``num_splits``'s choice)."""
    return SplitPlan(batch, seqlen_q, nheads, nheads_k, max_keys, splits, device)


_constants: dict[tuple, torch.Tensor] = {}


def row_starts(batch: int, rows: int, device) -> torch.Tensor:
    """int32 (batch,): b * rows, where sequence b starts in a (batch * rows, ...) view of a batch."""
    return _constant(("row_starts", batch, rows, device), lambda: torch.arange(0, batch * rows, rows, device=device))


def filled(batch: int, value: int, device) -> torch.Tensor:
    """int32 (batch,) of ``value``: a length every sequence shares. Read only, as row_starts'."""
    return _constant(("filled", batch, value, device), lambda: torch.full((batch,), value, device=device))


def indices(count: int, device) -> torch.Tensor:
    """int64 (count,): 0 .. count - 1, as tensor indexing takes them. Read only, as row_starts'."""
    return _constant(("indices", count, device), lambda: torch.arange(count, device=device), torch.int64)


def _constant(key: tuple, make, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """The tensor ``make()`` gives, as ``dtype``, made once per key (not kept while a CUDA graph is captured, and
    made in the graph where torch.compile traces the caller); callers never write it."""
    if torch.compiler.is_compiling():
        return make().to(dtype)
    t = _constants.get(key)
    if t is None:
        t = make().to(dtype)
        _remember(_constants, key, t, t, most=256)  # (a program has a few cache shapes)
    return t


def _remember(store: dict, key, value, tensor: torch.Tensor, most: int = 8) -> None:
    """``store[key] = value`` for later calls, unless ``tensor`` (one of value's) was made while a CUDA graph is
    being captured (_kept); a few kept: past ``most`` keys the store starts over (lengths that change every call)."""
    if _kept(tensor) is not None:
        if len(store) >= most:
            store.clear()
        store[key] = value


def _kept(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` to keep for later calls, or None while a CUDA graph is being captured (the graph's memory pool holds
    it, and may hand it to another tensor once the capture ends)."""
    return None if t.is_cuda and torch.cuda.is_current_stream_capturing() else t
