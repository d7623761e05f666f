"""Calls the kernels do not take as they are. Head dims that are not multiples of 8 (the kernels' 16-byte rows):
every entry runs them on zero-padded copies, as flash_attn does. A batch or a length of 0: flash_attn_func returns
without a launch (out empty, or O = 0 and LSE = -inf or the sink; zero gradients). On the CPU through the float64
stand-in launch (conftest's stand_in, which also lets CPU tensors through): what the launch sees and what the
caller gets back. The GPU tests (test_fwd, test_bwd, test_varlen, test_kvcache_gpu) run the kernels."""

from __future__ import annotations

import math

import pytest
import torch

import flashcute
from flashcute.interface import pad_head_dims
from flashcute.reference import attention_ref, attention_varlen_ref


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_pad_head_dims_adds_zero_columns_only_where_needed():
    a, b = randn(2, 3, 5), randn(2, 3, 16)
    padded_a, padded_b, none = pad_head_dims(a, b, None)
    assert padded_a.shape == (2, 3, 8) and torch.equal(padded_a[..., :5], a) and not padded_a[..., 5:].any()
    assert padded_b is b and none is None


@pytest.mark.parametrize("head_dims", [(12, 12), (5, 3), (16, 5), (3, 16)], ids=str)
@pytest.mark.parametrize("options", [{}, {"causal": True}, {"softmax_scale": 0.3, "softcap": 2.0}], ids=str)
def test_flash_attn_func_launches_padded_copies(stand_in, head_dims, options):
    """A decoding-shaped call (the split path, which the stand-in runs): the launch sees head dims rounded up to
    multiples of 8, the caller gets out at v's given head dim and the default scale of q's given head dim."""
    head_dim, head_dim_v = head_dims
    q, k, v = randn(2, 1, 4, head_dim, seed=1), randn(2, 50, 2, head_dim, seed=2), randn(2, 50, 2, head_dim_v, seed=3)
    out, lse = flashcute.flash_attn_func(q, k, v, return_lse=True, **options)
    ref_out, ref_lse = attention_ref(q, k, v, return_lse=True, **options)
    assert out.shape == (2, 1, 4, head_dim_v)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse.float(), rtol=1e-6, atol=1e-6)
    assert stand_in.calls
    for call in stand_in.calls:
        assert call["q"].shape[-1] == call["k"].shape[-1] == -(-head_dim // 8) * 8
        assert call["v"].shape[-1] == -(-head_dim_v // 8) * 8
    assert torch.equal(flashcute.flash_attn_func(q, k, v, **options), out), "a repeated call takes the same path"


@pytest.mark.parametrize("head_dims", [(12, 12), (20, 7)], ids=str)
def test_flash_attn_varlen_func_launches_padded_copies(stand_in, head_dims):
    """A packed batch with an empty sequence and seqused_q: out at v's given head dim, rows past seqused_q zero."""
    head_dim, head_dim_v = head_dims
    lens_q, lens_k, used_q = [3, 0, 5], [4, 2, 7], [3, 0, 2]
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32) for n in (lens_q, lens_k))
    q = randn(sum(lens_q), 4, head_dim, seed=1)
    k, v = randn(sum(lens_k), 2, head_dim, seed=2), randn(sum(lens_k), 2, head_dim_v, seed=3)
    used = torch.tensor(used_q, dtype=torch.int32)
    options = {"causal": True, "seqused_q": used, "return_lse": True}
    out, lse = flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 7, **options)
    ref_out, ref_lse = attention_varlen_ref(q, k, v, cu_q, cu_k, used, None, causal=True, return_lse=True)
    assert out.shape == (sum(lens_q), 4, head_dim_v) and lse.shape == (4, sum(lens_q))
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    counted = ref_lse > -math.inf
    assert torch.equal(lse > -math.inf, counted)
    torch.testing.assert_close(lse[counted].float(), ref_lse[counted].float())
    (call,) = stand_in.calls
    assert call["q"].shape[-1] % 8 == 0 and call["v"].shape[-1] % 8 == 0


@pytest.mark.parametrize("sizes", [(2, 3, 0), (0, 3, 5), (2, 0, 5)], ids=["no key", "no sequence", "no query"])
@pytest.mark.parametrize("options", [{}, {"causal": True}, {"learnable_sink": True}, {"alibi_slopes": True}], ids=str)
def test_an_empty_batch_or_length_launches_nothing(stand_in, sizes, options):
    """Out and LSE of the spec in the kernels' dtypes, no launch, gradients of the inputs' shapes (zero)."""
    batch, seqlen_q, seqlen_k = sizes
    q = randn(batch, seqlen_q, 4, 16, seed=1).bfloat16().requires_grad_()
    k, v = (randn(batch, seqlen_k, 2, 16, seed=s).bfloat16().requires_grad_() for s in (2, 3))
    if "learnable_sink" in options:
        options = {"learnable_sink": randn(4, seed=4).float().requires_grad_()}
    if "alibi_slopes" in options:
        options = {"alibi_slopes": randn(4, seed=5).abs().float(), "window_size": (2, 1)}
    out, lse = flashcute.flash_attn_func(q, k, v, return_lse=True, **options)
    ref_out, ref_lse = attention_ref(q, k, v, return_lse=True, **options)
    assert not stand_in.calls
    assert out.shape == (batch, seqlen_q, 4, 16) and out.dtype == torch.bfloat16 and not out.any()
    assert lse.shape == (batch, 4, seqlen_q) and lse.dtype == torch.float32
    assert torch.equal(lse, ref_lse.float())
    assert torch.equal(out, ref_out.bfloat16())
    out.sum().backward()
    for t in (q, k, v, options.get("learnable_sink")):
        if t is not None:
            assert t.grad is not None and t.grad.shape == t.shape and not t.grad.any()
    with pytest.raises(ValueError, match="kernel"):
        flashcute.flash_attn_func(q, k, v, kernel="no-such-kernel")
