"""Learnable sinks on the GPU (one logit per query head in every row's softmax denominator, flash-attn-4's
convention, gpt-oss): the forward into NaN-poisoned outputs and its LSE against the float64 spec, the gradients of
q, k, v and the sinks against float64 autograd through the spec (design.md's error budget), on every kernel family,
through flash_attn_func, flash_attn_varlen_func, the split-KV path and flash_attn_with_kvcache."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

import flashcute
from flashcute.reference import attention_kvcache_ref, attention_ref, attention_same_precision
from tests.helpers import check_against_spec, check_forward
from tests.test_varlen import check_sequences, cu_seqlens, packed, starts

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]
MASKS = [{}, {"causal": True}, {"window_size": (40, 9)}, {"causal": True, "causal_align": "top_left"}]
# sinks: typical learned values, one far above every score (rows then weigh almost nothing), and one head without
# a sink at all (-inf), beside ordinary ones
SINKS = {
    "normal": lambda h: torch.randn(h) * 2,
    "high": lambda h: torch.full((h,), 30.0),
    "mixed": lambda h: torch.tensor([-math.inf, 0.5, -3.0, 8.0] * h)[:h],
}


def inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, sinks="normal"):
    q = torch.randn(batch, seqlen_q, nheads, head_dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, seqlen_k, nheads_k, head_dim, device="cuda", dtype=dtype) for _ in "kv")
    return q, k, v, SINKS[sinks](nheads).to("cuda")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sinks", list(SINKS))
@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(1, 1), (113, 203), (700, 700), (300, 70)], ids=str)
def test_forward(dtype, sinks, mask, seqlen_q, seqlen_k, kernel):
    """(300, 70) under a bottom-right causal mask: the first 230 rows see no key, O = 0 and LSE = the sink."""
    q, k, v, sink = inputs(2, seqlen_q, seqlen_k, 4, 2, 128, dtype, sinks)
    check_forward(q, k, v, kernel, learnable_sink=sink, **mask)


@pytest.mark.parametrize("head_dim", [32, 64, 96, 192, 256, 72])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_head_dims(head_dim, causal, kernel):
    q, k, v, sink = inputs(1, 300, 300, 4, 2, head_dim, torch.bfloat16)
    check_forward(q, k, v, kernel, learnable_sink=sink, causal=causal)


def test_forward_with_softcap(kernel):
    q, k, v, sink = inputs(2, 200, 333, 4, 1, 64, torch.float16)
    check_forward(q * 2, k, v, kernel, learnable_sink=sink, softcap=3.0, causal=True)


def grads(fn, q, k, v, sink, dout):
    q, k, v, sink = (t.detach().clone().requires_grad_() for t in (q, k, v, sink))
    fn(q, k, v, sink).backward(dout)
    return q.grad, k.grad, v.grad, sink.grad


def dsink_rounding(q, k, v, sink, dout, **options) -> torch.Tensor:
    """How far the sinks' gradient (nheads,) moves when each entry of O moves by one unit roundoff of the inputs'
    dtype, the entries' moves taken in quadrature, float64: the gradient is -sum over a head's rows of p D, p =
    exp(sink - LSE) and D = rowsum(dO * O) of the 16-bit O (flash-attn-4's convention), so a kernel whose O rounds
    to a neighbour of the exact one's rounding moves it by about this much, either way."""
    wide = [t.double() for t in (q, k, v, sink, dout)]
    out, lse = attention_ref(*wide[:3], learnable_sink=wide[3], return_lse=True, **options)
    p = torch.exp(wide[3][:, None] - lse).nan_to_num_(nan=0.0, posinf=0.0)
    spread = (p**2 * (wide[4] * out).square().sum(-1).transpose(1, 2)).sum(dim=(0, 2)).sqrt()
    return torch.finfo(q.dtype).eps * spread


def check_grads(q, k, v, sink, kernel=None, deterministic=False, atol=1e-4, **options):
    """dQ, dK, dV and the sinks' gradient within 2x the same-precision baseline's error + atol of float64. The sinks'
    gradient sums p D over every row of a head, with D = rowsum(dO * O) of the 16-bit O (as flash-attn-4 takes it):
    the rounding of O enters every row's D, and with a random dO the baseline's error and the kernel's are two draws
    of that rounding, either of which can be several times the other, so its budget adds four times the move of
    O's rounding (dsink_rounding; a float64 emulation of such kernels over 40 seeds used at most a quarter of it,
    while zeroing D on each sequence's last 5 rows or scaling p by 1.01 in fp16 mostly exceeded it), and atol
    grows by the dtype's unit roundoff (2^-9 bf16, 2^-12 fp16) times its largest entry."""
    dout = torch.randn_like(q)
    run = {"kernel": kernel, "deterministic": deterministic, **options}
    ours = grads(lambda *t: flashcute.flash_attn_func(*t[:3], learnable_sink=t[3], **run), q, k, v, sink, dout)
    base = grads(lambda *t: attention_same_precision(*t[:3], learnable_sink=t[3], **options), q, k, v, sink, dout)
    wide = (t.double() for t in (q, k, v, sink, dout))
    spec = grads(lambda *t: attention_ref(*t[:3], learnable_sink=t[3], **options), *wide)
    for name, g, b, r in zip(("dq", "dk", "dv", "dsink"), ours, base, spec, strict=True):
        assert g.shape == r.shape and not g.isnan().any(), name
        norm = r.norm().item() or 1.0
        rounding = rounding_rel = 0.0
        if name == "dsink":
            atol += torch.finfo(q.dtype).eps / 2 * r.abs().max().item()
            moves = dsink_rounding(q, k, v, sink, dout, **options)
            rounding, rounding_rel = 4 * moves.max().item(), 4 * moves.norm().item() / norm
        err, base_err = ((x.double() - r).abs().max().item() for x in (g, b))
        limit = 2 * base_err + atol + rounding
        assert err <= limit, f"{name}: max abs error {err:.3g} > 2 x baseline {base_err:.3g} + {atol + rounding:.3g}"
        rel, base_rel = ((x.double() - r).norm().item() / norm for x in (g, b))
        limit = 2 * base_rel + atol + rounding_rel
        assert rel <= limit, f"{name}: relative L2 {rel:.3g} > 2 x baseline {base_rel:.3g} + {atol + rounding_rel:.3g}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_backward(dtype, mask, head_dim, kernel):
    check_grads(*inputs(2, 203, 177, 4, 2, head_dim, dtype, "mixed"), kernel=kernel, **mask)


@pytest.mark.parametrize("head_dim", [32, 96, 192, 256])
def test_backward_head_dims(head_dim, kernel):
    check_grads(*inputs(1, 150, 260, 2, 1, head_dim, torch.bfloat16), kernel=kernel, causal=True)


@pytest.mark.parametrize("mask", MASKS[:3], ids=str)
def test_deterministic_backward(mask):
    check_grads(*inputs(2, 190, 190, 2, 2, 128, torch.float16), deterministic=True, **mask)


def test_rows_without_keys_give_the_sink_no_gradient(kernel):
    """Bottom-right causal with seqlen_q > seqlen_k: rows that see no key have O = 0 whatever the sink, so they
    add nothing to its gradient (their p_sink = 1, D = 0)."""
    check_grads(*inputs(1, 300, 70, 2, 2, 64, torch.bfloat16), kernel=kernel, causal=True)


def test_sink_gradient_keeps_its_dtype(kernel):
    q, k, v, sink = inputs(1, 64, 64, 2, 2, 64, torch.bfloat16)
    sink = sink.to(torch.bfloat16).requires_grad_()
    flashcute.flash_attn_func(q, k, v, learnable_sink=sink, kernel=kernel).float().sum().backward()
    assert sink.grad.dtype == torch.bfloat16 and sink.grad.shape == (2,)


@pytest.mark.parametrize("deterministic", [False, True])
def test_a_loss_of_the_lse_reaches_the_sinks(deterministic, kernel):
    """A loss of out and the returned LSE: the sinks' gradient is sum p (dLSE - D), against float64 autograd through
    the spec within check_grads' budget for it; a loss of the LSE alone (D = 0): sum p dLSE, within float32's
    roundoff of the LSE (the rows' sum of |p dLSE| times 2^-16)."""
    q, k, v, sink = inputs(2, 150, 200, 4, 2, 64, torch.bfloat16)
    dout, weight = torch.randn_like(q), torch.randn(2, 4, 150, device="cuda")
    options = {"causal": True}
    run = {"kernel": kernel, "deterministic": deterministic, "return_lse": True, **options}

    def sink_grad(fn, q, k, v, sink, dout, weight):
        sink = sink.detach().clone().requires_grad_()
        out, lse = fn(q, k, v, learnable_sink=sink)
        ((out * dout).sum() + (lse * weight).sum()).backward()
        return sink.grad

    for out_weight in (dout, torch.zeros_like(dout)):
        ours = sink_grad(partial(flashcute.flash_attn_func, **run), q, k, v, sink, out_weight, weight)
        wide = (t.double() for t in (q, k, v, sink, out_weight, weight))
        spec = sink_grad(partial(attention_ref, return_lse=True, **options), *wide)
        err = (ours.double() - spec).abs().max().item()
        if out_weight.any():
            limit = 4 * dsink_rounding(q, k, v, sink, out_weight, **options).max().item()
            limit += torch.finfo(q.dtype).eps / 2 * spec.abs().max().item() + 1e-4
        else:
            wide = (t.double() for t in (q, k, v))
            _, lse = attention_ref(*wide, learnable_sink=sink.double(), return_lse=True, **options)
            p = torch.exp(sink.double()[:, None] - lse)
            limit = 2.0**-16 * (p * weight.double()).abs().sum(dim=(0, 2)).max().item() + 1e-6
        assert err <= limit, f"dsink off by {err:.3g} > {limit:.3g} (out weighed: {bool(out_weight.any())})"


def test_a_call_without_sinks_is_unchanged(kernel):
    q, k, v, sink = inputs(1, 257, 257, 2, 2, 128, torch.bfloat16)
    plain = flashcute.flash_attn_func(q, k, v, causal=True, kernel=kernel)
    assert torch.equal(flashcute.flash_attn_func(q, k, v, causal=True, learnable_sink=None, kernel=kernel), plain)
    assert not torch.equal(flashcute.flash_attn_func(q, k, v, causal=True, learnable_sink=sink, kernel=kernel), plain)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_forward_and_backward(causal, kernel):
    lens_q, lens_k = [5, 0, 130, 300, 4], [7, 3, 130, 90, 0]
    q, k, v = (
        packed(sum(n), h, 64, torch.bfloat16, seed) for n, h, seed in ((lens_q, 4, 1), (lens_k, 2, 2), (lens_k, 2, 3))
    )
    sink = SINKS["mixed"](4).to("cuda")
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sink)]
    out, lse = flashcute.flash_attn_varlen_func(
        *leaves[:3], cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, return_lse=True, kernel=kernel,
        learnable_sink=leaves[3],
    )  # fmt: skip
    check_sequences(out.detach(), lse, q, k, v, lens_q, lens_k, causal=causal, learnable_sink=sink)
    dout = torch.randn_like(out)
    out.backward(dout)
    # the sinks' gradient sums over every sequence: against float64 autograd through the spec, sequence by sequence,
    # within check_grads' budget: 2x the same-precision baseline's error, the dtype's roundoff of its largest entry,
    # and four times the move of O's rounding, the sequences' moves taken in quadrature
    expected, base = (torch.zeros(4, dtype=torch.float64, device="cuda") for _ in "eb")
    moves_squared = torch.zeros_like(expected)
    sq, sk = starts(lens_q), starts(lens_k)
    for b in range(len(lens_q)):
        if lens_q[b] == 0 or lens_k[b] == 0:  # no key: O = 0, so D = 0 and the sequence adds nothing
            continue
        rows_q, rows_k = slice(sq[b], sq[b] + lens_q[b]), slice(sk[b], sk[b] + lens_k[b])
        seq = [t[None, rows].detach() for t, rows in ((q, rows_q), (k, rows_k), (v, rows_k))]
        seq_dout = dout[None, rows_q]
        for attend, wide, total in ((attention_ref, True, expected), (attention_same_precision, False, base)):
            leaf = (sink.double() if wide else sink.clone()).requires_grad_()
            args = [t.double() for t in (*seq, seq_dout)] if wide else [*seq, seq_dout]
            attend(*args[:3], causal=causal, learnable_sink=leaf).backward(args[3])
            total += leaf.grad.double()
        moves_squared += dsink_rounding(*seq, sink, seq_dout, causal=causal) ** 2
    err, base_err = ((x.double() - expected).abs().max().item() for x in (leaves[3].grad, base))
    budget = 1e-4 + torch.finfo(q.dtype).eps / 2 * expected.abs().max().item() + 4 * moves_squared.sqrt().max().item()
    assert err <= 2 * base_err + budget, f"dsink: max abs error {err:.3g} > 2 x baseline {base_err:.3g} + {budget:.3g}"


