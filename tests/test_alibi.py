"""ALiBi on the GPU (alibi_slopes, flash_attn's convention: the score of query i and key j gets
-slope * |i + seqlen_k - seqlen_q - j|, MPT/BLOOM): the forward into NaN-poisoned outputs and its LSE against the
float64 spec, the gradients against float64 autograd through the spec (design.md's error budget), on every kernel
family, with slopes per head and per (sequence, head), through flash_attn_func, flash_attn_varlen_func and
flash_attn_with_kvcache, alone and with masks, windows, GQA, softcap and sinks."""

from __future__ import annotations

import math

import pytest
import torch

import flashcute
from flashcute.reference import attention_kvcache_ref
from tests.helpers import check_forward
from tests.test_bwd import check_against_spec_grads, check_grads
from tests.test_varlen import check_sequences, cu_seqlens, packed, starts

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]
MASKS = [{}, {"causal": True}, {"window_size": (40, 9)}, {"causal": True, "causal_align": "top_left"}]


def slopes(nheads: int, batch: int | None = None) -> torch.Tensor:
    """ALiBi's geometric slopes 2^(-8 (h + 1) / nheads) (the MPT/BLOOM choice), per head, or per (sequence, head)
    scaled by the sequence (a different bias per sequence), float32 on the GPU."""
    per_head = torch.tensor([2 ** (-8 * (h + 1) / nheads) for h in range(nheads)])
    if batch is None:
        return per_head.cuda()
    return (per_head[None] * torch.arange(1, batch + 1)[:, None]).cuda()


def inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype):
    q = torch.randn(batch, seqlen_q, nheads, head_dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, seqlen_k, nheads_k, head_dim, device="cuda", dtype=dtype) for _ in "kv")
    return q, k, v


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("per_sequence", [False, True])
@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(1, 1), (113, 203), (700, 700), (300, 70)], ids=str)
def test_forward(dtype, per_sequence, mask, seqlen_q, seqlen_k, kernel):
    q, k, v = inputs(2, seqlen_q, seqlen_k, 4, 2, 128, dtype)
    check_forward(q, k, v, kernel, alibi_slopes=slopes(4, 2 if per_sequence else None), **mask)


@pytest.mark.parametrize("head_dim", [32, 64, 96, 192, 256, 72])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_head_dims(head_dim, causal, kernel):
    """Long enough that the Hopper forward's free tiles lie on both sides of the diagonal and across it (its linear
    form on the first two, common/alibi.py), at every head dim's tiles."""
    check_forward(*inputs(1, 640, 900, 4, 2, head_dim, torch.bfloat16), kernel, alibi_slopes=slopes(4), causal=causal)


def test_forward_steep_and_flat_slopes(kernel):
    """Slopes from 0 (no bias) to 4 (every key but the nearest few far below), and a negative one (the bias rises
    with distance: flash_attn's formula takes any sign)."""
    q, k, v = inputs(1, 257, 600, 4, 4, 64, torch.float16)
    check_forward(q, k, v, kernel, alibi_slopes=torch.tensor([0.0, 4.0, 1e-3, -0.01], device="cuda"))


@pytest.mark.parametrize("mask", MASKS[:2], ids=str)
def test_forward_with_softcap_and_sinks(mask, kernel):
    q, k, v = inputs(2, 200, 333, 4, 1, 64, torch.bfloat16)
    sink = torch.randn(4, device="cuda")
    options = {"softcap": 3.0, "learnable_sink": sink, "alibi_slopes": slopes(4, 2), **mask}
    check_forward(q * 2, k, v, kernel, **options)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_backward(dtype, mask, head_dim, kernel):
    check_grads(*inputs(2, 203, 177, 4, 2, head_dim, dtype), kernel=kernel, alibi_slopes=slopes(4, 2), **mask)


@pytest.mark.parametrize("head_dim", [32, 96, 192, 256])
def test_backward_head_dims(head_dim, kernel):
    q, k, v = inputs(1, 150, 260, 2, 1, head_dim, torch.bfloat16)
    check_grads(q, k, v, kernel=kernel, alibi_slopes=slopes(2), causal=True)


@pytest.mark.parametrize("mask", MASKS[:3], ids=str)
def test_deterministic_backward(mask):
    check_grads(*inputs(2, 190, 190, 2, 2, 128, torch.float16), deterministic=True, alibi_slopes=slopes(2), **mask)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("head_dim", [64, 192])
