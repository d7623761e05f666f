"""flash_attn_with_kvcache on the GPU in fp16 and bf16: each cache layout (indexed by batch, by cache_batch_idx,
paged with 16, 64 and 256 rows a page) against attention_kvcache_ref, the output within design.md's error budget
and the cache written in place at exactly the new slots; a decode step captured in a CUDA graph and replayed with
new cache_seqlens; calls the kernels cannot run refused before anything is written."""

from __future__ import annotations

import math
import re

import pytest
import torch

import flashcute
from flashcute.reference import attention_kvcache_ref
from tests.helpers import check_against_spec, chunk_counts
from tests.test_kvcache import Case, rotary_tables, rotate_plainly

pytestmark = pytest.mark.gpu


def case(layout: str, page: int, pages_per_seq: int = 1, **fields) -> Case:
    """A Case with batch 4 and these defaults: one new key, 8 query heads over 2 kv heads, headdim 128, no
    rotary embedding, no cache_leftpad, no mask; ``filled`` defaults to lengths at the edges: empty, one key, one
    page, full."""
    capacity = page * pages_per_seq
    seqlen_new = fields.get("seqlen_new", 1)
    room = capacity - (seqlen_new or 0)
    values = {
        "batch": 4,
        "seqlen_q": 1,
        "nheads": 8,
        "nheads_k": 2,
        "headdim": 128,
        "batch_cache": 4 * pages_per_seq + 3 if layout == "paged" else 6,
        "seqlen_new": seqlen_new,
        "filled": [0, 1, min(page, room), room],
        "seqlens_as_int": False,
        "leftpad": None,
        "rotary": None,
        "strided": False,
        "junk_pages": layout == "paged",
        "options": {},
        "seed": 0,
    }
    values.update(fields)
    return Case(layout=layout, page=page, pages_per_seq=pages_per_seq, **values)


CASES = [
    case("batch", 300, rotary=(64, False), options={"causal": True}),
    case("batch", 1000, seqlen_new=None, nheads=4, nheads_k=4, headdim=64),
    case("batch", 1000, seqlen_new=None, filled=None, leftpad=[0, 7, 500, 999], options={"window_size": (100, 0)}),
    case(
        "batch",
        257,
        seqlen_q=5,
        seqlen_new=5,
        nheads=6,
        nheads_k=3,
        headdim=64,
        leftpad=[0, 1, 100, 3],
        rotary=(32, True),
        options={"causal": True},
    ),
    case(
        "batch",
        130,
        seqlen_q=3,
        seqlen_new=2,
        nheads=4,
        nheads_k=1,
        headdim=96,
        leftpad=[0, 0, 64, 127],
        strided=True,
        options={"window_size": (40, 0), "softmax_scale": 0.2},
    ),
    case("batch", 64, seqlen_q=70, seqlen_new=None, headdim=64, options={"causal": True}),  # more queries than keys
    case("batch_idx", 200, nheads=8, nheads_k=8, rotary=(128, True)),
    case("batch_idx", 513, seqlen_q=4, seqlen_new=None, leftpad=[0, 1, 2, 100], options={"causal": True}),
    case("paged", 16, 20, rotary=(64, False), options={"causal": True}),
    case(
        "paged", 64, 5, seqlen_q=2, seqlen_new=2, nheads=4, leftpad=[0, 1, 64, 100], options={"window_size": (50, -1)}
    ),
    case("paged", 256, 3, seqlen_new=None, nheads_k=1),
    case("batch", 1000, seqlen_new=None, options={"causal": True, "softcap": 5.0}),  # split-KV, capped scores
    case("paged", 64, 5, seqlen_q=3, seqlen_new=3, nheads=4, options={"causal": True, "softcap": 1.5}),
    # pages read where they lie, the keys before a sequence's first page boundary copied out: left padding, a window
    case("paged", 64, 5, leftpad=[0, 1, 64, 100], options={"window_size": (70, 0)}),
    case("paged", 16, 40, headdim=256, nheads=4, leftpad=[0, 1, 9, 600]),
    case(
        "paged",
        256,
        2,
        seqlen_q=16,
        seqlen_new=16,
        nheads=4,
        nheads_k=4,
        headdim=256,
        rotary=(128, True),
        strided=True,
        options={"causal": True},
    ),
    # head dims that are not multiples of 8: zero-padded copies of q and the caches, the appended rows written back
    case("paged", 64, 5, seqlen_q=3, seqlen_new=3, headdim=59, rotary=(32, True), options={"causal": True}),
    case("batch", 300, headdim=111, leftpad=[0, 1, 9, 200]),
]


def describe(c: Case) -> str:
    new = "none" if c.seqlen_new is None else c.seqlen_new
    opts = "-".join(f"{key}={value}" for key, value in c.options.items())
    return f"{c.layout}-p{c.page}x{c.pages_per_seq}-q{c.seqlen_q}-new{new}-d{c.headdim}-{c.rotary}-{opts}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("c", CASES, ids=describe)
