"""Packed variable-length batches (flash_attn_varlen_func) on the GPU, forward and backward, every kernel family:
each sequence against the float64 spec run on that sequence alone (design.md's error budget), rows outside every
sequence checked for what they must hold."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flashcute
from flashcute.reference import attention_ref, attention_varlen_ref
from tests.helpers import check_against_spec, max_error_limit
from tests.test_bwd import check_against_spec_grads, lse_loss_grads, same_precision_lse

pytestmark = pytest.mark.gpu

# lengths at and around the tile edges of both families (64, 80, 96, 128, 176, 192 rows)
EDGES = (1, 63, 64, 65, 79, 80, 81, 127, 128, 129, 159, 160, 161, 191, 192, 193, 239, 240, 241, 255, 256, 257)


def lengths(max_len: int):
    return st.one_of(st.integers(0, max_len), st.sampled_from(EDGES), st.just(0))


def starts(lens: list[int]) -> list[int]:
    return [0, *itertools.accumulate(lens)]


def cu_seqlens(lens: list[int]) -> torch.Tensor:
    return torch.tensor(starts(lens), dtype=torch.int32, device="cuda")


def packed(total: int, heads: int, head_dim: int, dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(total, heads, head_dim, device="cuda", dtype=dtype, generator=generator)


def check_sequences(out, lse, q, k, v, lens_q, lens_k, used_q=None, used_k=None, **options):
    """Every sequence's rows against the spec on that sequence; rows no sequence counts are O = 0, LSE = -inf; a
    sequence without keys has O = 0 and LSE = -inf, or its heads' learnable sinks."""
    cu_q, cu_k = starts(lens_q), starts(lens_k)
    counted = torch.zeros(q.shape[0], dtype=torch.bool, device=q.device)
    for b in range(len(lens_q)):
        nq = lens_q[b] if used_q is None else used_q[b]
        nk = lens_k[b] if used_k is None else used_k[b]
        sq, sk = slice(cu_q[b], cu_q[b] + nq), slice(cu_k[b], cu_k[b] + nk)
        if nq == 0:
            continue
        counted[sq] = True
        if nk == 0:
            assert torch.equal(out[sq], torch.zeros_like(out[sq])), f"sequence {b} has no key: O must be 0"
            sink = options.get("learnable_sink")
            empty = torch.full((lse.shape[0], 1), -math.inf, device=lse.device) if sink is None else sink[:, None]
            assert torch.equal(lse[:, sq], empty.float().expand(-1, nq)), f"sequence {b} has no key: LSE wrong"
            continue
        check_against_spec(out[None, sq], lse[None, :, sq], q[None, sq], k[None, sk], v[None, sk], **options)
    if used_q is not None:
        assert torch.equal(out[~counted], torch.zeros_like(out[~counted])), "rows past seqused_q must be 0"
        assert (lse[:, ~counted] == -math.inf).all(), "rows past seqused_q must have LSE = -inf"