def test_backward_with_softcap(deterministic, head_dim, kernel):
    """With a cap too, the cap's derivative takes t from before the bias (softcap.softcap_grad_kept); at D=192 on
    the Hopper backward's kernel for head dims over 128."""
    q, k, v = inputs(2, 190, 230, 4, 2, head_dim, torch.bfloat16)
    options = {"softcap": 3.0, "alibi_slopes": slopes(4, 2), "causal": True}
    check_grads(q * 2, k, v, kernel=kernel, deterministic=deterministic, **options)


def test_a_call_without_alibi_is_unchanged(kernel):
    q, k, v = inputs(1, 257, 257, 2, 2, 128, torch.bfloat16)
    plain = flashcute.flash_attn_func(q, k, v, causal=True, kernel=kernel)
    assert torch.equal(flashcute.flash_attn_func(q, k, v, causal=True, alibi_slopes=None, kernel=kernel), plain)
    zero = flashcute.flash_attn_func(q, k, v, causal=True, alibi_slopes=torch.zeros(2, device="cuda"), kernel=kernel)
    torch.testing.assert_close(zero, plain)  # a zero slope adds 0
    biased = flashcute.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes(2), kernel=kernel)
    assert not torch.equal(biased, plain)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_forward_and_backward(causal, kernel):
    """Each sequence its own slopes and its own diagonal (seqlen_k - seqlen_q of that sequence)."""
    lens_q, lens_k = [5, 0, 130, 300, 4], [7, 3, 130, 90, 0]
    q, k, v = (
        packed(sum(n), h, 64, torch.bfloat16, seed) for n, h, seed in ((lens_q, 4, 1), (lens_k, 2, 2), (lens_k, 2, 3))
    )
    alibi = slopes(4, len(lens_q))
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = flashcute.flash_attn_varlen_func(
        *leaves, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, return_lse=True, kernel=kernel,
        alibi_slopes=alibi,
    )  # fmt: skip
    for b in range(len(lens_q)):  # sequence by sequence: its own row of slopes
        one = ([lens_q[b]], [lens_k[b]])
        sq, sk = starts(lens_q), starts(lens_k)
        rows_q, rows_k = slice(sq[b], sq[b] + lens_q[b]), slice(sk[b], sk[b] + lens_k[b])
        check_sequences(
            out.detach()[rows_q], lse[:, rows_q], q[rows_q], k[rows_k], v[rows_k], *one,
            causal=causal, alibi_slopes=alibi[b],
        )  # fmt: skip
    dout = torch.randn_like(out)
    out.backward(dout)
    sq, sk = starts(lens_q), starts(lens_k)
    b = 3  # the longest sequence: its gradients against the spec
    rows_q, rows_k = slice(sq[b], sq[b] + lens_q[b]), slice(sk[b], sk[b] + lens_k[b])
    ours = tuple(t.grad[None, rows] for t, rows in zip(leaves, (rows_q, rows_k, rows_k), strict=True))
    options = {"causal": causal, "alibi_slopes": alibi[b]}
    check_against_spec_grads(ours, q[None, rows_q], k[None, rows_k], v[None, rows_k], dout[None, rows_q], **options)


@pytest.mark.parametrize("seqlen_q", [1, 3])
def test_kvcache_with_alibi(seqlen_q, kernel):
    """Through the cache entry (never split: the bias needs each key's position), per-sequence slopes, with a
    sequence whose cache is empty."""
    q, k_cache, v_cache = inputs(3, seqlen_q, 2000, 8, 2, 64, torch.float16)
    lengths = torch.tensor([1500, 0, 2000], dtype=torch.int32, device="cuda")
    options = {"cache_seqlens": lengths, "causal": True, "alibi_slopes": slopes(8, 3)}
    out, lse = flashcute.flash_attn_with_kvcache(q, k_cache, v_cache, return_lse=True, kernel=kernel, **options)
    ref, ref_lse, _, _ = attention_kvcache_ref(q, k_cache, v_cache, **options)
    torch.testing.assert_close(out.double(), ref, atol=2e-3, rtol=0)
    empty = ref_lse == -math.inf
    assert torch.equal(lse == -math.inf, empty)
    torch.testing.assert_close(lse[~empty].double(), ref_lse[~empty], atol=1e-4, rtol=1e-4)
