"""flash_attn_with_kvcache on CPU: the argument checks, the rotary embedding against its formula, and everything
around the attention (rotary positions, the in-place append, packing, cu_seqlens, seqused, cache_leftpad,
cache_batch_idx, pages, grouped-query packing and split-KV) with the packed launch and the combine replaced by
float64 stand-ins that read a packed batch by the kernels' rule, against attention_kvcache_ref."""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import flashcute
from flashcute import interface, kvcache, splitkv
from flashcute.kernels import registry
from flashcute.kernels.common import prepost
from flashcute.kvcache import apply_rotary, flash_attn_with_kvcache
from flashcute.reference import attention_kvcache_ref
from flashcute.validation import KvcacheArgs, validate_kvcache_args
from tests.helpers import append_plainly


def keys_per_sequence(calls: list[dict], batch: int) -> list[int]:
    """The keys each sequence attended over the calls of one step (the splits' and the tail's), each call a packed
    batch of batch x splits sequences."""
    total = [0] * batch
    for call in calls:
        lengths = call["lengths_k"]
        splits = len(lengths) // batch
        for b in range(batch):
            total[b] += sum(lengths[b * splits : (b + 1) * splits])
    return total


def check_tail_call(calls: list[dict], seqlen_q: int) -> None:
    """One attention call a step, or two where some keys go to a launch of their own (splitkv.Tail: the tail of
    several masked rows, a paged cache's keys before its first page boundary): the second reads q's rows as they
    lie, not packed by kv head."""
    assert len(calls) in (1, 2), "one attention call, and one for the tail's keys"
    if len(calls) == 2:
        assert calls[1]["q"].shape[0] == len(calls[1]["lengths_q"]) * seqlen_q, "the tail's q rows as they lie"


def queries_of(call: dict, shape: tuple[int, ...]) -> torch.Tensor:
    """The launch's q as (batch, seqlen_q, nheads, headdim): unpacked from the split path's rows (sequence (b,
    split), row (position, head in the group), kv head) or, from the plain packed launch, a view."""
    batch, seqlen_q, nheads, headdim = shape
    q = call["q"]
    if q.shape[1] == nheads:
        return q.view(shape)
    nheads_k = q.shape[1]
    group = nheads // nheads_k
    packed = q.view(batch, -1, seqlen_q, group, nheads_k, headdim)
    for split in range(1, packed.shape[1]):
        assert torch.equal(packed[:, split], packed[:, 0]), "every split of a sequence reads its queries"
    return packed[:, 0].transpose(2, 3).reshape(shape)


def rotate_plainly(x, cos, sin, positions, interleaved: bool) -> torch.Tensor:
    """x (batch, seqlen, nheads, headdim) in float64 with each feature pair (a, c) of token (b, s) turned by
    angle j of position positions[b][s], one pair at a time."""
    out = x.double().clone()
    half = cos.shape[1]
    for b, s in itertools.product(range(x.shape[0]), range(x.shape[1])):
        p = int(positions[b][s])
        for j in range(half):
            a, c = (2 * j, 2 * j + 1) if interleaved else (j, j + half)
            xa, xc, cj, sj = x[b, s, :, a].double(), x[b, s, :, c].double(), float(cos[p, j]), float(sin[p, j])
            out[b, s, :, a] = xa * cj - xc * sj
            out[b, s, :, c] = xa * sj + xc * cj
    return out