def test_matches_the_spec(c, dtype):
    inputs, buffers = c.build(dtype, "cuda")
    before = {name: buffers[name].clone() for name in "kv"}
    on_cpu = {name: v.cpu() if isinstance(v, torch.Tensor) else v for name, v in inputs.items() if name != "num_splits"}
    _, _, ref_k_cache, ref_v_cache = attention_kvcache_ref(**on_cpu)

    out, lse = flashcute.flash_attn_with_kvcache(**inputs, return_lse=True)

    region, written = buffers["region"], c.written(on_cpu)
    for name, ref_cache in (("k", ref_k_cache), ("v", ref_v_cache)):
        outside = torch.ones_like(buffers[name], dtype=torch.bool)
        outside[region] = False
        assert torch.equal(buffers[name][outside], before[name][outside]), f"{name}: a row outside the cache changed"
        cache, cache_before = buffers[name][region].cpu(), before[name][region].cpu()
        assert torch.equal(cache[~written], cache_before[~written]), f"{name}_cache changed outside the new slots"
        if name == "k" and c.rotary:  # rotated in float32 here, in float64 there: one rounding apart at most
            torch.testing.assert_close(cache[written], ref_cache[written])
        else:
            assert torch.equal(cache[written], ref_cache[written])

    check_outputs(c, inputs, on_cpu, ref_k_cache, ref_v_cache, out, lse, dtype)


def check_outputs(c: Case, inputs: dict, on_cpu: dict, k_cache, v_cache, out, lse, dtype) -> None:
    """Each sequence's out and lse against the spec over the keys it attends, read from the caches as the reference
    left them (CPU tensors)."""
    queries = inputs["q"]
    if c.rotary:
        positions = [[n + (i if c.q_positions_per_row else 0) for i in range(c.seqlen_q)] for n in c.filled]
        rotated = rotate_plainly(on_cpu["q"], on_cpu["rotary_cos"], on_cpu["rotary_sin"], positions, c.rotary[1])
        queries = rotated.to(dtype).cuda()
    names = ("causal", "window_size", "softmax_scale", "softcap")
    options = {name: c.options[name] for name in names if name in c.options}
    for b in range(c.batch):
        keys_at = c.key_range(b)
        if not keys_at:
            assert torch.equal(out[b], torch.zeros_like(out[b])), f"sequence {b} has no key: O must be 0"
            assert (lse[b] == -math.inf).all(), f"sequence {b} has no key: LSE must be -inf"
            continue
        rows, offsets = (torch.tensor(index) for index in zip(*(c.slot(on_cpu, b, p) for p in keys_at), strict=True))
        keys, values = (cache[rows, offsets].cuda() for cache in (k_cache, v_cache))
        check_against_spec(out[b : b + 1], lse[b : b + 1], queries[b : b + 1], keys[None], values[None], **options)


@pytest.mark.parametrize(
    "c",
    [
        case("batch", 1000, seqlen_new=1, options={"causal": True}),  # split-KV, one query row
        case("batch", 600, seqlen_q=4, seqlen_new=4, options={"causal": True}),  # split keys and a masked tail
        case("batch", 257, seqlen_q=5, seqlen_new=None, leftpad=[0, 1, 100, 3], options={"window_size": (40, 0)}),
        case("paged", 16, 20, options={"causal": True}),
    ],
    ids=describe,
)
def test_slots_the_call_does_not_attend_may_hold_nan(c, kernel):
    """Cache slots outside each sequence's attended keys (unfilled, before its left padding, in unused pages) are
    not the call's: NaN there reaches no output, though a tile's loads run over them."""
    inputs, _ = c.build(torch.bfloat16, "cuda")
    inputs["kernel"] = kernel
    on_cpu = {name: v.cpu() if isinstance(v, torch.Tensor) else v for name, v in inputs.items() if name != "num_splits"}
    attended = torch.zeros(inputs["k_cache"].shape[:2], dtype=torch.bool)
    for b in range(c.batch):
        for p in c.key_range(b):
            attended[c.slot(on_cpu, b, p)] = True
    for name in ("k_cache", "v_cache"):
        inputs[name][~attended.cuda()] = math.nan
        on_cpu[name] = inputs[name].cpu()
    _, _, ref_k_cache, ref_v_cache = attention_kvcache_ref(**{n: v for n, v in on_cpu.items() if n != "kernel"})
    out, lse = flashcute.flash_attn_with_kvcache(**inputs, return_lse=True)
    check_outputs(c, inputs, on_cpu, ref_k_cache, ref_v_cache, out, lse, torch.bfloat16)


