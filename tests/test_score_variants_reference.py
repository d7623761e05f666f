"""The references with a learnable sink (flash-attn-4) and ALiBi (flash_attn 2): attention_ref against the formulas
written out, the sink's gradient, the same-precision baseline, the tiled algorithm, packed batches and KV caches."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashcute.reference import (
    InexactError,
    attention_kvcache_ref,
    attention_ref,
    attention_same_precision,
    attention_varlen_ref,
    tiled_attention,
)
from tests.helpers import Problem, problems

FEW = settings(max_examples=30, deadline=None)
tile_sizes = st.integers(1, 9)


def assert_same(actual, expected, atol=1e-12):
    torch.testing.assert_close(actual, expected, atol=atol, rtol=1e-12, equal_nan=True)


def scores_by_hand(q, k, scale, softcap=0.0):
    """s * q . k, capped, with kv head h // group for query head h: (batch, nheads, seqlen_q, seqlen_k)."""
    group = q.shape[2] // k.shape[2]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k[:, :, [h // group for h in range(q.shape[2])]]) * scale
    return softcap * torch.tanh(scores / softcap) if softcap > 0 else scores


def causal_mask_by_hand(seqlen_q, seqlen_k, offset):
    return torch.tensor([[j <= i + offset for j in range(seqlen_k)] for i in range(seqlen_q)])