def rotary_tables(seqlen_ro: int, half: int, dtype=torch.float64, seed: int = 0):
    angles = torch.rand(seqlen_ro, half, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 6.3
    return angles.cos().to(dtype), angles.sin().to(dtype)


# ---- the rotary embedding --------------------------------------------------------------------------------------


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("rotary_dim", [2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_apply_rotary_matches_the_rotation_formula(interleaved, rotary_dim, dtype):
    generator = torch.Generator().manual_seed(rotary_dim)
    x = torch.randn(2, 3, 2, 8, generator=generator, dtype=torch.float64).to(dtype)
    cos, sin = rotary_tables(7, rotary_dim // 2, dtype)
    positions = torch.randint(0, 7, (2, 3), generator=generator)
    got = apply_rotary(x, cos, sin, positions, interleaved)
    want = rotate_plainly(x, cos, sin, positions.tolist(), interleaved)
    assert got.dtype == dtype and got.shape == x.shape
    if dtype == torch.float64:
        torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
    else:  # computed in float32, then rounded once to x's dtype
        torch.testing.assert_close(got, want.to(dtype))
    assert torch.equal(got[..., rotary_dim:], x[..., rotary_dim:]), "features past rotary_dim pass through"


def test_interleaved_and_half_split_pairs_differ():
    x = torch.arange(8, dtype=torch.float64).reshape(1, 1, 1, 8)
    cos, sin = torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)  # a quarter turn
    positions = torch.zeros(1, 1, dtype=torch.long)
    assert apply_rotary(x, cos, sin, positions, True).flatten().tolist() == [-1, 0, -3, 2, 4, 5, 6, 7]
    assert apply_rotary(x, cos, sin, positions, False).flatten().tolist() == [-2, -3, 0, 1, 4, 5, 6, 7]


CAPACITY = 8


@pytest.mark.parametrize(
    "causal, window, per_row",
    [
        (False, (-1, -1), False),
        (True, (-1, -1), True),
        (False, (2, -1), True),
        (False, (-1, 0), True),
        (False, (CAPACITY - 1, -1), True),
        (False, (CAPACITY, -1), False),  # a window as wide as the cache hides no key: not local
        (False, (-1, CAPACITY + 3), False),
    ],
)
@pytest.mark.parametrize("interleaved", [True, False])
def test_rotary_positions_follow_flash_attn(stand_in, causal, window, per_row, interleaved):
    """New key i of sequence b at cache position cache_seqlens[b] + i; query i there too when causal or local,
    else every query at cache_seqlens[b]; cache_leftpad does not shift them."""
    generator = torch.Generator().manual_seed(3)
    batch, seqlen_q, seqlen_new, headdim = 2, 3, 2, 8
    q = torch.randn(batch, seqlen_q, 2, headdim, generator=generator, dtype=torch.float64)
    k_cache, v_cache, k, v = (
        torch.randn(*shape, generator=generator, dtype=torch.float64)
        for shape in [(batch, CAPACITY, 1, headdim)] * 2 + [(batch, seqlen_new, 1, headdim)] * 2
    )
    cos, sin = rotary_tables(CAPACITY + seqlen_q, 3)
    filled = [2, 5]
    flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, cos, sin, torch.tensor(filled, dtype=torch.int32),
        cache_leftpad=torch.tensor([1, 0], dtype=torch.int32), causal=causal, window_size=window,
        rotary_interleaved=interleaved,
    )  # fmt: skip
    q_positions = [[n + (i if per_row else 0) for i in range(seqlen_q)] for n in filled]
    rotated_q = queries_of(stand_in.calls[0], q.shape)
    torch.testing.assert_close(rotated_q, rotate_plainly(q, cos, sin, q_positions, interleaved), rtol=0, atol=1e-14)
    k_positions = [[n + i for i in range(seqlen_new)] for n in filled]
    rotated_k = rotate_plainly(k, cos, sin, k_positions, interleaved)
    for b, i in itertools.product(range(batch), range(seqlen_new)):
        torch.testing.assert_close(k_cache[b, filled[b] + i], rotated_k[b, i], rtol=0, atol=1e-14)
        assert torch.equal(v_cache[b, filled[b] + i], v[b, i])
    check_tail_call(stand_in.calls, seqlen_q)
    assert keys_per_sequence(stand_in.calls, batch) == [filled[0] + seqlen_new - 1, filled[1] + seqlen_new]


# ---- the whole call against attention_kvcache_ref --------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One drawn call: the cache layout ("batch", "batch_idx" or "paged"), sizes, lengths and options."""

    layout: str
    batch: int
    seqlen_q: int
    nheads: int
    nheads_k: int
    headdim: int
    batch_cache: int  # cache rows, or pages for "paged"
    page: int  # page_block_size; the capacity for the other layouts
    pages_per_seq: int
    seqlen_new: int | None  # None: no k and v
    filled: list[int] | None  # cache_seqlens
    seqlens_as_int: bool
    leftpad: list[int] | None
    rotary: tuple[int, bool] | None  # (rotary_dim, interleaved)
    strided: bool  # the caches are views into wider tensors
    junk_pages: bool  # block_table entries for pages no sequence reads hold out-of-range values
    options: dict
    seed: int

    @property
    def capacity(self) -> int:
        return self.page * self.pages_per_seq

    def build(self, dtype: torch.dtype = torch.float64, device: str = "cpu") -> tuple[dict, dict]:
        """(the call's keyword arguments, {"k": k buffer, "v": v buffer, "region": the caches' index in them}),
        drawn from the case's seed in float64 and then put in ``dtype`` on ``device``."""
        generator = torch.Generator().manual_seed(self.seed)

        def randn(*shape):
            return torch.randn(*shape, generator=generator, dtype=torch.float64).to(device, dtype)

        length = self.page if self.layout == "paged" else self.capacity
        extra = (2, 1) if self.strided else (0, 0)
        buffers = {
            name: randn(self.batch_cache, length + extra[0], self.nheads_k + extra[1], self.headdim) for name in "kv"
        }
        region = (slice(None), slice(extra[0], None), slice(0, self.nheads_k))
        inputs = {
            "q": randn(self.batch, self.seqlen_q, self.nheads, self.headdim),
            "k_cache": buffers["k"][region],
            "v_cache": buffers["v"][region],
            **self.options,
        }
        if self.seqlen_new is not None:
            inputs["k"], inputs["v"] = (randn(self.batch, self.seqlen_new, self.nheads_k, self.headdim) for _ in "kv")
        if self.filled is not None:
            as_tensor = torch.tensor(self.filled, dtype=torch.int32, device=device)
            inputs["cache_seqlens"] = self.filled[0] if self.seqlens_as_int else as_tensor
        if self.leftpad is not None:
            inputs["cache_leftpad"] = torch.tensor(self.leftpad, dtype=torch.int32, device=device)
        if self.layout == "batch_idx":
            order = torch.randperm(self.batch_cache, generator=generator)
            inputs["cache_batch_idx"] = order[: self.batch].int().to(device)
        if self.layout == "paged":
            order = torch.randperm(self.batch_cache, generator=generator)[: self.batch * self.pages_per_seq]
            table = order.view(self.batch, self.pages_per_seq).int()
            if self.junk_pages:
                for b, j in itertools.product(range(self.batch), range(self.pages_per_seq)):
                    if not self.page_in_use(b, j):
                        table[b, j] = [-5, self.batch_cache + 3][(b + j) % 2]
            inputs["block_table"] = table.to(device)
        if self.rotary is not None:
            rotary_dim, inputs["rotary_interleaved"] = self.rotary
            tables = rotary_tables(self.capacity + self.seqlen_q + 1, rotary_dim // 2, dtype, self.seed)
            inputs["rotary_cos"], inputs["rotary_sin"] = (t.to(device) for t in tables)
        return inputs, {**buffers, "region": region}

    def key_range(self, b: int) -> range:
        end = self.capacity if self.filled is None else self.filled[b] + (self.seqlen_new or 0)
        return range(0 if self.leftpad is None else self.leftpad[b], end)

    def attended(self, b: int) -> int:
        """How many keys the launch reads for sequence b: its key range, cut to the window of a single query (on the
        split path; with ALiBi, which never splits, the kernel masks the window)."""
        keys = len(self.key_range(b))
        window_left = self.options.get("window_size", (-1, -1))[0]
        cut = self.seqlen_q == 1 and window_left >= 0 and "alibi_slopes" not in self.options
        return min(keys, window_left + 1) if cut else keys

    def page_in_use(self, b: int, j: int) -> bool:
        keys, new = self.key_range(b), self.new_positions(b)
        return any(j * self.page <= p < (j + 1) * self.page for p in itertools.chain(keys, new))

    def new_positions(self, b: int) -> range:
        return range(0) if self.seqlen_new is None else range(self.filled[b], self.filled[b] + self.seqlen_new)

    def slot(self, inputs: dict, b: int, p: int) -> tuple[int, int]:
        """Where position p of sequence b lies in the caches: (index into shape[0], index into shape[1])."""
        if self.layout == "paged":
            return int(inputs["block_table"][b, p // self.page]), p % self.page
        return (b if self.layout == "batch" else int(inputs["cache_batch_idx"][b])), p

    def written(self, inputs: dict) -> torch.Tensor:
        """(cache.shape[0], cache.shape[1]) bool: the slots that the new keys and values go to."""
        mask = torch.zeros(inputs["k_cache"].shape[:2], dtype=torch.bool)
        for b in range(self.batch):
            for p in self.new_positions(b):
                mask[self.slot(inputs, b, p)] = True
        return mask

    @property
    def q_positions_per_row(self) -> bool:
        """flash_attn's rule: q's rotary positions go row by row when the mask is causal or local (a window side
        in [0, capacity))."""
        window = self.options.get("window_size", (-1, -1))
        return self.options.get("causal", False) or any(0 <= side < self.capacity for side in window)


def fill_values(capacity: int, page: int, seqlen_new: int):
    """Cache lengths with room for seqlen_new more keys, often at the edges: 0, 1, page edges, full."""
    room = capacity - seqlen_new
    edges = [0, 1, page - 1, page, page + 1, room - 1, room]
    return st.one_of(st.sampled_from([n for n in edges if 0 <= n <= room]), st.integers(0, room))


@st.composite
def cases(draw) -> Case:
    layout = draw(st.sampled_from(["batch", "batch_idx", "paged"]))
    batch = draw(st.integers(1, 3))
    nheads_k = draw(st.integers(1, 2))
    if layout == "paged":
        page, pages_per_seq = draw(st.sampled_from([1, 2, 3, 4])), draw(st.integers(1, 4))
        batch_cache = batch * pages_per_seq + draw(st.integers(0, 3))
    else:
        page, pages_per_seq = draw(st.integers(1, 10)), 1
        batch_cache = batch + draw(st.integers(0, 2))
    capacity = page * pages_per_seq
    seqlen_new = draw(st.one_of(st.none(), st.integers(0, min(3, capacity))))
    seqlen_q = draw(st.integers(1, 4 if seqlen_new is None else min(4, capacity)))
    if seqlen_new is None and draw(st.booleans()):
        filled = None
    else:
        filled = draw(st.lists(fill_values(capacity, page, seqlen_new or 0), min_size=batch, max_size=batch))
    seqlens_as_int = filled is not None and draw(st.booleans())
    if seqlens_as_int:
        filled = [filled[0]] * batch
    leftpad = None
    if draw(st.booleans()):
        leftpad = [draw(st.integers(0, capacity if filled is None else filled[b])) for b in range(batch)]
    headdim = draw(st.sampled_from([8, 16, 5, 12]))  # (5, 12: not multiples of 8, run on zero-padded copies)
    rotary = None
    if seqlen_new is not None and draw(st.booleans()):
        rotary = (2 * draw(st.integers(1, headdim // 2)), draw(st.booleans()))
    window = draw(st.sampled_from([(-1, -1), (-1, -1), (0, 0), (2, -1), (-1, 1), (1, 3), (capacity, -1)]))
    options = {
        "causal": draw(st.booleans()),
        "window_size": window,
        "softmax_scale": draw(st.sampled_from([None, 0.7])),
        "num_splits": draw(st.sampled_from([0, 1, 3])),
        "softcap": draw(st.sampled_from([0.0, 0.0, 2.5])),
    }
    nheads = nheads_k * draw(st.integers(1, 3))
    if draw(st.integers(0, 3)) == 0:  # sinks exact in float32, the kernels' precision of them
        values = st.sampled_from([-math.inf, -2.5, 0.0, 1.25, 40.0])
        sinks = draw(st.lists(values, min_size=nheads, max_size=nheads))
        options["learnable_sink"] = torch.tensor(sinks, dtype=torch.float64)
    if draw(st.integers(0, 3)) == 0:  # ALiBi: per head, or per sequence and head
        shape = draw(st.sampled_from([(nheads,), (batch, nheads)]))
        slopes = draw(st.lists(st.floats(0.0, 2.0), min_size=math.prod(shape), max_size=math.prod(shape)))
        options["alibi_slopes"] = torch.tensor(slopes, dtype=torch.float64).reshape(shape)
    return Case(
        layout=layout,
        batch=batch,
        seqlen_q=seqlen_q,
        nheads=nheads,
        nheads_k=nheads_k,
        headdim=headdim,
        batch_cache=batch_cache,
        page=page,
        pages_per_seq=pages_per_seq,
        seqlen_new=seqlen_new,
        filled=filled,
        seqlens_as_int=seqlens_as_int,
        leftpad=leftpad,
        rotary=rotary,
        strided=draw(st.booleans()),
        junk_pages=layout == "paged" and draw(st.booleans()),
        options=options,
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_matches_the_reference_and_writes_only_the_new_slots(stand_in, case):
    inputs, buffers = case.build()
    before = {name: buffers[name].clone() for name in "kv"}
    ref_inputs = {name: value for name, value in inputs.items() if name != "num_splits"}
    ref_out, ref_lse, ref_k_cache, ref_v_cache = attention_kvcache_ref(**ref_inputs)
    assert torch.equal(buffers["k"], before["k"]), "the reference must leave the caches alone"
    stand_in.calls.clear()

    out, lse = flash_attn_with_kvcache(**inputs, return_lse=True)

    check_tail_call(stand_in.calls, case.seqlen_q)
    assert out.shape == (case.batch, case.seqlen_q, case.nheads, case.headdim) and out.dtype == torch.float64
    assert lse.shape == (case.batch, case.nheads, case.seqlen_q) and lse.is_contiguous()
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    empty = ref_lse == -math.inf
    assert torch.equal(lse == -math.inf, empty), "exactly the queries that see no key have LSE = -inf"
    torch.testing.assert_close(lse[~empty].float(), ref_lse[~empty].float())  # the stand-in's LSE is float64
    assert keys_per_sequence(stand_in.calls, case.batch) == [case.attended(b) for b in range(case.batch)]

    region, written = buffers["region"], case.written(inputs)
    for name, ref_cache in (("k", ref_k_cache), ("v", ref_v_cache)):
        outside = torch.ones_like(buffers[name], dtype=torch.bool)
        outside[region] = False
        assert torch.equal(buffers[name][outside], before[name][outside]), f"{name}: a row outside the cache changed"
        cache, cache_before = buffers[name][region], before[name][region]
        assert torch.equal(cache[~written], cache_before[~written]), f"{name}_cache changed outside the new slots"
        torch.testing.assert_close(cache[written], ref_cache[written], rtol=0, atol=1e-14 if case.rotary else 0)
    if case.layout == "batch" and not case.strided and case.headdim % 8 == 0:  # read where it lies: a view of k_cache
        assert stand_in.calls[0]["k"].data_ptr() == inputs["k_cache"].data_ptr()


def test_a_repeated_cache_batch_idx_reads_the_same_row(stand_in):
    generator = torch.Generator().manual_seed(5)
    q = torch.randn(3, 2, 2, 8, generator=generator, dtype=torch.float64)
    k_cache, v_cache = (torch.randn(2, 6, 1, 8, generator=generator, dtype=torch.float64) for _ in "kv")
    inputs = {
        "cache_seqlens": torch.tensor([4, 6, 2], dtype=torch.int32),
        "cache_batch_idx": torch.tensor([1, 1, 1], dtype=torch.int32),
        "cache_leftpad": torch.tensor([0, 3, 1], dtype=torch.int32),
        "causal": True,
    }
    out = flash_attn_with_kvcache(q, k_cache, v_cache, **inputs)
    torch.testing.assert_close(out, attention_kvcache_ref(q, k_cache, v_cache, **inputs)[0], rtol=0, atol=1e-12)
    assert keys_per_sequence(stand_in.calls, 3) == [4, 3, 1]


@pytest.mark.parametrize("seqlen_q, causal", [(1, False), (3, True)], ids=["split", "packed"])
@pytest.mark.parametrize("paged", [False, True], ids=["batch", "paged"])
def test_v_cache_with_a_head_dim_of_its_own(stand_in, seqlen_q, causal, paged):
    """v_cache and v 4 wide beside k's 8: the new values written at their slots, out 4 wide, as the reference."""
    generator = torch.Generator().manual_seed(seqlen_q)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    rows = (5, 4) if paged else (2, 8)  # paged: 2 pages of 4 rows a sequence
    k_cache, v_cache = randn(*rows, 2, 8), randn(*rows, 2, 4)
    inputs = {
        "k": randn(2, seqlen_q, 2, 8),
        "v": randn(2, seqlen_q, 2, 4),
        "cache_seqlens": torch.tensor([0, 8 - seqlen_q], dtype=torch.int32),
        "block_table": torch.tensor([[3, 0], [4, 1]], dtype=torch.int32) if paged else None,
        "causal": causal,
    }
    q = randn(2, seqlen_q, 4, 8)
    ref_out, ref_lse, ref_k_cache, ref_v_cache = attention_kvcache_ref(q, k_cache, v_cache, **inputs)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, **inputs, return_lse=True)
    assert out.shape == (2, seqlen_q, 4, 4)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-6)
    assert torch.equal(k_cache, ref_k_cache) and torch.equal(v_cache, ref_v_cache)


@pytest.mark.parametrize("in_place", [True, False], ids=["read-in-place", "gathered"])
@pytest.mark.parametrize("seqlen_q, causal", [(1, True), (4, True), (3, False)], ids=["split", "tail", "packed"])
def test_a_paged_cache_is_read_where_it_lies_or_gathered(monkeypatch, stand_in, in_place, seqlen_q, causal):
    """Where the family reads pages where they lie (registry.reads_pages) the split chunks' launch gets the cache's
    rows and its block table, without a copy, and the tail of the masked rows a copy of its keys; else the
    sequences' pages gathered. Both as the reference, with junk entries in the table for pages no sequence reads."""
    monkeypatch.setattr(registry, "reads_pages", lambda *args: in_place)
    generator = torch.Generator().manual_seed(seqlen_q)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    k_cache, v_cache = randn(9, 4, 2, 8), randn(9, 4, 2, 8)  # 9 pages of 4 rows, 3 a sequence
    inputs = {
        "k": randn(2, seqlen_q, 2, 8),
        "v": randn(2, seqlen_q, 2, 8),
        "cache_seqlens": torch.tensor([1, 8 - seqlen_q], dtype=torch.int32),
        "block_table": torch.tensor([[7, 3, -3], [2, 5, 100]], dtype=torch.int32),
        "causal": causal,
    }
    q = randn(2, seqlen_q, 4, 8)
    ref_out, ref_lse, ref_k_cache, ref_v_cache = attention_kvcache_ref(q, k_cache, v_cache, **inputs)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, **inputs, return_lse=True)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-6)
    assert torch.equal(k_cache, ref_k_cache) and torch.equal(v_cache, ref_v_cache)
    split, *tail = stand_in.calls
    assert bool(split["pages"]) == in_place
    assert (split["k"].data_ptr() == k_cache.data_ptr()) == in_place, "read where it lies: no copy"
    assert len(tail) == (seqlen_q == 4), "the tail of the masked rows in a launch of its own"
    for call in tail:  # the tail's keys start anywhere: a copy of their own where the chunks read pages in place
        assert not call["pages"] and (call["k"].data_ptr() == k_cache.data_ptr()) is False


@pytest.mark.parametrize("seqlen_q, calls", [(32, 2), (33, 1)])
def test_masked_rows_past_a_tile_run_as_one_masked_launch(stand_in, seqlen_q, calls):
    """Several query rows under a causal mask split their keys with a masked tail while a tile holds them packed
    (seqlen_q x 4 query heads a kv head <= 128 rows); a chunk of prefill past that runs as one masked launch."""
    generator = torch.Generator().manual_seed(seqlen_q)
    q = torch.randn(1, seqlen_q, 4, 8, generator=generator, dtype=torch.float64)
    k_cache, v_cache = (torch.randn(1, 64, 1, 8, generator=generator, dtype=torch.float64) for _ in "kv")
    lengths = torch.tensor([50], dtype=torch.int32)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, causal=True)
    ref = attention_kvcache_ref(q, k_cache, v_cache, cache_seqlens=lengths, causal=True)[0]
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    assert len(stand_in.calls) == calls


def test_builds_no_autograd_graph(stand_in):
    q = torch.randn(1, 1, 2, 8, dtype=torch.float64, requires_grad=True)
    k_cache, v_cache = (torch.randn(1, 4, 2, 8, dtype=torch.float64) for _ in "kv")
    k, v = (torch.randn(1, 1, 2, 8, dtype=torch.float64, requires_grad=True) for _ in "kv")
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=2, return_lse=True)
    assert not out.requires_grad and not lse.requires_grad and not k_cache.requires_grad
    assert torch.equal(k_cache[0, 2], k[0, 0].detach())


def test_returns_out_alone_without_return_lse(stand_in):
    q = torch.randn(2, 1, 2, 8, dtype=torch.float64)
    cache = torch.randn(2, 4, 2, 8, dtype=torch.float64)
    out = flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=torch.tensor([0, 4], dtype=torch.int32))
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    assert torch.equal(out[0], torch.zeros_like(out[0])), "a sequence with no key gets O = 0"


def test_return_softmax_lse_is_flash_attn_s_name_for_return_lse(stand_in):
    q = torch.randn(2, 1, 2, 8, dtype=torch.float64)
    cache = torch.randn(2, 4, 2, 8, dtype=torch.float64)
    lengths = torch.tensor([3, 4], dtype=torch.int32)
    out, lse = flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=lengths, return_softmax_lse=True)
    expected = flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=lengths, return_lse=True)
    assert torch.equal(out, expected[0]) and torch.equal(lse, expected[1])
    with pytest.raises(TypeError, match="return_softmax_lse must be a bool"):
        flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=lengths, return_softmax_lse=1)