def test_a_captured_decode_step_replays_with_new_cache_seqlens():
    batch, capacity, nheads, nheads_k, headdim, dtype = 3, 384, 8, 2, 128, torch.bfloat16
    generator = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device="cuda", dtype=dtype)

    k_cache, v_cache = randn(batch, capacity, nheads_k, headdim), randn(batch, capacity, nheads_k, headdim)
    q, k, v = randn(batch, 1, nheads, headdim), randn(batch, 1, nheads_k, headdim), randn(batch, 1, nheads_k, headdim)
    cos, sin = (t.cuda() for t in rotary_tables(capacity, 32, dtype))
    cache_seqlens = torch.tensor([5, 0, 100], dtype=torch.int32, device="cuda")

    def step(k_cache, v_cache):
        return flashcute.flash_attn_with_kvcache(
            q, k_cache, v_cache, k, v, cos, sin, cache_seqlens, causal=True, rotary_interleaved=False, return_lse=True
        )

    start = k_cache.clone(), v_cache.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(k_cache, v_cache)  # compiles and loads the kernels, which a capture cannot
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step(k_cache, v_cache)
    k_cache.copy_(start[0])
    v_cache.copy_(start[1])

    for lengths in ([0, 1, capacity - 1], [64, 255, 17], [capacity - 1, 0, 128]):
        for t in (q, k, v):
            t.copy_(randn(*t.shape))
        cache_seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        want_k_cache, want_v_cache = k_cache.clone(), v_cache.clone()
        want_out, want_lse = step(want_k_cache, want_v_cache)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(k_cache, want_k_cache) and torch.equal(v_cache, want_v_cache), lengths
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse), lengths


REFUSED = [
    ({"dtype": torch.float32}, TypeError, "q must have dtype float16 or bfloat16, got torch.float32"),
    ({"headdim": 264}, ValueError, "headdim must be at most 256, got 264"),
    ({"cache_stride": 2}, ValueError, "k_cache must have a contiguous last dim (stride 1)"),
]


@pytest.mark.parametrize("changes, error, message", REFUSED)
def test_a_call_the_kernels_cannot_run_writes_nothing(changes, error, message):
    dtype, headdim, stride = (
        changes.get("dtype", torch.float16),
        changes.get("headdim", 64),
        changes.get("cache_stride", 1),
    )

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype)

    q, k, v = randn(2, 1, 4, headdim), randn(2, 1, 2, headdim), randn(2, 1, 2, headdim)
    k_cache, v_cache = randn(2, 16, 2, headdim * stride)[..., ::stride], randn(2, 16, 2, headdim)
    before = k_cache.clone(), v_cache.clone()
    seqlens = torch.tensor([3, 9], dtype=torch.int32, device="cuda")
    with pytest.raises(error, match=re.escape(message)):
        flashcute.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens)
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


