"""flash_attn_varlen_func over a paged KV cache (``block_table``, flash_attn's paged KV: chunked prefill and
decoding against pages): on the CPU through the float64 stand-in launch (pages read where they lie, or gathered
for a family that reads one tensor), validation; on the GPU, every family against the spec."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flashcute
from flashcute.kernels import registry
from flashcute.reference import attention_varlen_ref
from tests.helpers import check_against_spec

I32 = torch.int32


def cu(lengths, device="cpu") -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=I32, device=device)


def paged_problem(lens_q, lens_k, page, pages_per_seq, nheads=4, nheads_k=2, head_dim=8, seed=0, **to):
    """(q packed, k pages, v pages, block_table, cu_seqlens_q, cu_seqlens_k, and the keys gathered per sequence as
    a packed (total_k, nheads_k, head_dim) pair): every sequence's pages drawn without repeats from a pool with
    spare pages, table entries past a sequence's keys out of range (never read)."""
    generator = torch.Generator().manual_seed(seed)
    batch = len(lens_q)
    num_blocks = batch * pages_per_seq + 3
    q = torch.randn(sum(lens_q), nheads, head_dim, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(num_blocks, page, nheads_k, head_dim, generator=generator, dtype=torch.float64) for _ in "kv")
    table = torch.randperm(num_blocks, generator=generator)[: batch * pages_per_seq].view(batch, pages_per_seq)
    table = table.to(I32)
    for b, n in enumerate(lens_k):
        table[b, -(-n // page) :] = num_blocks + 7  # pages no key of the sequence is in
    rows = [(table[b, p // page].item(), p % page) for b, n in enumerate(lens_k) for p in range(n)]
    gathered = [torch.stack([t[r] for r in rows]) if rows else t[:0, 0] for t in (k, v)]
    tensors = (q, k, v, table, cu(lens_q), cu(lens_k))
    move = lambda t: t.to(**to) if t.is_floating_point() else t.to(to.get("device", "cpu"))  # noqa: E731
    return tuple(move(t) for t in tensors), tuple(move(t) for t in gathered)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lens=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 12)), min_size=1, max_size=3),
    page=st.sampled_from([1, 3, 4]),
    options=st.sampled_from([{}, {"causal": True}, {"window_size": (2, 1)}, {"softcap": 2.0}]),
    in_place=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_matches_the_spec_on_the_gathered_keys(monkeypatch, stand_in, lens, page, options, in_place, seed):
    lens_q, lens_k = [n for n, _ in lens], [n for _, n in lens]
    pages_per_seq = max(1, -(-max(lens_k) // page))
    (q, k, v, table, cu_q, cu_k), (keys, values) = paged_problem(lens_q, lens_k, page, pages_per_seq, seed=seed)
    monkeypatch.setattr(registry, "reads_pages", lambda *args: in_place)
    stand_in.calls.clear()
    out, lse = flashcute.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), block_table=table, return_lse=True, **options
    )
    ref_out, ref_lse = attention_varlen_ref(q, keys, values, cu_q, cu_k, return_lse=True, **options)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    seen = ref_lse > -math.inf
    assert torch.equal(lse > -math.inf, seen)
    torch.testing.assert_close(lse[seen].double(), ref_lse[seen], rtol=1e-6, atol=1e-6)
    if stand_in.calls and q.shape[0]:
        assert bool(stand_in.calls[0]["pages"]) == in_place, "pages read where they lie only where the family can"


def test_seqused_k_limits_the_keys(stand_in):
    (q, k, v, table, cu_q, cu_k), _ = paged_problem([2, 3], [9, 5], 4, 3, seed=3)
    used = torch.tensor([4, 0], dtype=I32)
    (_, _, _, _, _, cu_used), (keys, values) = paged_problem([2, 3], [4, 0], 4, 3, seed=3)
    out = flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 9, block_table=table, seqused_k=used)
    torch.testing.assert_close(out, attention_varlen_ref(q, keys, values, cu_q, cu_used), rtol=0, atol=1e-12)


@pytest.mark.parametrize("paged", [False, True])
def test_left_out_max_seqlens_bound_the_launch_by_the_totals(stand_in, paged):
    """flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k) as flash-attn-4 takes it: the launch is sized by
    the total rows (the pages a sequence has) and computes what the call with the true maxima does."""
    (q, k, v, table, cu_q, cu_k), (keys, values) = paged_problem([2, 3], [9, 5], 4, 3, seed=6)
    if not paged:
        k, v, table = keys, values, None
    out = flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, block_table=table, causal=True)
    assert stand_in.calls[0]["max_seqlens"] == (5, 12 if paged else 14)
    expected = flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 9, block_table=table, causal=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("needs_grad", ["q", "k", "sink"])
