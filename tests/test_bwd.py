"""Backward pass on the GPU: dQ, dK, dV against float64 autograd through the spec (design.md's error budget).

The tests with a ``kernel`` argument run once per kernel: "sm80" (mma.sync) and "sm90" (the Hopper backward, on
sm_90 only; keys as rows up to head dim 128, queries as rows above)."""

from __future__ import annotations

from functools import partial

import pytest
import torch

import flashcute
from flashcute.reference import attention_ref, attention_same_precision
from tests.helpers import check_against_spec, max_error_limit, random_gpu_cases

pytestmark = pytest.mark.gpu


def randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


def grads(fn, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    fn(q, k, v).backward(dout)
    return q.grad, k.grad, v.grad


def check_grads(q, k, v, atol=1e-4, deterministic=False, kernel=None, **options):
    """flashcute's dQ, dK, dV must be within 2x the same-precision PyTorch baseline's error + atol of float64."""
    dout = torch.randn((*q.shape[:-1], v.shape[-1]), device=q.device, dtype=q.dtype)  # out's shape
    run = {"deterministic": deterministic, "kernel": kernel}
    ours = grads(lambda *t: flashcute.flash_attn_func(*t, **run, **options), q, k, v, dout)
    check_against_spec_grads(ours, q, k, v, dout, atol, **options)


def check_against_spec_grads(ours, q, k, v, dout, atol=1e-4, **options):
    """Gradients ``ours`` (dq, dk, dv) of attention(q, k, v) for dout, against float64 autograd through the spec."""
    base = grads(lambda *t: attention_same_precision(*t, **options), q, k, v, dout)
    spec = grads(lambda *t: attention_ref(*t, **options), *(t.double() for t in (q, k, v)), dout.double())
    for name, g, b, r in zip(("dq", "dk", "dv"), ours, base, spec, strict=True):
        assert g.shape == r.shape and g.dtype == q.dtype, name
        assert not g.isnan().any(), f"{name}: NaN"
        err = (g.double() - r).abs().max().item()
        base_err = (b.double() - r).abs().max().item()
        limit = max_error_limit(base_err, r, g.dtype, atol)
        assert err <= limit, f"{name}: max abs error {err:.3g} > {limit:.3g} (2 x baseline {base_err:.3g} + rounding)"
        norm = r.norm().item() or 1.0
        rel, base_rel = (g.double() - r).norm().item() / norm, (b.double() - r).norm().item() / norm
        assert rel <= 2 * base_rel + atol, f"{name}: relative L2 {rel:.3g} > 2 x baseline {base_rel:.3g} + {atol}"


MASKS = [
    {},
    {"causal": True},
    {"causal": True, "causal_align": "top_left"},
    {"window_size": (40, 9)},
    {"window_size": (50, -1), "causal_align": "top_left"},
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("seqlens", [(1, 1), (113, 203), (239, 239), (300, 70), (1023, 1024)], ids=str)
@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
def test_seqlens_and_masks(dtype, seqlens, mask, head_dim, kernel):
    seqlen_q, seqlen_k = seqlens
    q = randn(2, seqlen_q, 3, head_dim, dtype=dtype)
    k, v = (randn(2, seqlen_k, 3, head_dim, dtype=dtype) for _ in "kv")
    check_grads(q, k, v, kernel=kernel, **mask)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 192, 256, 40, 200, 59, 111])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims(dtype, head_dim, causal, kernel):
    q = randn(1, 257, 2, head_dim, dtype=dtype)
    k, v = (randn(1, 190, 2, head_dim, dtype=dtype) for _ in "kv")
    check_grads(q, k, v, kernel=kernel, causal=causal)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("mask", MASKS[:4], ids=str)