def expand_kv(v, nheads):
    return v[:, :, [h // (nheads // v.shape[2]) for h in range(nheads)]]


# ---- learnable sink -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("softcap", [0.0, 1.5])
def test_sink_is_one_more_softmax_column_without_a_value(softcap):
    """softmax over [scores, sink], the sink's column dropped; bottom-right causal with seqlen_q > seqlen_k leaves
    rows 0 and 1 without a key: their only term is the sink."""
    q, k, v = Problem(2, 5, 3, 4, 2, 3, seed=20, options={}).tensors()
    sink = torch.tensor([0.5, -1.0, 2.0, -30.0])
    scores = scores_by_hand(q, k, 0.6, softcap).masked_fill(~causal_mask_by_hand(5, 3, -2), -math.inf)
    with_sink = torch.cat([scores, sink.double()[None, :, None, None].expand(2, 4, 5, 1)], dim=-1)
    probs = torch.softmax(with_sink, dim=-1)[..., :-1]
    out, lse = attention_ref(q, k, v, 0.6, causal=True, softcap=softcap, learnable_sink=sink, return_lse=True)
    assert_same(out, torch.einsum("bhqk,bkhd->bqhd", probs, expand_kv(v, 4)))
    assert_same(lse, torch.logsumexp(with_sink, dim=-1))
    assert torch.equal(out[:, :2], torch.zeros_like(out[:, :2]))
    assert torch.equal(lse[:, :, :2], sink.double()[None, :, None].expand(2, 4, 2))


def test_row_that_sees_no_key_has_the_sink_as_lse_in_every_reference():
    q, k, v = Problem(1, 4, 2, 2, 1, 3, seed=21, options={}).tensors()
    sink = torch.tensor([1.25, -math.inf])
    out, lse = attention_ref(q, k, v, causal=True, learnable_sink=sink, return_lse=True)  # rows 0, 1: no key
    tiled = tiled_attention(q, k, v, causal=True, learnable_sink=sink, block_m=2, block_n=1)
    same = attention_same_precision(q, k, v, causal=True, learnable_sink=sink)
    for o in (out, torch.from_numpy(tiled.out), same):
        assert torch.equal(o[:, :2], torch.zeros_like(o[:, :2])) and not o.isnan().any()
    assert lse[0, 0, :2].tolist() == [1.25, 1.25] and lse[0, 1, :2].tolist() == [-math.inf, -math.inf]
    np.testing.assert_allclose(tiled.lse, lse.numpy(), rtol=1e-12, atol=1e-12)


def test_sink_gradcheck_with_q_k_v():
    """float64 autograd through the sink, q, k and v, with a row that sees no key (its LSE is the sink)."""
    q, k, v = (x.requires_grad_() for x in Problem(1, 4, 3, 2, 1, 2, seed=22, options={}).tensors())
    sink = torch.tensor([0.3, -0.7], dtype=torch.float64, requires_grad=True)
    slopes = torch.tensor([0.25, 0.5])

    def attend(q, k, v, sink):
        return attention_ref(
            q, k, v, causal=True, softcap=2.0, learnable_sink=sink, alibi_slopes=slopes, return_lse=True
        )

    assert torch.autograd.gradcheck(attend, (q, k, v, sink))


def test_sink_gradient_is_p_sink_times_dlse_less_do_dot_o():
    """d sink_h = sum over rows of P_sink (dLSE - dO . O), P_sink = exp(sink_h - LSE): LSE grows by P_sink per unit
    of sink and every P_ij, so O, shrinks by that factor."""
    q, k, v = Problem(2, 5, 6, 4, 2, 3, seed=23, options={}).tensors()
    sink = torch.tensor([0.0, 1.0, -2.0, 3.0], dtype=torch.float64, requires_grad=True)
    out, lse = attention_ref(q, k, v, window_size=(2, 1), learnable_sink=sink, return_lse=True)
    generator = torch.Generator().manual_seed(0)
    d_out = torch.randn(out.shape, generator=generator, dtype=torch.float64)
    d_lse = torch.randn(lse.shape, generator=generator, dtype=torch.float64)
    torch.autograd.backward((out, lse), (d_out, d_lse))
    p_sink = torch.exp(sink.detach()[None, :, None] - lse.detach())
    d_out_dot_out = torch.einsum("bqhd,bqhd->bhq", d_out, out.detach())
    assert_same(sink.grad, (p_sink * (d_lse - d_out_dot_out)).sum(dim=(0, 2)))


def test_sink_far_above_the_scores_moves_the_tiled_max_instead_of_overflowing():
    q, k, v = Problem(1, 3, 4, 1, 1, 2, seed=24, options={}).tensors()
    sink = torch.tensor([800.0])
    out, lse = attention_ref(q, k, v, learnable_sink=sink, return_lse=True)
    result = tiled_attention(q, k, v, learnable_sink=sink, block_m=2, block_n=2)
    assert np.isfinite(result.lse).all() and np.isfinite(result.out).all()
    np.testing.assert_allclose(result.lse, lse.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(result.out, out.numpy(), rtol=1e-12, atol=1e-12)


# ---- ALiBi --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("slopes_shape", ["heads", "batch_heads"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("causal_align", ["bottom_right", "top_left"])
@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_alibi_bias_after_softcap_before_the_mask(slopes_shape, causal, causal_align, softcap):
    """score - slope * |i + offset - j|, offset = seqlen_k - seqlen_q bottom-right or 0 top-left; GQA: the slope is
    the query head's."""
    batch, seqlen_q, seqlen_k, nheads = 2, 4, 6, 4
    q, k, v = Problem(batch, seqlen_q, seqlen_k, nheads, 2, 3, seed=25, options={}).tensors()
    slopes = torch.tensor([[0.5, 0.25, 0.125, 1.0], [0.75, 0.0, 2.0, 0.375]])
    if slopes_shape == "heads":
        slopes = slopes[0]
    offset = seqlen_k - seqlen_q if causal_align == "bottom_right" else 0
    distance = (torch.arange(seqlen_q)[:, None] + offset - torch.arange(seqlen_k)[None, :]).abs()
    bias = -slopes.double().expand(batch, nheads)[:, :, None, None] * distance  # (batch, nheads, seqlen_q, seqlen_k)
    scores = scores_by_hand(q, k, 0.5, softcap) + bias
    if causal:
        scores = scores.masked_fill(~causal_mask_by_hand(seqlen_q, seqlen_k, offset), -math.inf)
    options = {"causal": causal, "causal_align": causal_align, "softcap": softcap}
    out, lse = attention_ref(q, k, v, 0.5, **options, alibi_slopes=slopes, return_lse=True)
    assert_same(out, torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), expand_kv(v, nheads)))
    assert_same(lse, torch.logsumexp(scores, dim=-1))


def test_alibi_causal_output_matches_flash_attn_2_column_bias():
    """flash_attn 2's causal kernel adds slope * j instead, the same bias plus slope * (i + offset) on row i: O is the
    same, and its LSE is higher by slope * (i + offset) than the specification's."""
    q, k, v = Problem(1, 3, 5, 2, 2, 4, seed=26, options={}).tensors()
    slopes = torch.tensor([0.5, 0.125])
    scores = scores_by_hand(q, k, 0.5) + slopes.double()[None, :, None, None] * torch.arange(5)
    scores = scores.masked_fill(~causal_mask_by_hand(3, 5, 2), -math.inf)
    out, lse = attention_ref(q, k, v, 0.5, causal=True, alibi_slopes=slopes, return_lse=True)
    assert_same(out, torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v))
    assert_same(lse, torch.logsumexp(scores, dim=-1) - slopes.double()[None, :, None] * (torch.arange(3) + 2))


def test_alibi_is_a_step_between_softcap_and_mask_in_the_tiled_trace():
    """One CTA, one K/V tile: acc_s = tanh(s * S / c) - (slope / c) * |i + offset - j|, then -inf where masked."""
    q, k, v = Problem(1, 3, 4, 1, 1, 2, seed=27, options={}).tensors()
    slope, scale, cap = 0.75, 0.5, 2.0
    result = tiled_attention(
        q, k, v, scale, causal=True, softcap=cap, alibi_slopes=torch.tensor([slope]), block_m=4, block_n=4, trace=True
    )
    ((round0,),) = [block.rounds for block in result.trace]
    raw = (q[0, :, 0] @ k[0, :, 0].T).numpy()
    distance = np.abs(np.arange(4)[:, None] + 1 - np.arange(4)[None, :])
    expected = np.tanh(raw * scale / cap) - (slope / cap) * distance[:3]
    visible = causal_mask_by_hand(3, 4, 1).numpy()
    np.testing.assert_allclose(round0.acc_s[:3][visible], expected[visible], rtol=1e-14, atol=1e-14)
    assert (round0.acc_s[:3][~visible] == -math.inf).all()