def test_inputs_that_need_grad_run_the_forward_and_refuse_the_backward(stand_in, needs_grad):
    """flash_attn's own tests run a paged forward on a q that requires grad: the forward runs (the same launch as
    without grad), and a backward through either output raises, naming what has none."""
    (q, k, v, table, cu_q, cu_k), _ = paged_problem([2, 3], [9, 5], 4, 3, seed=4)
    sink = torch.randn(4, dtype=torch.float64)
    call = (cu_q, cu_k, 3, 9)
    with torch.no_grad():
        expected = flashcute.flash_attn_varlen_func(q, k, v, *call, block_table=table, learnable_sink=sink)
    {"q": q, "k": k, "sink": sink}[needs_grad].requires_grad_()
    out, lse = flashcute.flash_attn_varlen_func(q, k, v, *call, block_table=table, learnable_sink=sink, return_lse=True)
    assert len(stand_in.calls) == 2
    torch.testing.assert_close(out.detach(), expected, rtol=0, atol=0)
    assert out.requires_grad and lse.requires_grad
    for loss in (out.sum(), lse.sum()):
        with pytest.raises(RuntimeError, match=re.escape("with block_table (paged keys) has no backward")):
            loss.backward()


@pytest.mark.parametrize(
    "change, error, message",
    [
        ({"max_seqlen_k": 9}, ValueError, "max_seqlen_k (9) must be at most the pages a sequence has"),
        ({"block_table": torch.zeros(2, 2, dtype=I32)}, ValueError, "block_table must have shape (batch, "),
        ({"block_table": torch.zeros(1, 2)}, TypeError, "block_table must have dtype int32"),
        ({"k": torch.zeros(4, 4, 2, 8, dtype=torch.float64)[..., 0]}, ValueError, "k must have 4 dimensions"),
    ],
)
def test_bad_paged_arguments_are_named(stand_in, change, error, message):
    (q, k, v, table, cu_q, cu_k), _ = paged_problem([2], [5], 4, 2)
    call = {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "max_seqlen_q": 2}
    call |= {"max_seqlen_k": 5, "block_table": table, **change}
    with pytest.raises(error, match=re.escape(message)):
        flashcute.flash_attn_varlen_func(**call)