@st.composite
def batches(draw, max_len: int = 700):
    batch = draw(st.integers(1, 5))
    nheads_k = draw(st.sampled_from([1, 2]))
    options = draw(
        st.sampled_from(
            [
                {},
                {"causal": True},
                {"window_size": (37, 5)},
                {"window_size": (-1, 20)},
                {"causal": True, "window_size": (100, -1)},
            ]
        )
    )
    return {
        "lens_q": draw(st.lists(lengths(max_len), min_size=batch, max_size=batch)),
        "lens_k": draw(st.lists(lengths(max_len), min_size=batch, max_size=batch)),
        "nheads_k": nheads_k,
        "nheads": nheads_k * draw(st.sampled_from([1, 3])),
        "head_dim": draw(st.sampled_from([64, 128])),
        "dtype": draw(st.sampled_from([torch.bfloat16, torch.float16])),
        "options": options,
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def make(case):
    total_q, total_k = sum(case["lens_q"]), sum(case["lens_k"])
    q = packed(total_q, case["nheads"], case["head_dim"], case["dtype"], case["seed"])
    k = packed(total_k, case["nheads_k"], case["head_dim"], case["dtype"], case["seed"] + 1)
    v = packed(total_k, case["nheads_k"], case["head_dim"], case["dtype"], case["seed"] + 2)
    return q, k, v, cu_seqlens(case["lens_q"]), cu_seqlens(case["lens_k"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=batches())
def test_forward_against_spec_per_sequence(case, kernel):
    q, k, v, cu_q, cu_k = make(case)
    lens_q, lens_k = case["lens_q"], case["lens_k"]
    out, lse = flashcute.flash_attn_varlen_func(
        q,
        k,
        v,
        cu_q,
        cu_k,
        max(lens_q),
        max(lens_k),
        return_lse=True,
        validate=True,
        kernel=kernel,
        **case["options"],
    )
    assert out.shape == q.shape and lse.shape == (q.shape[1], q.shape[0])
    check_sequences(out, lse, q, k, v, lens_q, lens_k, **case["options"])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=batches(max_len=400), deterministic=st.booleans())
def test_backward_against_spec_per_sequence(case, deterministic, kernel):
    q, k, v, cu_q, cu_k = make(case)
    lens_q, lens_k = case["lens_q"], case["lens_k"]
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = flashcute.flash_attn_varlen_func(
        *leaves,
        cu_q,
        cu_k,
        max(lens_q),
        max(lens_k),
        deterministic=deterministic,
        kernel=kernel,
        **case["options"],
    )
    dout = torch.randn_like(out)
    out.backward(dout)
    dq, dk, dv = (t.grad for t in leaves)
    cq, ck = starts(lens_q), starts(lens_k)
    for b in range(len(lens_q)):
        sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if lens_q[b] == 0 or lens_k[b] == 0:  # nothing to attend: every gradient of the sequence is 0
            for g, s in ((dq, sq), (dk, sk), (dv, sk)):
                assert torch.equal(g[s], torch.zeros_like(g[s])), f"sequence {b}: gradients must be 0"
            continue
        ours = (dq[None, sq], dk[None, sk], dv[None, sk])
        check_against_spec_grads(ours, q[None, sq], k[None, sk], v[None, sk], dout[None, sq], **case["options"])


@pytest.mark.parametrize("head_dim", [32, 40, 96, 192, 256, 59])
def test_head_dims(head_dim, kernel):
    lens_q, lens_k = [1, 200, 0, 77], [130, 64, 5, 300]
    q = packed(sum(lens_q), 2, head_dim, torch.float16, head_dim)
    k, v = (packed(sum(lens_k), 1, head_dim, torch.float16, head_dim + i) for i in (1, 2))
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = flashcute.flash_attn_varlen_func(
        *leaves, cu_seqlens(lens_q), cu_seqlens(lens_k), 200, 300, causal=True, return_lse=True, kernel=kernel
    )
    check_sequences(out.detach(), lse, q, k, v, lens_q, lens_k, causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    cq, ck = starts(lens_q), starts(lens_k)
    b = 1  # the sequence with the most rows and keys
    sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
    ours = (leaves[0].grad[None, sq], leaves[1].grad[None, sk], leaves[2].grad[None, sk])
    check_against_spec_grads(ours, q[None, sq], k[None, sk], v[None, sk], dout[None, sq], causal=True)


@pytest.mark.parametrize("head_dims", [(192, 128), (128, 64), (96, 40), (111, 37)], ids=str)
def test_v_with_a_head_dim_of_its_own(head_dims, kernel):
    """v's head dim apart from q's in a packed batch (an empty sequence, seqused_q): out with v's head dim, and the
    gradients of a sequence's counted rows."""
    head_dim, head_dim_v = head_dims
    lens_q, lens_k, used_q = [1, 200, 0, 77], [130, 64, 5, 300], [1, 150, 0, 77]
    q = packed(sum(lens_q), 4, head_dim, torch.bfloat16, head_dim)
    k, v = packed(sum(lens_k), 2, head_dim, torch.bfloat16, 1), packed(sum(lens_k), 2, head_dim_v, torch.bfloat16, 2)
    seqused_q = torch.tensor(used_q, dtype=torch.int32, device="cuda")
    sequences = (cu_seqlens(lens_q), cu_seqlens(lens_k), 200, 300)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    options = {"causal": True, "seqused_q": seqused_q, "return_lse": True, "kernel": kernel}
    out, lse = flashcute.flash_attn_varlen_func(*leaves, *sequences, **options)
    assert out.shape == (sum(lens_q), 4, head_dim_v)
    check_sequences(out.detach(), lse, q, k, v, lens_q, lens_k, used_q=used_q, causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    cq, ck = starts(lens_q), starts(lens_k)
    sq, sk = slice(cq[1], cq[1] + used_q[1]), slice(ck[1], ck[2])  # sequence 1's counted rows and its keys
    ours = (leaves[0].grad[None, sq], leaves[1].grad[None, sk], leaves[2].grad[None, sk])
    check_against_spec_grads(ours, q[None, sq], k[None, sk], v[None, sk], dout[None, sq], causal=True)


def test_a_loss_of_the_lse_differentiates_it(kernel):
    """A loss of out and the packed LSE (nheads, total_q): a sequence's gradients against float64 autograd through
    the spec on that sequence alone, within the budget of a same-precision baseline's error."""
    lens_q, lens_k = [1, 200, 0, 77], [130, 64, 5, 300]
    q = packed(sum(lens_q), 4, 64, torch.bfloat16, 1)
    k, v = (packed(sum(lens_k), 2, 64, torch.bfloat16, seed) for seed in (2, 3))
    g, w = torch.randn_like(q), torch.randn(4, sum(lens_q), device="cuda")
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    sequences = (cu_seqlens(lens_q), cu_seqlens(lens_k), 200, 300)
    out, lse = flashcute.flash_attn_varlen_func(*leaves, *sequences, causal=True, return_lse=True, kernel=kernel)
    ((out.double() * g.double()).sum() + (lse.double() * w.double()).sum()).backward()
    cq, ck = starts(lens_q), starts(lens_k)
    for b in (1, 3):
        sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        one = (q[None, sq], k[None, sk], v[None, sk], g[None, sq], w[None, :, sq])
        spec = lse_loss_grads(lambda *t: attention_ref(*t, causal=True, return_lse=True), *(t.double() for t in one))
        base = lse_loss_grads(lambda *t: same_precision_lse(*t, causal=True), *one)
        ours = (leaves[0].grad[sq], leaves[1].grad[sk], leaves[2].grad[sk])
        for name, ours_g, base_g, spec_g in zip(("dq", "dk", "dv"), ours, base, spec, strict=True):
            err = (ours_g.double() - spec_g[0]).abs().max().item()
            base_err = (base_g[0].double() - spec_g[0]).abs().max().item()
            limit = max_error_limit(base_err, spec_g[0], ours_g.dtype, 1e-3)
            assert err <= limit, f"sequence {b} {name}: {err:.3g} > {limit:.3g} (2 x baseline {base_err:.3g}, ...)"


def test_seqused_limits_each_sequence(kernel):
    lens_q, lens_k, used_q, used_k = [70, 0, 130, 200], [90, 40, 129, 0], [64, 0, 1, 150], [90, 7, 128, 0]
    q = packed(sum(lens_q), 4, 128, torch.bfloat16, 1)
    k, v = (packed(sum(lens_k), 2, 128, torch.bfloat16, seed) for seed in (2, 3))
    seqused_q, seqused_k = (torch.tensor(u, dtype=torch.int32, device="cuda") for u in (used_q, used_k))
    for options in ({}, {"causal": True}):
        out, lse = flashcute.flash_attn_varlen_func(
            q,
            k,
            v,
            cu_seqlens(lens_q),
            cu_seqlens(lens_k),
            200,
            129,
            return_lse=True,
            seqused_q=seqused_q,
            seqused_k=seqused_k,
            validate=True,
            kernel=kernel,
            **options,
        )
        check_sequences(out, lse, q, k, v, lens_q, lens_k, used_q, used_k, **options)


@pytest.mark.parametrize("deterministic", [False, True])
def test_keys_no_sequence_counts_may_hold_nan(kernel, deterministic, monkeypatch):
    """K and V rows past a sequence's seqused_k, and past cu_seqlens_k[-1], are not the call's: NaN there (a cache's
    unfilled slots, a buffer's padding) reaches no output and no gradient, though a tile's loads run over them; their
    gradient is 0 in tensors that the backward allocated holding NaN (every floating-point torch.empty_like), as is
    that of the query rows past cu_seqlens_q[-1]."""
    empty_like = torch.empty_like

    def poisoned(*args, **kwargs):
        t = empty_like(*args, **kwargs)
        return t.fill_(math.nan) if t.is_floating_point() else t

    lens_q, lens_k, used_k = [70, 130, 64], [90, 200, 77], [33, 129, 77]
    q = packed(sum(lens_q) + 30, 4, 128, torch.bfloat16, 1)  # 30 rows past every sequence
    k, v = (packed(sum(lens_k) + 50, 2, 128, torch.bfloat16, seed) for seed in (2, 3))  # 50 rows past every one
    counted = torch.zeros(k.shape[0], dtype=torch.bool, device="cuda")
    for start, n in zip(starts(lens_k), used_k, strict=False):
        counted[start : start + n] = True
    k[~counted], v[~counted] = math.nan, math.nan
    seqused_k = torch.tensor(used_k, dtype=torch.int32, device="cuda")
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    for options in ({}, {"causal": True}):
        out, lse = flashcute.flash_attn_varlen_func(
            *leaves, cu_seqlens(lens_q), cu_seqlens(lens_k), 130, 200, return_lse=True, seqused_k=seqused_k,
            deterministic=deterministic, kernel=kernel, **options,
        )  # fmt: skip
        check_sequences(out.detach(), lse, q, k, v, lens_q, lens_k, used_k=used_k, **options)
        dout = torch.randn_like(out)
        for leaf in leaves:
            leaf.grad = None
        with monkeypatch.context() as patch:
            patch.setattr(torch, "empty_like", poisoned)
            out.backward(dout)
        dq, dk, dv = (t.grad for t in leaves)
        assert torch.equal(dk[~counted], torch.zeros_like(dk[~counted])) and torch.equal(dv[~counted], dk[~counted])
        assert torch.equal(dq[sum(lens_q) :], torch.zeros_like(dq[sum(lens_q) :]))
        cq, ck = starts(lens_q), starts(lens_k)
        for b in range(len(lens_q)):
            sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b] + used_k[b])
            ours = (dq[None, sq], dk[None, sk], dv[None, sk])
            check_against_spec_grads(ours, q[None, sq], k[None, sk], v[None, sk], dout[None, sq], **options)


def test_every_sequence_empty_and_max_seqlen_past_every_length(kernel):
    q = packed(0, 2, 64, torch.float16, 4)
    k = v = packed(0, 2, 64, torch.float16, 5)
    zeros = torch.zeros(4, dtype=torch.int32, device="cuda")
    out, lse = flashcute.flash_attn_varlen_func(q, k, v, zeros, zeros, 0, 0, return_lse=True, kernel=kernel)
    assert out.shape == (0, 2, 64) and lse.shape == (2, 0)
    lens = [5, 300, 0, 17]
    q, k, v = (packed(sum(lens), 2, 64, torch.float16, seed) for seed in (6, 7, 8))
    out, lse = flashcute.flash_attn_varlen_func(
        q, k, v, cu_seqlens(lens), cu_seqlens(lens), 4096, 5000, causal=True, return_lse=True, kernel=kernel
    )
    check_sequences(out, lse, q, k, v, lens, lens, causal=True)


def test_max_seqlens_left_out_are_the_totals(kernel):
    """flash-attn-4's call without max_seqlen: the launch covers the total rows as if one sequence held them all,
    and each sequence's rows come out as the spec's."""
    lens_q, lens_k = [5, 300, 0, 17], [40, 290, 3, 0]
    q = packed(sum(lens_q), 4, 128, torch.bfloat16, 12)
    k, v = (packed(sum(lens_k), 2, 128, torch.bfloat16, seed) for seed in (13, 14))
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    out, lse = flashcute.flash_attn_varlen_func(q, k, v, cu_q, cu_k, causal=True, return_lse=True, kernel=kernel)
    check_sequences(out, lse, q, k, v, lens_q, lens_k, causal=True)


def test_rows_of_other_sequences_are_never_written(kernel):
    """Out is sliced from a larger buffer poisoned with NaN: the kernel writes exactly its sequences' rows."""
    lens = [33, 190, 1, 64]
    total = sum(lens)
    q, k, v = (packed(total, 2, 128, torch.bfloat16, seed) for seed in (9, 10, 11))
    cu = cu_seqlens(lens)
    used = torch.tensor([30, 190, 0, 64], dtype=torch.int32, device="cuda")
    ref = attention_varlen_ref(q, k, v, cu, cu, used, None, causal=True)
    out = flashcute.flash_attn_varlen_func(q, k, v, cu, cu, 190, 190, causal=True, seqused_q=used, kernel=kernel)
    assert not out.isnan().any()
    assert (out.double() - ref).abs().max().item() < 2e-2


def test_matches_dense_kernel_on_equal_lengths(kernel):
    batch, seqlen = 3, 333
    q, k, v = (torch.randn(batch, seqlen, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
    dense = flashcute.flash_attn_func(q, k, v, causal=True, kernel=kernel)
    cu = torch.arange(0, batch * seqlen + 1, seqlen, dtype=torch.int32, device="cuda")
    flat = [t.reshape(batch * seqlen, 4, 128) for t in (q, k, v)]
    out = flashcute.flash_attn_varlen_func(*flat, cu, cu, seqlen, seqlen, causal=True, kernel=kernel)
    assert torch.equal(out.reshape(dense.shape), dense), "one sequence per batch entry: the same arithmetic"


def test_cuda_graph_replays_with_new_lengths(kernel):
    lens = [100, 28, 0, 128]
    q, k, v = (packed(sum(lens), 2, 64, torch.bfloat16, seed) for seed in (12, 13, 14))
    cu = cu_seqlens(lens)
    flashcute.flash_attn_varlen_func(q, k, v, cu, cu, 128, 128, causal=True, kernel=kernel)  # compile first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flashcute.flash_attn_varlen_func(q, k, v, cu, cu, 128, 128, causal=True, kernel=kernel)
    new_lens = [1, 127, 100, 28]
    cu.copy_(cu_seqlens(new_lens))
    graph.replay()
    torch.cuda.synchronize()
    ref_out, ref_lse = flashcute.flash_attn_varlen_func(
        q, k, v, cu, cu, 128, 128, causal=True, return_lse=True, kernel=kernel
    )
    assert torch.equal(out, ref_out)
    check_sequences(ref_out, ref_lse, q, k, v, new_lens, new_lens, causal=True)


def test_torch_compile_fullgraph_dynamic_totals():
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")

    @torch.compile(fullgraph=True, dynamic=True, backend=counter)
    def attend(q, k, v, cu, max_len):
        return flashcute.flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=True)

    for lens in ([30, 70], [200, 3, 9], [64, 64, 64, 1]):
        q, k, v = (packed(sum(lens), 2, 64, torch.bfloat16, seed).requires_grad_() for seed in (15, 16, 17))
        out = attend(q, k, v, cu_seqlens(lens), max(lens))
        out.sum().backward()
        ref = attention_varlen_ref(q.detach(), k.detach(), v.detach(), cu_seqlens(lens), cu_seqlens(lens), causal=True)
        assert (out.double() - ref).abs().max().item() < 3e-2
        assert q.grad is not None and not q.grad.isnan().any()
    assert counter.frame_count == 1, f"compiled {counter.frame_count} times: the totals must stay dynamic"


def test_validate_names_the_bad_argument():
    q = packed(10, 2, 64, torch.bfloat16, 18)
    cu = torch.tensor([0, 6, 4], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="cu_seqlens_q must not decrease"):
        flashcute.flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, validate=True)
    cu = torch.tensor([0, 6, 9], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[-1\] \(9\) must equal"):
        flashcute.flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, validate=True)
    cu = torch.tensor([0, 6, 10], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"max_seqlen_q \(5\) is smaller than sequence 0's length 6"):
        flashcute.flash_attn_varlen_func(q, q, q, cu, cu, 5, 6, validate=True)
    with pytest.raises(ValueError, match="cu_seqlens_k must be on q's device"):
        flashcute.flash_attn_varlen_func(q, q, q, cu, cu.cpu(), 6, 6)