def test_exported_from_the_package():
    assert flashcute.flash_attn_with_kvcache is flash_attn_with_kvcache
    assert "flash_attn_with_kvcache" in flashcute.__all__


# ---- argument checks -------------------------------------------------------------------------------------------


def valid(**changes) -> dict:
    """A valid call on CPU tensors (batch 2, seqlen_q 3, 4 query heads over 2 kv heads, headdim 8, a cache of 6
    positions, 1 new key), with ``changes`` applied."""
    inputs = {
        "q": torch.zeros(2, 3, 4, 8),
        "k_cache": torch.zeros(2, 6, 2, 8),
        "v_cache": torch.zeros(2, 6, 2, 8),
        "k": torch.zeros(2, 1, 2, 8),
        "v": torch.zeros(2, 1, 2, 8),
        "cache_seqlens": torch.tensor([1, 5], dtype=torch.int32),
    }
    inputs.update(changes)
    return inputs


I32 = torch.int32
BAD_CALLS = [
    ({"q": [[0.0]]}, TypeError, "q must be a torch.Tensor, got list"),
    ({"v_cache": None}, TypeError, "v_cache must be a torch.Tensor, got NoneType"),
    ({"q": torch.zeros(2, 3, 8)}, ValueError, "q must have 4 dimensions (batch, seqlen_q, nheads, headdim)"),
    ({"q": torch.zeros(2, 3, 4, 8, dtype=torch.int64)}, TypeError, "q must have a floating-point dtype"),
    ({"k_cache": torch.zeros(2, 6, 2, 8, dtype=torch.float64)}, TypeError, "k_cache must have q's dtype"),
    ({"k": torch.zeros(2, 1, 2, 8, dtype=torch.float16)}, TypeError, "k must have q's dtype (torch.float32)"),
    ({"v_cache": torch.zeros(2, 5, 2, 8)}, ValueError, "v_cache must have k_cache's shape (2, 6, 2, 8) but for its"),
    ({"k_cache": torch.zeros(2, 6, 8)}, ValueError, "k_cache must have 4 dimensions (batch_cache, seqlen_cache"),
    ({"k_cache": torch.zeros(2, 6, 2, 4), "v_cache": torch.zeros(2, 6, 2, 4)}, ValueError, "must equal q's (8)"),
    ({"k_cache": torch.zeros(2, 6, 3, 8), "v_cache": torch.zeros(2, 6, 3, 8)}, ValueError, "must divide q's nheads"),
    ({"k_cache": torch.zeros(1, 6, 2, 8), "v_cache": torch.zeros(1, 6, 2, 8)}, ValueError, "batch_cache) must be >="),
    ({"v": None}, ValueError, "k and v must be given together (the new keys and values), got only k"),
    ({"k": torch.zeros(2, 1, 1, 8)}, ValueError, "k must have shape (batch, seqlen_new, nheads_k, headdim) = (2, "),
    ({"v": torch.zeros(2, 2, 2, 8)}, ValueError, "v must have k's seqlen_new (1), got shape (2, 2, 2, 8)"),
    ({"v": torch.zeros(2, 1, 2, 16)}, ValueError, "v must have shape (batch, seqlen_new, nheads_k, headdim) = (2, "),
    ({"k": torch.zeros(2, 7, 2, 8), "v": torch.zeros(2, 7, 2, 8)}, ValueError, "seqlen_new) must be at most"),
    ({"q": torch.zeros(2, 7, 4, 8)}, ValueError, "(seqlen_q) must be at most the cache's capacity (6) when k"),
    ({"cache_seqlens": None}, ValueError, "cache_seqlens must be given with k and v"),
    ({"cache_seqlens": 1.0}, TypeError, "cache_seqlens must be None, an int or an int32 torch.Tensor (batch,)"),
    ({"cache_seqlens": 6}, ValueError, "cache_seqlens must be in [0, 5] (the cache's capacity 6 less the 1 new"),
    ({"cache_seqlens": torch.tensor([1, 2])}, TypeError, "cache_seqlens must have dtype int32, got torch.int64"),
    ({"cache_seqlens": torch.tensor([1], dtype=I32)}, ValueError, "cache_seqlens must have shape (batch,) = (2,)"),
    ({"cache_leftpad": torch.zeros(3, dtype=I32)}, ValueError, "cache_leftpad must have shape (batch,) = (2,)"),
    ({"cache_batch_idx": torch.zeros(2)}, TypeError, "cache_batch_idx must have dtype int32"),
    (
        {"block_table": torch.zeros(2, 1, dtype=I32), "cache_batch_idx": torch.zeros(2, dtype=I32)},
        ValueError,
        "cache_batch_idx must be None with a paged cache",
    ),
    ({"block_table": torch.zeros(2, 1)}, TypeError, "block_table must have dtype int32, got torch.float32"),
    ({"block_table": torch.zeros(3, 1, dtype=I32)}, ValueError, "block_table must have shape (batch, max_num_"),
    ({"block_table": torch.zeros(2, 0, dtype=I32)}, ValueError, "with at least one page per sequence, got (2, 0)"),
    ({"rotary_cos": torch.zeros(6, 2)}, ValueError, "rotary_cos and rotary_sin must be given together, got only"),
    (
        {"rotary_cos": torch.zeros(6, 2), "rotary_sin": torch.zeros(6, 2), "k": None, "v": None},
        ValueError,
        "rotary_cos and rotary_sin need k and v",
    ),
    ({"rotary_cos": torch.zeros(6, 2), "rotary_sin": torch.zeros(6, 3)}, ValueError, "rotary_sin must have rotary_"),
    ({"rotary_cos": torch.zeros(6, 5), "rotary_sin": torch.zeros(6, 5)}, ValueError, "rotary_dim (2 * rotary_cos"),
    ({"rotary_cos": torch.zeros(5, 2), "rotary_sin": torch.zeros(5, 2)}, ValueError, "(seqlen_ro) must be at least"),
    ({"rotary_cos": torch.zeros(6, 2, dtype=I32), "rotary_sin": torch.zeros(6, 2)}, TypeError, "floating-point"),
    ({"rotary_interleaved": 1}, TypeError, "rotary_interleaved must be a bool, got 1 (int)"),
    ({"return_lse": None}, TypeError, "return_lse must be a bool"),
    ({"num_splits": -1}, ValueError, "num_splits must be an int >= 0 (0 = the implementation's choice), got -1"),
    ({"num_splits": 2.0}, TypeError, "num_splits must be an int >= 0"),
    ({"num_splits": True}, TypeError, "num_splits must be an int >= 0"),
    ({"window_size": (-2, 0)}, ValueError, "window_size must be a pair (window_left, window_right)"),
    ({"softmax_scale": 0.0}, ValueError, "softmax_scale must be None"),
    ({"softcap": -1.0}, ValueError, "softcap must be a finite number >= 0"),
    ({"causal": 1}, TypeError, "causal must be a bool"),
]


