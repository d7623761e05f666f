"""Softcap on the GPU (scores capped to softcap * tanh(score / softcap) before the mask and softmax, Gemma 2's
convention): the forward into NaN-poisoned outputs and its LSE against the float64 spec, the gradients against
float64 autograd through the spec (design.md's error budget), on every kernel family, through flash_attn_func and
flash_attn_varlen_func; caps from saturating (1: most scores sit on tanh's flat ends) to nearly linear (50). The
random cases of test_fwd.py and test_bwd.py draw softcaps too, and test_kvcache_gpu.py takes it through the cache."""

from __future__ import annotations

import pytest
import torch

import flashcute
from tests.helpers import check_against_spec, check_forward
from tests.test_bwd import check_against_spec_grads, check_grads
from tests.test_varlen import check_sequences, cu_seqlens, packed, starts

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]
CAPS = [1.0, 5.0, 50.0]
MASKS = [{}, {"causal": True}, {"window_size": (40, 9)}, {"causal": True, "causal_align": "top_left"}]


def inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, scale=2.0):
    """q, k, v with scores a few times wider than unit-variance inputs give, so that the cap bends them."""
    q = torch.randn(batch, seqlen_q, nheads, head_dim, device="cuda", dtype=dtype) * scale
    k, v = (torch.randn(batch, seqlen_k, nheads_k, head_dim, device="cuda", dtype=dtype) for _ in "kv")
    return q, k, v


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("softcap", CAPS)
@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(1, 1), (113, 203), (700, 700)], ids=str)
def test_forward(dtype, softcap, mask, seqlen_q, seqlen_k, kernel):
    check_forward(*inputs(2, seqlen_q, seqlen_k, 4, 2, 128, dtype), kernel, softcap=softcap, **mask)


@pytest.mark.parametrize("head_dim", [32, 64, 96, 192, 256, 72])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_head_dims(head_dim, causal, kernel):
    check_forward(*inputs(1, 300, 300, 2, 2, head_dim, torch.bfloat16), kernel, softcap=3.0, causal=causal)


def test_forward_scale_and_cap_apart(kernel):
    """A softmax_scale of its own: the cap bends softmax_scale * q.k, not q.k."""
    check_forward(*inputs(2, 200, 333, 2, 1, 64, torch.float16), kernel, softcap=2.0, softmax_scale=0.4)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("softcap", CAPS)
@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_backward(dtype, softcap, mask, head_dim, kernel):
    check_grads(*inputs(2, 203, 177, 4, 2, head_dim, dtype), kernel=kernel, softcap=softcap, **mask)


@pytest.mark.parametrize("head_dim", [32, 96, 192, 256])
def test_backward_head_dims(head_dim, kernel):
    check_grads(*inputs(1, 150, 260, 2, 1, head_dim, torch.bfloat16), kernel=kernel, softcap=4.0, causal=True)


@pytest.mark.parametrize("mask", MASKS[:3], ids=str)
def test_deterministic_backward(mask):
    check_grads(*inputs(2, 190, 190, 2, 2, 128, torch.float16), deterministic=True, softcap=3.0, **mask)


def test_a_call_without_softcap_is_unchanged(kernel):
    """softcap = 0 runs the plain kernel: bitwise the same output as a call that never names it."""
    q, k, v = inputs(1, 257, 257, 2, 2, 128, torch.bfloat16)
    plain = flashcute.flash_attn_func(q, k, v, causal=True, kernel=kernel)
    assert torch.equal(flashcute.flash_attn_func(q, k, v, causal=True, softcap=0.0, kernel=kernel), plain)
    capped = flashcute.flash_attn_func(q, k, v, causal=True, softcap=1.0, kernel=kernel)
    assert not torch.equal(capped, plain)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_forward_and_backward(causal, kernel):
    lens_q, lens_k = [5, 0, 130, 300], [7, 3, 130, 90]
    q, k, v = (
        packed(sum(n), h, 64, torch.bfloat16, seed) * 2
        for n, h, seed in ((lens_q, 4, 1), (lens_k, 2, 2), (lens_k, 2, 3))
    )
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    options = {"causal": causal, "softcap": 2.0}
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = flashcute.flash_attn_varlen_func(
        *leaves, cu_q, cu_k, max(lens_q), max(lens_k), return_lse=True, kernel=kernel, **options
    )
    check_sequences(out.detach(), lse, q, k, v, lens_q, lens_k, **options)
    dout = torch.randn_like(out)
    out.backward(dout)
    sq, sk = starts(lens_q), starts(lens_k)
    b = 3  # the longest sequence: its gradients against the spec
    rows_q, rows_k = slice(sq[b], sq[b] + lens_q[b]), slice(sk[b], sk[b] + lens_k[b])
    ours = tuple(t.grad[None, rows] for t, rows in zip(leaves, (rows_q, rows_k, rows_k), strict=True))
    check_against_spec_grads(ours, q[None, rows_q], k[None, rows_k], v[None, rows_k], dout[None, rows_q], **options)


def test_split_kv_decoding_with_softcap(kernel):
    """One query row against a long cache takes the split-KV path; the cap applies in every split."""
    q, k, v = inputs(2, 1, 5000, 8, 2, 128, torch.bfloat16)
    out, lse = flashcute.flash_attn_func(q, k, v, causal=True, softcap=5.0, return_lse=True, kernel=kernel)
    check_against_spec(out, lse, q, k, v, causal=True, softcap=5.0)