@pytest.mark.parametrize("group", [1, 4])
def test_split_kv_decoding_with_sinks(group, kernel):
    """One query row against a long cache takes the split-KV path: the combine adds each row's head's sink."""
    q, k, v, sink = inputs(2, 1, 5000, 2 * group, 2, 128, torch.bfloat16, "mixed")
    out, lse = flashcute.flash_attn_func(q, k, v, causal=True, learnable_sink=sink, return_lse=True, kernel=kernel)
    check_against_spec(out, lse, q, k, v, causal=True, learnable_sink=sink)


@pytest.mark.parametrize("seqlen_q", [1, 3])
def test_kvcache_with_sinks(seqlen_q, kernel):
    """Through the cache entry: the split path (one row) and the packed launch (several rows under a mask); a
    sequence whose cache is empty gets O = 0 and LSE = the sink."""
    q, k_cache, v_cache, sink = inputs(3, seqlen_q, 2000, 8, 2, 64, torch.float16, "normal")
    lengths = torch.tensor([1500, 0, 2000], dtype=torch.int32, device="cuda")
    options = {"cache_seqlens": lengths, "causal": True, "learnable_sink": sink}
    out, lse = flashcute.flash_attn_with_kvcache(q, k_cache, v_cache, return_lse=True, kernel=kernel, **options)
    ref, ref_lse, _, _ = attention_kvcache_ref(q, k_cache, v_cache, **options)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.equal(lse[1], sink[:, None].expand(-1, seqlen_q))
    torch.testing.assert_close(out.double(), ref, atol=2e-3, rtol=0)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-4, rtol=1e-4)