@pytest.mark.parametrize("changes, error, message", BAD_CALLS)
def test_rejects_bad_arguments_before_writing(stand_in, changes, error, message):
    inputs = valid(**changes)
    cache = inputs["k_cache"].clone() if isinstance(inputs["k_cache"], torch.Tensor) else None
    with pytest.raises(error, match=re.escape(message)):
        flash_attn_with_kvcache(**inputs)
    assert not stand_in.calls
    if cache is not None:
        assert torch.equal(inputs["k_cache"], cache)


@pytest.mark.parametrize("changes, error, message", BAD_CALLS)
def test_a_checked_signature_lets_no_bad_call_through(stand_in, changes, error, message):
    """Each call signature is checked once; after a valid call every bad one still fails before writing."""
    flash_attn_with_kvcache(**valid())
    stand_in.calls.clear()
    test_rejects_bad_arguments_before_writing(stand_in, changes, error, message)


def test_a_repeated_signature_is_checked_once(monkeypatch, stand_in):
    """New tensors of the same shapes, strides, dtypes and alignment skip the checks; a change of any of them, or
    of an option's value or type, takes them again (a cache view off a 16-byte boundary then fails)."""
    checked = []
    full = kvcache.validate_kvcache_args
    monkeypatch.setattr(kvcache, "validate_kvcache_args", lambda *a: checked.append(1) or full(*a))
    for _ in range(3):
        flash_attn_with_kvcache(**valid(q=torch.randn(2, 3, 4, 8)))
    assert len(checked) == 1
    for changes in ({"causal": True}, {"cache_seqlens": 4}, {"cache_seqlens": 3}, {"softmax_scale": 0.5}):
        flash_attn_with_kvcache(**valid(**changes))
    assert len(checked) == 5
    flash_attn_with_kvcache(**valid(k_cache=torch.zeros(2, 6, 2, 8).transpose(0, 1).contiguous().transpose(0, 1)))
    assert len(checked) == 6
    storage = torch.zeros(2 * 6 * 2 * 8 + 1)
    with pytest.raises(ValueError, match="k_cache must start on a 16-byte boundary"):
        flash_attn_with_kvcache(**valid(k_cache=storage[1:].view(2, 6, 2, 8)))