@pytest.mark.parametrize("head_dims", [(192, 128), (128, 64), (96, 40), (72, 64), (59, 37)], ids=str)
def test_v_with_a_head_dim_of_its_own(head_dims, mask, deterministic):
    """dQ, dK and dV with v's head dim apart from q's (dV and dO at v's), GQA, partial tiles, the dtypes in turn."""
    head_dim, head_dim_v = head_dims
    dtype = (torch.bfloat16, torch.float16)[(head_dim + MASKS.index(mask)) % 2]
    q, k = randn(2, 137, 4, head_dim, dtype=dtype), randn(2, 201, 2, head_dim, dtype=dtype)
    check_grads(q, k, randn(2, 201, 2, head_dim_v, dtype=dtype), deterministic=deterministic, **mask)


@pytest.mark.parametrize("nheads_k", [1, 2])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_gqa_sums_dk_dv_over_the_group(nheads_k, head_dim, kernel):
    q = randn(2, 200, 8, head_dim)
    k, v = (randn(2, 333, nheads_k, head_dim) for _ in "kv")
    check_grads(q, k, v, kernel=kernel, causal=True)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_packed_qkv_views(head_dim, kernel):
    qkv = randn(2, 177, 3, 4, head_dim)
    check_grads(*qkv.unbind(dim=2), kernel=kernel, causal=True)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_heads_major_views(head_dim, kernel):
    """(batch, nheads, seqlen, head_dim) leaves viewed as (batch, seqlen, nheads, head_dim), SDPA's layout; dO
    (randn_like) is laid out the same way."""
    q = randn(2, 4, 161, head_dim).transpose(1, 2)
    k, v = (randn(2, 2, 203, head_dim).transpose(1, 2) for _ in "kv")
    check_grads(q, k, v, kernel=kernel, causal=True)


def test_broadcast_kv_and_dout(kernel):
    """K and V expanded over the batch (stride 0) inside the graph, and a broadcast dO: gradients flow back
    through the expand (summed over the batch) as through any other op."""
    q = randn(3, 190, 4, 128)
    k, v = (randn(1, 230, 2, 128) for _ in "kv")
    dout = torch.randn(1, 190, 4, 128, device="cuda", dtype=q.dtype).expand(3, 190, 4, 128)

    def expanded(attention):
        return lambda q, k, v: attention(q, k.expand(3, -1, -1, -1), v.expand(3, -1, -1, -1), causal=True)

    ours = grads(expanded(lambda *t, **o: flashcute.flash_attn_func(*t, kernel=kernel, **o)), q, k, v, dout)
    base = grads(expanded(attention_same_precision), q, k, v, dout)
    spec = grads(expanded(attention_ref), *(t.double() for t in (q, k, v)), dout.double())
    for name, g, b, r in zip(("dq", "dk", "dv"), ours, base, spec, strict=True):
        err, base_err = (g.double() - r).abs().max().item(), (b.double() - r).abs().max().item()
        limit = max_error_limit(base_err, r, g.dtype, 1e-4)
        assert err <= limit, f"{name}: max abs error {err:.3g} > {limit:.3g} (2 x baseline {base_err:.3g} + rounding)"


@pytest.mark.parametrize("mask", MASKS, ids=str)
def test_long_sequences_many_tiles(mask, kernel):
    q = randn(1, 2111, 2, 128)
    k, v = (randn(1, 1900, 2, 128) for _ in "kv")
    check_grads(q, k, v, kernel=kernel, **mask)