# ---- every reference agrees -------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(problems(sinks=True, alibi=True), tile_sizes, tile_sizes, st.sampled_from([None, 0.0, 8.0]))
def test_tiled_matches_spec_with_sinks_and_alibi(problem, block_m, block_n, threshold):
    q, k, v = problem.tensors()
    result = tiled_attention(q, k, v, **problem.options, block_m=block_m, block_n=block_n, rescale_threshold=threshold)
    out, lse = attention_ref(q, k, v, **problem.options, return_lse=True)
    np.testing.assert_allclose(result.out, out.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(result.lse, lse.numpy(), rtol=1e-12, atol=1e-12)  # -inf rows must match exactly


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_same_precision_baseline_stays_in_the_input_dtype(dtype):
    q, k, v = Problem(2, 37, 53, 4, 2, 16, seed=28, options={}).tensors(dtype)
    options = {
        "causal": True,
        "learnable_sink": torch.tensor([0.5, -1.0, 2.0, 0.0]),
        "alibi_slopes": torch.tensor([[0.5, 0.25, 0.125, 0.0625], [0.0, 0.01, 0.02, 0.04]]),
    }
    out = attention_same_precision(q, k, v, **options)
    assert out.dtype == dtype and out.shape == q.shape
    err = (out.double() - attention_ref(q, k, v, **options)).abs().max().item()
    assert 0 < err < 0.05


@pytest.mark.parametrize("variant", ["learnable_sink", "alibi_slopes"])
def test_exact_mode_refuses_the_variants(variant):
    q = np.ones((1, 2, 1, 2), dtype=int)
    with pytest.raises(InexactError, match=f"exact mode cannot .* {variant} .*irrational"):
        tiled_attention(q, q, q, math.log(2), exact=True, **{variant: torch.zeros(1)})


@pytest.mark.parametrize("slopes", [torch.tensor([0.5, 0.25]), torch.tensor([[0.5, 0.25], [1.0, 0.0], [0.1, 0.2]])])
def test_varlen_is_attention_ref_per_sequence(slopes):
    """Each sequence on its own lengths (its own bottom-right offset), slopes (batch, nheads) by sequence; the
    sequence without keys gets O = 0 and LSE = the sink."""
    lens_q, lens_k = [3, 2, 4], [5, 0, 2]
    starts_q, starts_k = [0, 3, 5, 9], [0, 5, 5, 7]
    generator = torch.Generator().manual_seed(29)
    q = torch.randn(9, 2, 3, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(7, 1, 3, generator=generator, dtype=torch.float64) for _ in "kv")
    sink = torch.tensor([0.25, -0.5])
    cu_q, cu_k = (torch.tensor(starts, dtype=torch.int32) for starts in (starts_q, starts_k))
    out, lse = attention_varlen_ref(
        q, k, v, cu_q, cu_k, causal=True, learnable_sink=sink, alibi_slopes=slopes, return_lse=True
    )
    for b in range(3):
        rows, keys = slice(starts_q[b], starts_q[b + 1]), slice(starts_k[b], starts_k[b + 1])
        if lens_k[b] == 0:
            assert torch.equal(out[rows], torch.zeros_like(out[rows]))
            assert torch.equal(lse[:, rows], sink.double()[:, None].expand(2, lens_q[b]))
            continue
        own_slopes = slopes if slopes.dim() == 1 else slopes[b : b + 1]
        options = {"causal": True, "learnable_sink": sink, "alibi_slopes": own_slopes}
        expected = attention_ref(q[None, rows], k[None, keys], v[None, keys], **options, return_lse=True)
        assert_same(out[rows], expected[0][0])
        assert_same(lse[:, rows], expected[1][0])


def test_kvcache_passes_them_on_by_position():
    """Sequence b's keys are cache positions leftpad[b] .. cache_seqlens[b] - 1, ALiBi distances counted from the
    last of them; sequence 1 has no key: O = 0, LSE = the sink."""
    generator = torch.Generator().manual_seed(30)
    q = torch.randn(2, 2, 4, 3, generator=generator, dtype=torch.float64)
    k_cache, v_cache = (torch.randn(2, 6, 2, 3, generator=generator, dtype=torch.float64) for _ in "kv")
    sink, slopes = torch.tensor([0.5, -0.25, 1.0, 0.0]), torch.tensor([[0.5, 0.25, 0.125, 1.0], [1.0] * 4])
    lengths, leftpad = torch.tensor([5, 0], dtype=torch.int32), torch.tensor([1, 0], dtype=torch.int32)
    options = {"causal": True, "learnable_sink": sink}
    out, lse, _, _ = attention_kvcache_ref(
        q, k_cache, v_cache, cache_seqlens=lengths, cache_leftpad=leftpad, **options, alibi_slopes=slopes
    )
    options["alibi_slopes"] = slopes[:1]
    expected = attention_ref(q[:1], k_cache[:1, 1:5], v_cache[:1, 1:5], **options, return_lse=True)
    assert_same(out[:1], expected[0])
    assert_same(lse[:1], expected[1])
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(lse[1], sink.double()[:, None].expand(4, 2))