@pytest.mark.parametrize("paged", [False, True], ids=["batch", "paged"])
@pytest.mark.parametrize("seqlen_q, options", [(1, {}), (3, {"causal": True})], ids=["decode", "causal"])
def test_v_cache_with_a_head_dim_of_its_own(seqlen_q, options, paged, kernel):
    """v_cache (and v) with a head dim apart from k_cache's: the new keys and values written in place, out with v's
    head dim, against the spec on the gathered cache (one query row takes the split-KV path)."""
    batch, nheads, nheads_k, headdim, headdim_v, capacity, page = 3, 8, 2, 128, 64, 1024, 256
    generator = torch.Generator(device="cuda").manual_seed(seqlen_q)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device="cuda", dtype=torch.bfloat16)

    rows = (batch * capacity // page + 1, page) if paged else (batch, capacity)
    k_cache, v_cache = randn(*rows, nheads_k, headdim), randn(*rows, nheads_k, headdim_v)
    order = torch.randperm(rows[0], generator=torch.Generator().manual_seed(0))[: batch * capacity // page]
    block_table = order.view(batch, capacity // page).to(torch.int32).cuda() if paged else None
    q, k = randn(batch, seqlen_q, nheads, headdim), randn(batch, seqlen_q, nheads_k, headdim)
    v = randn(batch, seqlen_q, nheads_k, headdim_v)
    cache_seqlens = torch.tensor([0, 500, capacity - seqlen_q], dtype=torch.int32, device="cuda")
    inputs = {"k": k, "v": v, "cache_seqlens": cache_seqlens, "block_table": block_table, **options}
    on_cpu = {name: t.cpu() if isinstance(t, torch.Tensor) else t for name, t in inputs.items()}
    _, _, ref_k_cache, ref_v_cache = attention_kvcache_ref(q.cpu(), k_cache.cpu(), v_cache.cpu(), **on_cpu)

    out, lse = flashcute.flash_attn_with_kvcache(q, k_cache, v_cache, **inputs, return_lse=True, kernel=kernel)

    assert out.shape == (batch, seqlen_q, nheads, headdim_v)
    assert torch.equal(k_cache.cpu(), ref_k_cache) and torch.equal(v_cache.cpu(), ref_v_cache)
    for b in range(batch):
        positions = torch.arange(int(cache_seqlens[b]) + seqlen_q)
        if paged:
            slots = (block_table[b].cpu()[positions // page].long(), positions % page)
        else:
            slots = (torch.full_like(positions, b), positions)
        keys, values = (cache[slots].cuda() for cache in (ref_k_cache, ref_v_cache))
        check_against_spec(out[b : b + 1], lse[b : b + 1], q[b : b + 1], keys[None], values[None], **options)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "slots, head_dims, seqlen_new",
    [
        ("batch", (128, 128), 1),
        ("batch", (256, 64), 5),
        ("rows", (72, 72), 3),
        ("rows", (8, 256), 1),
        ("pages", (128, 128), 1),
        ("pages", (64, 192), 37),
    ],
)
def test_the_append_writes_every_slot_inside_the_cache_and_nothing_else(slots, head_dims, seqlen_new, dtype):
    """prepost.append (one launch: the new keys and values, and the split chunks' key counts) against its tensor
    operations (append_plainly) on NaN-poisoned caches, element by element: lengths at 0, inside, at the capacity's
    edge and past it, below 0; cache rows and pages out of range; new keys that are a strided view, and ones not
    16-byte aligned (copied first). Every slot inside gets its value, nothing else changes."""
    from flashcute.kernels.common import prepost
    from tests.helpers import append_plainly

    device, batch, nheads_k = torch.device("cuda", 0), 6, 3
    page, pages = 16, 4
    rows, seqlen = (batch * pages + 2, page) if slots == "pages" else (8, page * pages)
    capacity = page * pages
    generator = torch.Generator().manual_seed(seqlen_new * 1000 + head_dims[1])
    lengths = torch.tensor([0, 7, capacity - seqlen_new, capacity - 1, capacity + 3, -2], dtype=torch.int32)
    index = table = None
    if slots == "rows":
        index = torch.tensor([3, 0, 7, 8, 1, -1], dtype=torch.int32).to(device)  # 8 and -1: out of range
    if slots == "pages":
        table = torch.randperm(rows, generator=generator)[: batch * pages].view(batch, pages).int()
        table[1, 0], table[2, -1] = rows + 5, -3  # pages out of range
        table = table.to(device)
    wide = [torch.randn(batch, seqlen_new, nheads_k, 2 * d, generator=generator).to(device, dtype) for d in head_dims]
    k = wide[0][..., ::2]  # a strided view: copied before the launch
    v = torch.empty(wide[1].numel() + 1, dtype=dtype, device=device)[1:].view(wide[1].shape)
    v.copy_(wide[1])  # starts 2 bytes off a 16-byte boundary
    v = v[..., : head_dims[1]]
    caches = [torch.full((rows, seqlen, nheads_k, d), math.nan, dtype=dtype, device=device) for d in head_dims]
    want = [c.clone() for c in caches]
    splits, chunk = 3, 32
    counts = torch.full((batch, splits), -99, dtype=torch.int32, device=device)
    want_counts = counts.clone()
    lengths = lengths.to(device)
    prepost.append(lengths, k, v, *caches, index, table, counts, chunk)
    append_plainly(lengths, k, v, *want, index, table, want_counts, chunk)
    torch.cuda.synchronize()
    for got, expected in zip(caches, want, strict=True):
        assert torch.equal(got.isnan(), expected.isnan()), "the slots written"
        assert torch.equal(got.nan_to_num(), expected.nan_to_num())
    assert torch.equal(counts, want_counts)
    counts_alone = torch.full_like(counts, -99)
    prepost.append(lengths, None, None, *caches, counts=counts_alone, chunk=chunk)  # no keys: the counts alone
    assert torch.equal(counts_alone.cpu(), chunk_counts(lengths.cpu(), 0, splits, chunk))
    if slots == "batch":  # several masked query rows: the counts of the keys before their tail, and the tail's rows
        for tail_keys, new in ((1, (k, v)), (5, (k, v)), (3, (None, None))):
            got = [torch.full((2, batch + 1), -99, dtype=torch.int32, device=device), torch.full_like(counts, -99)]
            expected = [t.clone() for t in got]
            prepost.append(lengths, *new, *caches, None, None, got[1], chunk, (got[0], tail_keys, seqlen))
            append_plainly(lengths, *new, *want, None, None, expected[1], chunk, (expected[0], tail_keys, seqlen))
            for cache, expected_cache in zip(caches, want, strict=True):
                assert torch.equal(cache.nan_to_num(), expected_cache.nan_to_num())
            assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), (tail_keys, got, expected)