@pytest.mark.xdist_group("most-of-the-gpu-memory")  # one worker at a time under pytest-xdist (gpu_suite.sh)
def test_tensors_past_2_31_elements(kernel):
    """q, k, v (and dO, dQ, dK, dV) of more than 2**31 elements each: element offsets need 64 bits. Every batch
    element's attention is independent, so the output and gradients of a few of them (at the start, the middle and
    the end) are checked against the spec run on those alone."""
    if torch.cuda.get_device_properties(0).total_memory < 64 * 2**30:
        pytest.skip("needs about 50 GiB of GPU memory")
    batch = 2**31 // (128 * 128) + 8
    q, k, v = (randn(batch, 128, 1, 128).requires_grad_() for _ in "qkv")
    dout = randn(batch, 128, 1, 128)
    out = flashcute.flash_attn_func(q, k, v, causal=True, kernel=kernel)
    out.backward(dout)
    picked = torch.tensor([0, 1, batch // 2, batch - 1], device="cuda")
    few = [t.detach()[picked] for t in (q, k, v)]
    check_against_spec(out.detach()[picked], None, *few, causal=True)
    check_against_spec_grads([t.grad[picked] for t in (q, k, v)], *few, dout[picked], causal=True)


def test_rows_that_see_no_key_get_zero_gradients(kernel):
    q = randn(1, 300, 2, 128)  # top-left causal with a window: every key is seen; queries past 40 see none
    k, v = (randn(1, 40, 2, 128) for _ in "kv")
    check_grads(q, k, v, kernel=kernel, window_size=(0, 0), causal_align="top_left", causal=True)


def lse_loss_grads(attend, q, k, v, g, w):
    """dQ, dK, dV of sum(out * g) + sum(lse * w) for ``attend``(q, k, v) -> (out, lse)."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = attend(q, k, v)
    loss = (out.double() * g.double()).sum() + (lse.double() * w.double()).sum()
    return torch.autograd.grad(loss, (q, k, v))


def same_precision_lse(q, k, v, **options):
    """attention_same_precision's out, and the LSE of its scores in the inputs' dtype (a same-precision baseline of
    the LSE's gradient)."""
    group = q.shape[2] // k.shape[2]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(group, dim=2)) * q.shape[-1] ** -0.5
    if options.get("causal"):
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        hidden = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=q.device).triu(seqlen_k - seqlen_q + 1)
        scores = scores.masked_fill(hidden, -torch.inf)
    return attention_same_precision(q, k, v, **options), torch.logsumexp(scores, dim=-1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_a_loss_of_the_lse_differentiates_it(causal, deterministic, kernel):
    """The returned LSE is differentiable (flash-attn-4's convention): a loss of out and LSE, and of the LSE alone
    (dV then exactly 0), against float64 autograd through the spec, within the budget of a same-precision
    baseline's error."""
    q, k, v = randn(2, 200, 4, 128), randn(2, 333, 2, 128), randn(2, 333, 2, 128)
    g, w = torch.randn_like(q), torch.randn(2, 4, 200, device="cuda")
    options = {"causal": causal}
    ours_fn = partial(flashcute.flash_attn_func, return_lse=True, deterministic=deterministic, kernel=kernel, **options)
    spec_fn = partial(attention_ref, return_lse=True, **options)
    for weight in (g, torch.zeros_like(g)):  # out and LSE; the LSE alone
        ours = lse_loss_grads(ours_fn, q, k, v, weight, w)
        base = lse_loss_grads(partial(same_precision_lse, **options), q, k, v, weight, w)
        spec = lse_loss_grads(spec_fn, *(t.double() for t in (q, k, v)), weight.double(), w.double())
        for name, ours_g, base_g, spec_g in zip(("dq", "dk", "dv"), ours, base, spec, strict=True):
            err = (ours_g.double() - spec_g).abs().max().item()
            base_err = (base_g.double() - spec_g).abs().max().item()
            limit = max_error_limit(base_err, spec_g, ours_g.dtype, 1e-3)
            assert err <= limit, f"{name}: max abs error {err:.3g} > {limit:.3g} (2 x baseline {base_err:.3g}, ...)"
        if not weight.any():
            assert not ours[2].any(), "dV of a loss of the LSE alone is 0"


def test_an_unused_lse_changes_no_gradient(kernel):
    """return_lse=True with a loss of out alone: the backward receives no LSE gradient, bitwise the same
    gradients as without return_lse (deterministic)."""
    q, k, v = randn(1, 130, 2, 64), randn(1, 257, 2, 64), randn(1, 257, 2, 64)
    g = torch.randn_like(q)
    run = {"deterministic": True, "kernel": kernel}
    with_lse = grads(lambda *t: flashcute.flash_attn_func(*t, return_lse=True, **run)[0], q, k, v, g)
    without = grads(lambda *t: flashcute.flash_attn_func(*t, **run), q, k, v, g)
    assert all(torch.equal(a, b) for a, b in zip(with_lse, without, strict=True))


@pytest.mark.parametrize("mask", MASKS, ids=str)
@pytest.mark.parametrize("head_dim", [24, 64, 96, 128, 200])
def test_deterministic_is_bitwise_reproducible_and_right(mask, head_dim, kernel):
    q = randn(2, 333, 4, head_dim)
    k, v = (randn(2, 517, 2, head_dim) for _ in "kv")
    check_grads(q, k, v, deterministic=True, kernel=kernel, **mask)
    dout = torch.randn_like(q)
    attend = partial(flashcute.flash_attn_func, deterministic=True, kernel=kernel, **mask)
    runs = [grads(attend, q, k, v, dout) for _ in "ab"]
    for first, second in zip(*runs, strict=True):
        assert torch.equal(first, second)


@pytest.mark.parametrize("head_dim", [64, 256])
def test_deterministic_without_a_mask_over_several_spans(head_dim, kernel):
    """More K/V tiles than a rotation span (scheduler.ROTATION_SPAN: 34 of 128 keys at D=64, 68 of 64 at D=256) and
    than Q tiles, GQA: the Hopper kernel's rotated walks add in one fixed order, and every tile's adds arrive."""
    q = randn(1, 200, 4, head_dim)
    k, v = (randn(1, 4300, 2, head_dim) for _ in "kv")
    check_grads(q, k, v, deterministic=True, kernel=kernel)
    dout = torch.randn_like(q)
    attend = partial(flashcute.flash_attn_func, deterministic=True, kernel=kernel)
    runs = [grads(attend, q, k, v, dout) for _ in "ab"]
    for first, second in zip(*runs, strict=True):
        assert torch.equal(first, second)


def test_torch_compile_fullgraph_forward_and_backward():
    q = randn(2, 256, 4, 64)
    k, v = (randn(2, 256, 4, 64) for _ in "kv")
    dout = torch.randn_like(q)
    compiled = torch.compile(lambda *t: flashcute.flash_attn_func(*t, causal=True), fullgraph=True)
    eager = grads(lambda *t: flashcute.flash_attn_func(*t, causal=True), q, k, v, dout)
    traced = grads(compiled, q, k, v, dout)
    for a, b in zip(eager, traced, strict=True):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=0)  # dQ's atomics add in any order


def test_autocast_casts_float32_inputs():
    q, k, v = (torch.randn(1, 128, 2, 64, device="cuda", requires_grad=True) for _ in "qkv")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = flashcute.flash_attn_func(q, k, v, causal=True)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32 and not q.grad.isnan().any()


def test_cuda_graph_replay_of_forward_and_backward():
    q, k, v = (randn(2, 300, 4, 64).requires_grad_() for _ in "qkv")
    dout = torch.randn_like(q)
    flashcute.flash_attn_func(q, k, v, causal=True).backward(dout)  # compile outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for t in (q, k, v):
            t.grad = None
        with torch.cuda.graph(graph):
            flashcute.flash_attn_func(q, k, v, causal=True).backward(dout)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    expected = grads(lambda *t: attention_ref(*t, causal=True), q.double(), k.double(), v.double(), dout.double())
    for g, r in zip((q.grad, k.grad, v.grad), expected, strict=True):
        assert (g.double() - r).abs().max().item() < 5e-2


@pytest.mark.parametrize("case", random_gpu_cases(seed=1130, count=20, max_seqlen=1100, max_elements=2**21), ids=str)
def test_random_cases(case, kernel):
    """Seeded random calls (sizes, head dims, GQA, masks, scales, strides) beyond the grids above."""
    check_grads(*case.tensors(), kernel=kernel, **case.options)