def test_slopes_read_on_the_host_are_checked_at_every_call(monkeypatch, stand_in):
    """ALiBi slopes on the CPU are read to check they are finite, so such calls take the full checks every time."""
    checked = []
    full = kvcache.validate_kvcache_args
    monkeypatch.setattr(kvcache, "validate_kvcache_args", lambda *a: checked.append(1) or full(*a))
    flash_attn_with_kvcache(**valid(alibi_slopes=torch.ones(4)))
    with pytest.raises(ValueError, match="alibi_slopes must be finite"):
        flash_attn_with_kvcache(**valid(alibi_slopes=torch.full((4,), math.nan)))
    assert len(checked) == 2


def test_a_call_the_kernels_cannot_run_writes_nothing():
    inputs = valid(k=torch.ones(2, 1, 2, 8), v=torch.ones(2, 1, 2, 8))
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        flash_attn_with_kvcache(**inputs)
    assert not inputs["k_cache"].any() and not inputs["v_cache"].any()


def test_resolves_the_capacity_and_the_rotary_rule():
    args = validate_kvcache_args(**valid(causal=True, window_size=(4, 9)))
    assert isinstance(args, KvcacheArgs) and args.capacity == 6 and args.seqlen_new == 1
    assert (args.attention.window_left, args.attention.window_right, args.page_block_size) == (4, 0, None)
    assert args.q_positions_per_row
    paged = validate_kvcache_args(**valid(block_table=torch.zeros(2, 3, dtype=I32), window_size=(6, 6)))
    assert (paged.capacity, paged.page_block_size, paged.rotary_dim) == (18, 6, 0)
    assert not validate_kvcache_args(**valid(window_size=(6, -1))).q_positions_per_row
    rotary = validate_kvcache_args(**valid(rotary_cos=torch.zeros(6, 3), rotary_sin=torch.zeros(6, 3)))
    assert rotary.rotary_dim == 6


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"cache_seqlens": torch.tensor([1, 6], dtype=I32)}, "cache_seqlens[1] must be in [0, 5]"),
        ({"cache_leftpad": torch.tensor([2, 0], dtype=I32)}, "cache_leftpad[0] must be in [0, 1] (cache_seqlens[0]"),
        ({"cache_batch_idx": torch.tensor([0, 2], dtype=I32)}, "cache_batch_idx[1] must be in [0, 2), got 2"),
        ({"block_table": torch.tensor([[0], [9]], dtype=I32)}, "block_table[1, 0] must be in [0, 2), got 9"),
    ],
)
def test_the_reference_checks_the_values(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        attention_kvcache_ref(**valid(**changes))


class DeviceWork(TorchDispatchMode):
    """Records the tensor operations that write memory (one or more kernel launches each on a GPU), leaving out
    views and allocations, and whatever runs while ``paused``."""

    VIEWS = ("view", "_unsafe_view", "unsqueeze", "slice", "select", "transpose", "permute", "expand", "alias")
    METADATA = frozenset((*VIEWS, "empty", "new_empty"))

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.paused and name not in self.METADATA:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))

    def pausing(self, fn):
        def paused(*args, **kwargs):
            self.paused = True
            try:
                return fn(*args, **kwargs)
            finally:
                self.paused = False

        return paused


