"""Peaked softmax rows on the GPU: flashcute's error against the float64 spec, beside PyTorch's FlashAttention-2
kernel (SDPA's flash backend) on the same inputs.

With scores of standard deviation about 9 (q and k drawn with standard deviation 3 at head dim 128) most rows put
nearly all their weight on one key. An eager kernel's largest E in such a row is exactly 1, exact in 16 bits; with
lazy rescaling it is any value up to 2^8, and unless P's rounding of it reaches l as it reaches U the forward's max
error doubles and dQ's error follows it (docs/numerics.md, Peaked rows under lazy rescaling). The kernels do not
close that gap yet: the test is expected to fail, strictly, so that a kernel that closes it is noticed.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcute
from flashcute.reference import attention_ref

pytestmark = pytest.mark.gpu

SEEDS = (0, 1, 2)


def peaked_inputs(seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """q, k, v and dO of (1, 2048, 8, 128), q, k and v with standard deviation 3."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (3 * torch.randn(1, 2048, 8, 128, device="cuda", generator=generator) for _ in "qkv")
    dout = torch.randn(1, 2048, 8, 128, device="cuda", generator=generator)
    return tuple(t.to(dtype) for t in (q, k, v, dout))


def errors(attention, q, k, v, dout, expected, expected_dq) -> tuple[float, float]:
    """(max abs error of out, relative L2 error of dq) of ``attention(q, k, v)`` (bshd, causal)."""
    q = q.detach().requires_grad_()
    out = attention(q, k, v)
    (dq,) = torch.autograd.grad(out, q, dout)
    out_error = (out.double() - expected).abs().max().item()
    dq_error = ((dq.double() - expected_dq).norm() / expected_dq.norm()).item()
    return out_error, dq_error


def sdpa_flash(q, k, v):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
    return out.transpose(1, 2)


@pytest.mark.xfail(strict=True, reason="lazy rescaling's l sums E, not P (docs/numerics.md, Peaked rows)")
def test_peaked_rows_err_no_more_than_flash_attention_2(kernel):
    dtype = torch.bfloat16
    ours, theirs = [], []
    for seed in SEEDS:
        q, k, v, dout = peaked_inputs(seed, dtype)
        q64 = q.double().requires_grad_()
        expected = attention_ref(q64, k.double(), v.double(), causal=True)
        (expected_dq,) = torch.autograd.grad(expected, q64, dout.double())
        expected = expected.detach()

        def flashcute_attention(q, k, v):
            return flashcute.flash_attn_func(q, k, v, causal=True, kernel=kernel)

        ours.append(errors(flashcute_attention, q, k, v, dout, expected, expected_dq))
        theirs.append(errors(sdpa_flash, q, k, v, dout, expected, expected_dq))
    out_ratio = sum(e[0] for e in ours) / sum(e[0] for e in theirs)
    dq_ratio = sum(e[1] for e in ours) / sum(e[1] for e in theirs)
    print(f"{kernel} {dtype}: out max error {out_ratio:.3f}x, dq relative L2 {dq_ratio:.3f}x SDPA flash's")
    assert out_ratio <= 1.2, (ours, theirs)
    assert dq_ratio <= 1.1, (ours, theirs)
