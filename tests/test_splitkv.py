"""Split-KV attention (splitkv.py): the split count, a single query's mask as a key range and which
flash_attn_func calls take the path, on the CPU; on the GPU, the combine kernel against its formula and the path
(every split count, grouped-query packing, empty sequences, every family) against the float64 spec."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import flashcute
from flashcute import interface, splitkv
from flashcute.reference import attention_ref
from flashcute.validation import validate_attention_args
from tests.helpers import check_against_spec, chunk_counts


@pytest.mark.parametrize(
    "tiles, max_keys, splits",
    [
        (64, 131072, 2),  # B=8 x 8 kv heads: 128 walks, one wave of 132 SMs
        (32, 131072, 4),  # 128 walks
        (48, 131072, 5),  # 240 walks, two waves 0.91 full (3 splits: 144, the second wave 12 walks)
        (8, 131072, 15),  # B=1: 120 walks
        (64, 1000, 2),  # no split under MIN_SPLIT_KEYS keys
        (8, 4096, 8),  # no count fills a wave: the one that fills most
        (1, 10**7, 119),
        (1, 40000, 79),  # at most 79 splits of 512 keys
        (132, 131072, 1),  # the query side fills the GPU already
        (1000, 131072, 1),
        (3, 0, 1),
    ],
)
def test_num_splits(tiles, max_keys, splits):
    assert splitkv.num_splits(tiles, max_keys, 132) == splits


@given(st.integers(1, 2000), st.integers(0, 2**22), st.sampled_from([78, 108, 114, 132, 144]))
def test_num_splits_fills_the_waves_with_the_fewest_splits(tiles, max_keys, sms):
    """Within its bounds, the count is the fewest that keeps WAVE_FILL of the SMs busy in every wave, and where none
    does, no count fills them better."""
    splits = splitkv.num_splits(tiles, max_keys, sms)
    most = max(1, min(math.ceil(max_keys / splitkv.MIN_SPLIT_KEYS), splitkv.MAX_SPLITS))
    assert 1 <= splits <= most
    if tiles >= sms:
        assert splits == 1
        return

    def fill(s: int) -> float:
        return tiles * s / (sms * math.ceil(tiles * s / sms))

    fewer = [fill(s) for s in range(1, splits)]
    if fill(splits) >= splitkv.WAVE_FILL:
        assert all(f < splitkv.WAVE_FILL for f in fewer)
    else:
        assert all(fill(s) <= fill(splits) for s in range(1, most + 1))


@pytest.mark.parametrize(
    "position, seqlen_k, window, keys",
    [
        (99, 100, (-1, -1), (0, 100)),
        (99, 100, (-1, 0), (0, 100)),  # causal, bottom-right: every key
        (0, 100, (-1, 0), (0, 1)),  # causal, top-left: key 0 alone
        (99, 100, (10, 0), (89, 100)),
        (99, 100, (200, 5), (0, 100)),
        (50, 100, (3, 3), (47, 54)),
        (-5, 100, (-1, 2), (0, 0)),  # the window ends before key 0: no key
        (150, 100, (20, -1), (100, 100)),  # the window starts past the last key: no key
    ],
)
def test_one_query_sees_a_range_of_keys(position, seqlen_k, window, keys):
    assert splitkv.one_query_key_range(position, seqlen_k, *window) == keys
    lo, hi = keys
    left, right = window
    seen = [j for j in range(seqlen_k) if (left < 0 or j >= position - left) and (right < 0 or j <= position + right)]
    assert seen == list(range(lo, hi))


def _key_range(monkeypatch, batch, seqlen_q, seqlen_k, nheads, nheads_k, **options):
    """interface._split_key_range for a call of these sizes (CPU tensors standing for CUDA ones, 132 SMs)."""
    monkeypatch.setattr(interface, "num_sms", lambda device: 132)
    q = torch.empty(batch, seqlen_q, nheads, 8)
    k = torch.empty(batch, seqlen_k, nheads_k, 8)
    args = validate_attention_args(q, k, k, **options)
    return interface._split_key_range(args, q, k, k)


def test_a_cache_filled_to_one_length_makes_its_chunks_once(monkeypatch):
    """Every sequence attending the same keys (an int cache_seqlens): the chunks are key_chunks' for those lengths,
    made at the first such call and the same tensors at the next."""
    monkeypatch.setattr(splitkv, "num_sms", lambda device: 132)
    plan = splitkv.SplitPlan(2, 1, 8, 2, 4096, 3, "cpu")
    chunks = plan.constant_chunks(4096, 10, 3000)
    assert plan.constant_chunks(4096, 10, 3000) is chunks
    first = torch.tensor([10, 4106], dtype=torch.int32)
    expected = plan.key_chunks(first, torch.tensor([2990, 2990], dtype=torch.int32), 2 * 4096)
    assert all(torch.equal(got, want) for got, want in zip(chunks, expected, strict=True))
    assert chunks[1].tolist() == [1408, 1408, 174, 1408, 1408, 174]  # 3 chunks of 11 key tiles, the last partial


def _sequences_rows(chunks: tuple[torch.Tensor, torch.Tensor], splits: int) -> list[list[int]]:
    """The key rows each sequence's chunks read by the kernels' rule (SeqLens): min(span, seqused) rows from each
    chunk's start. Checks that the starts are in order and that what is read lies inside the packed rows."""
    cu, used = (t.tolist() for t in chunks)
    assert cu == sorted(cu), cu
    rows: list[list[int]] = [[] for _ in range(len(used) // splits)]
    for v, start in enumerate(cu[:-1]):
        count = min(cu[v + 1] - start, used[v])
        assert count >= 0 and start + count <= cu[-1], (v, cu, used)
        rows[v // splits].extend(range(start, start + count))
    return rows


def test_chunks_of_an_appended_cache_read_what_key_chunks_read():
    """SplitPlan.appended_chunks (constant starts, and the counts prepost.append writes, chunk_counts) against
    key_chunks of the clamped ends: every sequence reads the same rows, and a cache filled past its capacity (a
    caller's error) or below 0 reads none of the next sequence's."""
    capacity, added = 1000, 3
    plan = splitkv.SplitPlan(4, 1, 8, 2, capacity, 3, "cpu")
    assert (plan.splits, plan.chunk) == (3, 384)
    first = splitkv.row_starts(4, capacity, "cpu")
    for lengths in ([0, 381, 997, 500], [1200, -7, 383, 765], [-3, 0, 1, 2]):
        lengths = torch.tensor(lengths, dtype=torch.int32)
        starts, counts = plan.appended_chunks(capacity)
        assert counts.shape == (4, plan.splits) and counts.dtype == torch.int32
        got = (starts, chunk_counts(lengths, added, plan.splits, plan.chunk).flatten())
        want = plan.key_chunks(first, (lengths + added).clamp(0, capacity), 4 * capacity)
        assert _sequences_rows(got, plan.splits) == _sequences_rows(want, plan.splits)
    assert plan.appended_chunks(capacity)[0] is starts, "the starts are made once"


@pytest.mark.parametrize(
    "sizes, options, expected",
    [
        ((8, 1, 32768, 32, 8), {}, (0, 32768, 0)),  # decoding with grouped-query heads
        ((8, 1, 32768, 8, 8), {}, (0, 32768, 0)),  # 64 walks on 132 SMs: split
        ((8, 1, 32768, 8, 8), {"causal": True}, (0, 32768, 0)),
        ((8, 1, 32768, 8, 8), {"window_size": (4095, 0)}, (28672, 32768, 0)),
        ((8, 1, 32768, 8, 8), {"causal": True, "causal_align": "top_left"}, None),  # one key
        ((8, 4, 32768, 32, 8), {}, (0, 32768, 0)),  # a few unmasked queries
        ((8, 4, 32768, 32, 8), {"causal": True}, (0, 32765, 3)),  # several under a mask: a tail of 3 keys
        ((8, 4, 32768, 32, 8), {"window_size": (-1, 1)}, (0, 32766, 2)),
        ((8, 4, 32768, 32, 8), {"window_size": (-1, 3)}, (0, 32768, 0)),  # every query sees every key
        ((8, 4, 32768, 32, 8), {"causal": True, "causal_align": "top_left"}, None),
        ((8, 4, 32768, 32, 8), {"window_size": (100, 0)}, None),  # a left window: each row its own keys
        ((64, 1, 32768, 32, 32), {}, None),  # 2048 walks fill the GPU, nothing to pack
        ((8, 1, 1000, 32, 8), {}, None),  # too few keys to split
        ((8, 64, 32768, 32, 8), {}, None),  # 256 packed rows: a prefill, not a decode
    ],
)
def test_which_dense_calls_split(monkeypatch, sizes, options, expected):
    assert _key_range(monkeypatch, *sizes, **options) == expected


@pytest.mark.parametrize(
    "seqlen_q, seqlen_k, options",
    [
        (4, 50, {"causal": True}),  # a tail of 3 keys
        (3, 41, {"window_size": (-1, 1)}),  # a tail of 1
        (4, 50, {}),  # no mask, no tail
        (2, 50, {"causal": True, "softcap": 5.0}),
    ],
)
def test_dense_calls_of_a_few_rows_split_their_keys(stand_in, seqlen_q, seqlen_k, options):
    """flash_attn_func's split path on the float64 stand-ins: a few query rows (grouped-query packed) attend the
    keys that they all see in split chunks and, under a right-bounded mask, each sequence's last keys in a masked
    launch of their own, merged as one more split; against the spec."""
    generator = torch.Generator().manual_seed(seqlen_k)
    q = torch.randn(2, seqlen_q, 8, 16, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(2, seqlen_k, 2, 16, generator=generator, dtype=torch.float64) for _ in "kv")
    out, lse = flashcute.flash_attn_func(q, k, v, return_lse=True, **options)
    ref_out, ref_lse = attention_ref(q, k, v, return_lse=True, **options)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse.float(), rtol=1e-6, atol=1e-6)
    assert len(stand_in.calls) == (2 if "causal" in options or "window_size" in options else 1)
    assert len(stand_in.calls[0]["lengths_k"]) > 2, "each sequence's keys in several chunks"


# ---- on the GPU ----------------------------------------------------------------------------------------------


def _randn(*shape, dtype=torch.bfloat16, generator=None):
    return torch.randn(*shape, device="cuda", dtype=dtype, generator=generator)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("headdim", [64, 120, 256])
def test_the_combine_kernel_merges_by_the_formula(dtype, headdim):
    from flashcute.kernels.common import prepost

    generator = torch.Generator(device="cuda").manual_seed(headdim)
    batch, splits, seqlen_q, group, nheads_k = 3, 5, 2, 3, 2
    rows = seqlen_q * group
    partial_out = _randn(batch, splits, rows, nheads_k, headdim, dtype=dtype, generator=generator)
    partial_lse = _randn(nheads_k, batch, splits, rows, dtype=torch.float32, generator=generator) * 4
    partial_lse[0, 1, 2] = -math.inf  # an empty split
    partial_lse[1, 2, :, 0] = -math.inf  # a row no split saw
    out = torch.full((batch, seqlen_q, nheads_k * group, headdim), math.nan, device="cuda", dtype=dtype)
    lse = torch.full((batch, nheads_k * group, seqlen_q), math.nan, device="cuda")
    prepost.combine(
        partial_out,
        partial_lse,
        out.view(batch * seqlen_q, nheads_k, group, headdim).transpose(1, 2),
        lse.view(batch, nheads_k, group, seqlen_q),
    )
    lse_s = partial_lse.double().permute(1, 2, 3, 0)  # (batch, splits, rows, nheads_k)
    want_lse = torch.logsumexp(lse_s, dim=1)
    weights = torch.exp(lse_s - want_lse[:, None]).nan_to_num(0.0)
    want = (weights[..., None] * partial_out.double()).sum(1)  # (batch, rows, nheads_k, headdim)
    want = want.view(batch, seqlen_q, group, nheads_k, headdim).transpose(2, 3).reshape(out.shape)
    want_lse = want_lse.view(batch, seqlen_q, group, nheads_k).permute(0, 3, 2, 1).reshape(lse.shape)
    torch.testing.assert_close(out.double(), want, atol=1e-2, rtol=1e-2)
    assert (lse.isinf() == want_lse.isinf()).all()
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)
    empty = want_lse == -math.inf
    assert empty.any() and (out.permute(0, 2, 1, 3)[empty] == 0).all(), "a row no split saw: O = 0, LSE = -inf"


def _kernels() -> list[str]:
    return flashcute.available_kernels() if torch.cuda.is_available() else []


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", _kernels())
@pytest.mark.parametrize("num_splits", [1, 0, 3, 200])
@pytest.mark.parametrize(
    "seqlen_q, nheads, nheads_k, headdim, options",
    [
        (1, 8, 2, 128, {}),
        (1, 4, 4, 64, {"causal": True}),
        (1, 6, 1, 96, {"window_size": (300, 0)}),
        (3, 8, 2, 256, {}),
        (1, 16, 2, 128, {"softmax_scale": 0.3}),
        (4, 8, 2, 128, {"causal": True}),  # speculative decoding: the split keys and a masked tail
        (3, 4, 1, 64, {"window_size": (-1, 1)}),
    ],
)
def test_decoding_matches_the_spec(kernel, num_splits, seqlen_q, nheads, nheads_k, headdim, options):
    """flash_attn_with_kvcache over caches of 0, 1, a tile and a ragged length, with every split count (more
    splits than tiles of keys included)."""
    generator = torch.Generator(device="cuda").manual_seed(seqlen_q * headdim + nheads)
    capacity, lengths = 1500, [0, 1, 128, 1379]
    batch = len(lengths)
    q = _randn(batch, seqlen_q, nheads, headdim, generator=generator)
    k_cache, v_cache = (_randn(batch, capacity, nheads_k, headdim, generator=generator) for _ in "kv")
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out, lse = flashcute.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=seqlens, num_splits=num_splits, return_lse=True, kernel=kernel, **options
    )
    for b, n in enumerate(lengths):
        if n == 0:
            assert torch.equal(out[b], torch.zeros_like(out[b])) and (lse[b] == -math.inf).all()
            continue
        keys, values = k_cache[b : b + 1, :n], v_cache[b : b + 1, :n]
        check_against_spec(out[b : b + 1], lse[b : b + 1], q[b : b + 1], keys, values, **options)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", _kernels())