@pytest.mark.parametrize(
    "lengths, expected",
    [
        # the cache's writes and the chunks' key counts in one launch, the queries' copy
        (torch.tensor([5, 60, 0], dtype=torch.int32), ["append", "clone"]),
        (17, ["append", "clone"]),  # one length for all: constant chunks, the writes alone
    ],
)
def test_a_decoding_step_launches_little_besides_the_attention(monkeypatch, stand_in, lengths, expected):
    """A step of one query row a sequence (the append, split-KV, grouped-query packing): the launches around the
    attention and the combine, once the call's constants exist. Each is a launch on the GPU, where a small step
    costs about what its launches cost (docs/decoding.md)."""
    work = DeviceWork()
    appends = []

    def append(*arguments):
        work.ops.append("append")
        appends.append(arguments)
        work.pausing(append_plainly)(*arguments)

    monkeypatch.setattr(interface, "varlen_outputs", work.pausing(interface.varlen_outputs))
    monkeypatch.setattr(splitkv.SplitPlan, "attend", work.pausing(splitkv.SplitPlan.attend))
    monkeypatch.setattr(prepost, "combine", work.pausing(prepost.combine))
    monkeypatch.setattr(prepost, "append", append)
    q = torch.randn(3, 1, 4, 8, dtype=torch.float64)
    k_cache, v_cache = (torch.randn(3, 64, 2, 8, dtype=torch.float64) for _ in "kv")
    k, v = (torch.randn(3, 1, 2, 8, dtype=torch.float64) for _ in "kv")
    flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths, causal=True)
    assert splitkv.plan(3, 1, 4, 2, 64, 0, q.device).splits > 1
    work.ops.clear()  # (the first call's launch)
    with work:
        flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths, causal=True)
    assert work.ops == expected
    counts = appends[-1][7] if len(appends[-1]) > 7 else None
    assert (counts is None) == isinstance(lengths, int), "the counts come with the writes where lengths are a tensor"