def test_dense_sides_as_flash_attn_4_takes_them(stand_in):
    """cu_seqlens_q None: q is (batch, seqlen_q, nheads, headdim), out likewise and lse (batch, nheads, seqlen_q);
    cu_seqlens_k None: k and v dense (batch, seqlen_k, ...) or a paged cache's whole pages, seqused_k counted."""
    generator = torch.Generator().manual_seed(11)
    q = torch.randn(3, 2, 4, 8, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(3, 6, 2, 8, generator=generator, dtype=torch.float64) for _ in "kv")
    used = torch.tensor([6, 0, 3], dtype=I32)
    packed_q, rows_q = q.reshape(6, 4, 8), cu([2, 2, 2])
    packed_k, packed_v = k.reshape(18, 2, 8), v.reshape(18, 2, 8)
    expected = flashcute.flash_attn_varlen_func(
        packed_q, packed_k, packed_v, rows_q, cu([6, 6, 6]), 2, 6, seqused_k=used, causal=True, return_lse=True
    )
    for sides in ((None, None, None, None), (rows_q, None, 2, None), (None, cu([6, 6, 6]), None, 6)):
        stand_in.calls.clear()
        dense_q = sides[0] is None
        tensors = (q if dense_q else packed_q, *((k, v) if sides[1] is None else (packed_k, packed_v)))
        out, lse = flashcute.flash_attn_varlen_func(*tensors, *sides, seqused_k=used, causal=True, return_lse=True)
        # both sides dense: flash_attn_with_kvcache's split keys (more sequences than 3 in a launch)
        assert (len(stand_in.calls[0]["lengths_k"]) > 3) == (sides[1] is None and dense_q)
        if dense_q:
            assert out.shape == q.shape and lse.shape == (3, 4, 2) and lse.is_contiguous()
            out, lse = out.reshape(6, 4, 8), lse.transpose(0, 1).reshape(4, 6)
        torch.testing.assert_close(out, expected[0], rtol=0, atol=1e-12)  # (both dense: split, then merged)
        torch.testing.assert_close(lse.double(), expected[1].double(), rtol=1e-6, atol=1e-6)  # (float32 there)
    (q_pages, k_pages, v_pages, table, _, _), (keys, values) = paged_problem([2, 2], [7, 3], 4, 2, seed=5)
    full_pages = paged_problem([2, 2], [8, 8], 4, 2, seed=5)[0]
    table = full_pages[3]  # every page of a sequence in use
    out = flashcute.flash_attn_varlen_func(
        q_pages.view(2, 2, 4, 8), k_pages, v_pages, None, None, None, None, seqused_k=torch.tensor([7, 3], dtype=I32),
        block_table=table,
    )  # fmt: skip
    rows = [(table[b, p // 4].item(), p % 4) for b, n in enumerate([7, 3]) for p in range(n)]
    keys, values = (torch.stack([t[r] for r in rows]) for t in (k_pages, v_pages))
    ref = attention_varlen_ref(q_pages, keys, values, cu([2, 2]), cu([7, 3]))
    torch.testing.assert_close(out.reshape(4, 4, 8), ref, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=re.escape("q must have shape (batch, seqlen_q, nheads, headdim) when")):
        flashcute.flash_attn_varlen_func(packed_q, k, v, None, None, None, None)


# ---- on the GPU ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("page", [16, 64, 256])
@pytest.mark.parametrize("options", [{}, {"causal": True}], ids=["no mask", "causal"])
def test_every_family_against_the_spec(page, options, kernel):
    """A chunked prefill and decoding rows against pages, an empty sequence, lengths off the page edges."""
    lens_q, lens_k = [1, 130, 0, 7], [700, 300, 5, 1]
    to = {"device": "cuda", "dtype": torch.bfloat16}
    problem, (keys, values) = paged_problem(lens_q, lens_k, page, -(-700 // page), 8, 2, 128, seed=page, **to)
    q, k, v, table, cu_q, cu_k = problem
    with torch.no_grad():
        out, lse = flashcute.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, 130, 700, block_table=table, return_lse=True, kernel=kernel, **options
        )
    starts_q, starts_k = cu_q.tolist(), cu_k.tolist()
    for b in range(len(lens_q)):
        if not lens_q[b] or not lens_k[b]:
            continue
        sq, sk = slice(starts_q[b], starts_q[b + 1]), slice(starts_k[b], starts_k[b + 1])
        check_against_spec(out[None, sq], lse[None, :, sq], q[None, sq], keys[None, sk], values[None, sk], **options)


@pytest.mark.gpu
def test_inputs_that_need_grad_run_the_paged_forward(kernel):
    """flash_attn's own tests' call: a paged forward on a q that requires grad gives the no-grad call's out, and a
    backward through it raises."""
    to = {"device": "cuda", "dtype": torch.bfloat16}
    (q, k, v, table, cu_q, cu_k), _ = paged_problem([3, 130], [700, 64], 64, 11, 8, 2, 128, seed=2, **to)
    call = (k, v, cu_q, cu_k, 130, 700)
    with torch.no_grad():
        expected = flashcute.flash_attn_varlen_func(q, *call, block_table=table, causal=True, kernel=kernel)
    out = flashcute.flash_attn_varlen_func(q.requires_grad_(), *call, block_table=table, causal=True, kernel=kernel)
    assert torch.equal(out.detach(), expected)
    with pytest.raises(RuntimeError, match=re.escape("with block_table (paged keys) has no backward")):
        out.sum().backward()


@pytest.mark.gpu
def test_decoding_rows_as_flash_attn_4_passes_them(kernel):
    """A dense q of a few rows a sequence against a paged cache's pages, cu_seqlens None and seqused_k (flash-attn-4's
    way of decoding through its varlen entry), causal, against the spec on each sequence's keys."""
    lens_k, page = [700, 1, 300, 64], 64
    to = {"device": "cuda", "dtype": torch.bfloat16}
    (_, k, v, table, _, _), (keys, values) = paged_problem([3] * 4, lens_k, page, 11, 8, 2, 128, seed=1, **to)
    q = torch.randn(4, 3, 8, 128, **to)
    used = torch.tensor(lens_k, dtype=I32, device="cuda")
    with torch.no_grad():
        out, lse = flashcute.flash_attn_varlen_func(
            q, k, v, None, None, None, None, seqused_k=used, block_table=table, causal=True, return_lse=True,
            kernel=kernel,
        )  # fmt: skip
    assert out.shape == q.shape and lse.shape == (4, 8, 3)
    starts = cu(lens_k).tolist()
    for b in range(4):
        sk = slice(starts[b], starts[b + 1])
        check_against_spec(out[b : b + 1], lse[b : b + 1], q[b : b + 1], keys[None, sk], values[None, sk], causal=True)