@pytest.mark.parametrize(
    "batch, seqlen_q, seqlen_k, nheads, nheads_k, options",
    [
        (2, 1, 3000, 8, 2, {}),
        (3, 1, 2500, 4, 4, {"causal": True}),
        (2, 1, 5000, 8, 1, {"window_size": (1500, 0)}),
        (2, 2, 4000, 8, 2, {}),
        (2, 4, 3000, 8, 2, {"causal": True}),
        (1, 3, 2000, 6, 3, {"window_size": (-1, 1), "softcap": 20.0}),
    ],
)
def test_dense_decoding_takes_the_split_path(monkeypatch, kernel, batch, seqlen_q, seqlen_k, nheads, nheads_k, options):
    calls = []
    attention = splitkv.SplitPlan.attention
    monkeypatch.setattr(splitkv.SplitPlan, "attention", lambda *a, **kw: calls.append(a) or attention(*a, **kw))
    q = _randn(batch, seqlen_q, nheads, 128)
    k, v = (_randn(batch, seqlen_k, nheads_k, 128) for _ in "kv")
    out, lse = flashcute.flash_attn_func(q, k, v, return_lse=True, kernel=kernel, **options)
    assert len(calls) == 1, "a decoding-sized call takes the split-KV path"
    check_against_spec(out, lse, q, k, v, **options)
    q.requires_grad_(True)
    out_grad = flashcute.flash_attn_func(q, k, v, kernel=kernel, **options)
    assert len(calls) == 1, "a call that builds a graph for the backward keeps the plain launch"
    torch.testing.assert_close(out_grad.detach(), out, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dims, options", [((192, 128), {}), ((128, 64), {"causal": True})], ids=str)
def test_dense_decoding_with_v_of_a_head_dim_of_its_own(monkeypatch, head_dims, options, kernel):
    """Decoding with v's head dim apart from q's takes the split-KV path too: its partial O and the combine at v's
    head dim."""
    calls = []
    attention = splitkv.SplitPlan.attention
    monkeypatch.setattr(splitkv.SplitPlan, "attention", lambda *a, **kw: calls.append(a) or attention(*a, **kw))
    head_dim, head_dim_v = head_dims
    q, k, v = _randn(2, 1, 8, head_dim), _randn(2, 3000, 2, head_dim), _randn(2, 3000, 2, head_dim_v)
    out, lse = flashcute.flash_attn_func(q, k, v, return_lse=True, kernel=kernel, **options)
    assert len(calls) == 1 and out.shape == (2, 1, 8, head_dim_v)
    check_against_spec(out, lse, q, k, v, **options)