def test_several_masked_rows_of_one_length_take_constant_chunks(monkeypatch, stand_in):
    """Three query rows a sequence under a causal mask, one length for every sequence (an int): the split chunks of
    the keys that every row sees and the masked tail's keys are the same tensors at every call, made once, so a call
    launches only the writes, the queries' copies and the joining of the tail's O and LSE to the splits' around the
    attention, the tail's and the combine."""
    work = DeviceWork()
    monkeypatch.setattr(interface, "varlen_outputs", work.pausing(interface.varlen_outputs))
    monkeypatch.setattr(splitkv.SplitPlan, "attend", work.pausing(splitkv.SplitPlan.attend))
    monkeypatch.setattr(prepost, "combine", work.pausing(prepost.combine))
    monkeypatch.setattr(prepost, "append", work.pausing(append_plainly))
    q = torch.randn(3, 3, 4, 8, dtype=torch.float64)
    k_cache, v_cache = (torch.randn(3, 64, 2, 8, dtype=torch.float64) for _ in "kv")
    k, v = (torch.randn(3, 3, 2, 8, dtype=torch.float64) for _ in "kv")
    first = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=17, causal=True)
    assert splitkv.plan(3, 3, 4, 2, 64, 0, q.device).splits > 1
    with work:
        again = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=17, causal=True)
    assert work.ops == ["clone", "cat", "cat"]
    assert torch.equal(first, again)


# Signatures of decoding loops (DecodeStep's) and of the general path, each (call options, whether a step runs it)
STEP_CASES = [
    ({"seqlen_q": 1, "append": True, "lengths": "tensor", "causal": True}, True),
    ({"seqlen_q": 1, "append": True, "lengths": "int"}, True),
    ({"seqlen_q": 1, "append": False, "lengths": "tensor"}, True),
    ({"seqlen_q": 1, "append": False, "lengths": "none"}, True),
    ({"seqlen_q": 3, "append": True, "lengths": "tensor"}, True),  # several rows, no mask: no tail
    ({"seqlen_q": 1, "append": True, "lengths": "tensor", "page": 4, "causal": True}, True),
    ({"seqlen_q": 1, "append": True, "lengths": "int", "page": 8, "softcap": 5.0, "sink": True}, True),
    ({"seqlen_q": 3, "append": True, "lengths": "int", "causal": True}, True),  # a masked tail of constant keys
    ({"seqlen_q": 3, "append": False, "lengths": "none", "causal": True}, True),
    ({"seqlen_q": 3, "append": True, "lengths": "tensor", "causal": True}, True),
    ({"seqlen_q": 3, "append": False, "lengths": "tensor", "causal": True, "window_size": (-1, 1)}, True),
    ({"seqlen_q": 3, "append": True, "lengths": "int", "page": 4, "causal": True}, False),  # (its keys in pages)
    ({"seqlen_q": 1, "append": True, "lengths": "tensor", "window_size": (5, 0)}, False),  # one query's window
    ({"seqlen_q": 1, "append": True, "lengths": "tensor", "leftpad": True}, False),
    ({"seqlen_q": 1, "append": True, "lengths": "tensor", "batch_idx": True}, False),
    ({"seqlen_q": 1, "append": True, "lengths": "tensor", "rotary": True, "causal": True}, False),
    ({"seqlen_q": 1, "append": False, "lengths": "tensor", "alibi": True}, False),
]


def step_call(seqlen_q, append, lengths, page=0, leftpad=False, batch_idx=False, rotary=False, alibi=False,
              sink=False, **options):  # fmt: skip
    """flash_attn_with_kvcache's arguments for a STEP_CASES case (batch 3, 4 query heads over 2, capacity 32),
    drawn from a fixed seed: the same tensors at every call."""
    generator = torch.Generator().manual_seed(7)

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    batch, capacity = 3, 32
    headdim = 8
    arguments = {"q": draw(batch, seqlen_q, 4, headdim), **options}
    if page:
        arguments["k_cache"], arguments["v_cache"] = (
            draw(3 * capacity // page + 1, page, 2, headdim),
            draw(3 * capacity // page + 1, page, 2, headdim),
        )
        table = torch.randperm(3 * capacity // page + 1, generator=generator)[: 3 * capacity // page]
        arguments["block_table"] = table.view(batch, capacity // page).int()
    else:
        arguments["k_cache"], arguments["v_cache"] = (
            draw(batch + 1, capacity, 2, headdim),
            draw(batch + 1, capacity, 2, headdim),
        )
    new = 2 if append else 0
    if append:
        arguments["k"], arguments["v"] = draw(batch, new, 2, headdim), draw(batch, new, 2, headdim)
    filled = [0, 17, capacity - new]
    if lengths == "tensor":
        arguments["cache_seqlens"] = torch.tensor(filled, dtype=torch.int32)
    elif lengths == "int":
        arguments["cache_seqlens"] = 13
    if leftpad:
        arguments["cache_leftpad"] = torch.tensor([0, 3, 1], dtype=torch.int32)
    if batch_idx:
        arguments["cache_batch_idx"] = torch.tensor([2, 0, 3], dtype=torch.int32)
    if rotary:
        arguments["rotary_cos"], arguments["rotary_sin"] = draw(capacity, 2).cos(), draw(capacity, 2).sin()
    if alibi:
        arguments["alibi_slopes"] = draw(batch, 4).abs().float()
    if sink:
        arguments["learnable_sink"] = draw(4)
    return arguments


@pytest.mark.parametrize("case, stepped", STEP_CASES, ids=[str(c) for c, _ in STEP_CASES])
def test_a_decoding_step_runs_what_the_general_path_runs(monkeypatch, stand_in, case, stepped):
    """A repeated signature of the calls decoding loops make runs its DecodeStep, which must give what the general
    path gives for the same call: out, LSE and both caches, exactly (the stand-ins' float64). Other signatures
    keep the general path."""
    results = []
    of = kvcache.DecodeStep.of
    steps = [False]
    monkeypatch.setattr(kvcache.DecodeStep, "of", classmethod(lambda cls, *a: of(*a) if steps[0] else None))
    for steps[0] in (False, True):
        kvcache._checked.clear()
        arguments = step_call(**case)
        out, lse = flash_attn_with_kvcache(**arguments, return_lse=True)
        results.append((out, lse, arguments["k_cache"], arguments["v_cache"]))
    assert any(entry[1] is not None for entry in kvcache._checked.values()) == stepped
    for general, stepped_result in zip(*results, strict=True):
        torch.testing.assert_close(stepped_result, general, rtol=0, atol=0)
