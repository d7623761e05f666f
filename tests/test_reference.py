"""attention_ref, the float64 specification: known values, an independent loop implementation, invariants."""

import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashcute.reference import attention_ref, attention_same_precision, visibility_mask
from flashcute.validation import validate_attention_args
from tests.helpers import (
    LN2,
    SEED_CAUSAL_LSE_ARG,
    SEED_CAUSAL_OUT,
    SEED_K,
    SEED_LSE_ARG,
    SEED_OUT,
    SEED_Q,
    SEED_V,
    Problem,
    problems,
)

FEW = settings(max_examples=25, deadline=None)


def loop_attention(
    q, k, v, softmax_scale=None, causal=False, causal_align="bottom_right", window_size=(-1, -1), softcap=0.0
):
    """Textbook attention one score at a time in Python floats, the mask rule written out (shares no code)."""
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(headdim) if softmax_scale is None else softmax_scale
    left, right = window_size[0], 0 if causal else window_size[1]
    offset = seqlen_k - seqlen_q if causal_align == "bottom_right" else 0
    q, k, v = q.tolist(), k.tolist(), v.tolist()
    out = torch.zeros(batch, seqlen_q, nheads, headdim, dtype=torch.float64)
    lse = torch.full((batch, nheads, seqlen_q), -math.inf, dtype=torch.float64)
    for b, h, i in itertools.product(range(batch), range(nheads), range(seqlen_q)):
        kv_h = h // (nheads // nheads_k)
        keys = [
            j
            for j in range(seqlen_k)
            if (left < 0 or j >= i + offset - left) and (right < 0 or j <= i + offset + right)
        ]
        if not keys:
            continue
        scores = [scale * sum(a * c for a, c in zip(q[b][i][h], k[b][j][kv_h], strict=True)) for j in keys]
        if softcap > 0:
            scores = [softcap * math.tanh(x / softcap) for x in scores]
        top = max(scores)
        row_lse = top + math.log(sum(math.exp(x - top) for x in scores))
        lse[b, h, i] = row_lse
        for x, j in zip(scores, keys, strict=True):
            out[b, i, h] += math.exp(x - row_lse) * torch.tensor(v[b][j][kv_h], dtype=torch.float64)
    return out, lse


def assert_same(actual, expected, atol=1e-12):
    torch.testing.assert_close(actual, expected, atol=atol, rtol=1e-12, equal_nan=True)


# ---- known values -------------------------------------------------------------------------------------------


def test_seed_worked_example():
    out, lse = attention_ref(SEED_Q, SEED_K, SEED_V, softmax_scale=LN2, return_lse=True)
    assert_same(out[0, :, 0], torch.tensor(SEED_OUT, dtype=torch.float64))
    assert_same(lse[0, 0], torch.log(torch.tensor(SEED_LSE_ARG, dtype=torch.float64)))


def test_seed_worked_example_top_left_causal():
    out, lse = attention_ref(SEED_Q, SEED_K, SEED_V, LN2, causal=True, causal_align="top_left", return_lse=True)
    assert_same(out[0, :, 0], torch.tensor([[float(x) for x in row] for row in SEED_CAUSAL_OUT], dtype=torch.float64))
    assert_same(lse[0, 0], torch.log(torch.tensor(SEED_CAUSAL_LSE_ARG, dtype=torch.float64)))


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"causal": True}, [[1, 1, 1, 0], [1, 1, 1, 1]]),  # bottom-right: j <= i + 2
        ({"causal": True, "causal_align": "top_left"}, [[1, 0, 0, 0], [1, 1, 0, 0]]),  # j <= i
        ({"window_size": (1, 0)}, [[0, 1, 1, 0], [0, 0, 1, 1]]),  # i + 2 - 1 <= j <= i + 2
        ({"window_size": (0, 1), "causal_align": "top_left"}, [[1, 1, 0, 0], [0, 1, 1, 0]]),  # i <= j <= i + 1
        ({"window_size": (1, 3), "causal": True}, [[0, 1, 1, 0], [0, 0, 1, 1]]),  # causal overrides window_right
        ({}, [[1, 1, 1, 1], [1, 1, 1, 1]]),
    ],
)
def test_visibility_mask_by_hand(options, expected):
    q, k = torch.zeros(1, 2, 1, 1), torch.zeros(1, 4, 1, 1)
    args = validate_attention_args(q, k, k, **options)
    mask = visibility_mask(args, torch.arange(2), torch.arange(4))
    assert mask.tolist() == [[bool(x) for x in row] for row in expected]


def test_visibility_mask_hides_keys_past_seqlen_k_and_works_on_numpy():
    args = validate_attention_args(np.zeros((1, 3, 1, 1)), np.zeros((1, 2, 1, 1)), np.zeros((1, 2, 1, 1)))
    mask = visibility_mask(args, np.arange(3), np.arange(4))
    assert mask.tolist() == [[True, True, False, False]] * 3


def test_default_scale_is_inverse_sqrt_headdim():
    q, k, v = Problem(1, 3, 5, 2, 1, 4, seed=0, options={}).tensors()
    assert_same(attention_ref(q, k, v), attention_ref(q, k, v, softmax_scale=0.5))


# ---- against the loop implementation ------------------------------------------------------------------------


@FEW
@given(problems())
def test_matches_loop_implementation(problem):
    q, k, v = problem.tensors()
    out, lse = attention_ref(q, k, v, **problem.options, return_lse=True)
    expected_out, expected_lse = loop_attention(q, k, v, **problem.options)
    assert_same(out, expected_out)
    assert_same(lse, expected_lse)


def test_each_column_of_out_mixes_its_column_of_v():
    """v's head dim is its own: out's column c depends on v's column c alone, so out with v's first columns is the
    first columns of out, and the scale stays q's."""
    generator = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 5, 2, 8, generator=generator), torch.randn(1, 7, 2, 8, generator=generator)
    v = torch.randn(1, 7, 2, 12, generator=generator)
    out = attention_ref(q, k, v, causal=True)
    assert out.shape == (1, 5, 2, 12)
    torch.testing.assert_close(attention_ref(q, k, v[..., :3], causal=True), out[..., :3], rtol=1e-12, atol=1e-12)
    probs = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) / math.sqrt(8), dim=-1)
    torch.testing.assert_close(attention_ref(q, k, v), torch.einsum("bhqk,bkhd->bqhd", probs, v.double()))


def test_gqa_query_head_reads_kv_head_h_div_group():
    q, k, v = Problem(2, 5, 7, 6, 2, 3, seed=1, options={}).tensors()
    out = attention_ref(q, k, v, causal=True)
    for h in range(6):
        kv = slice(h // 3, h // 3 + 1)
        assert_same(out[:, :, h : h + 1], attention_ref(q[:, :, h : h + 1], k[:, :, kv], v[:, :, kv], causal=True))


def test_softcap_formula():
    q, k, v = Problem(1, 4, 6, 1, 1, 3, seed=2, options={}).tensors()
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * 0.7
    capped = 1.5 * torch.tanh(scores / 1.5)
    expected = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(capped, dim=-1), v)
    out, lse = attention_ref(q, k, v, softmax_scale=0.7, softcap=1.5, return_lse=True)
    assert_same(out, expected)
    assert_same(lse, torch.logsumexp(capped, dim=-1))


@pytest.mark.parametrize("seqlen_k", [3, 5, 9])
def test_alignments_coincide_only_when_square(seqlen_k):
    q, k, v = Problem(1, 5, seqlen_k, 2, 2, 3, seed=3, options={}).tensors()
    bottom_right = attention_ref(q, k, v, causal=True, causal_align="bottom_right")
    top_left = attention_ref(q, k, v, causal=True, causal_align="top_left")
    assert torch.equal(bottom_right, top_left) == (seqlen_k == 5)


@pytest.mark.parametrize("window_left", [-1, 0, 2])
def test_causal_is_window_right_zero(window_left):
    q, k, v = Problem(1, 6, 9, 1, 1, 2, seed=4, options={}).tensors()
    assert_same(
        attention_ref(q, k, v, causal=True, window_size=(window_left, 7)),
        attention_ref(q, k, v, window_size=(window_left, 0)),
    )


# ---- rows that see no key, NaN, dtypes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "empty_rows"),
    [
        ({"causal": True}, [0, 1, 2]),  # bottom-right, seqlen_q 5 > seqlen_k 2: row i sees j <= i - 3
        ({"window_size": (0, 0), "causal_align": "top_left"}, [2, 3, 4]),  # row i sees only key i
        ({"window_size": (-1, 0), "causal_align": "bottom_right"}, [0, 1, 2]),
    ],
)
def test_row_that_sees_no_key_gives_zero_and_neg_inf(options, empty_rows):
    q, k, v = Problem(2, 5, 2, 2, 1, 3, seed=5, options={}).tensors()
    out, lse = attention_ref(q, k, v, **options, return_lse=True)
    assert not out.isnan().any() and not lse.isnan().any()
    assert torch.equal(out[:, empty_rows], torch.zeros_like(out[:, empty_rows]))
    assert (lse[:, :, empty_rows] == -math.inf).all()
    seen = [i for i in range(5) if i not in empty_rows]
    assert lse[:, :, seen].isfinite().all()


def test_nan_in_q_reaches_only_its_row():
    q, k, v = Problem(1, 4, 6, 2, 2, 3, seed=6, options={}).tensors()
    q[0, 2, 1, 0] = math.nan
    out, lse = attention_ref(q, k, v, return_lse=True)
    assert out[0, 2, 1].isnan().all() and lse[0, 1, 2].isnan()
    assert out.isnan().sum() == 3 and lse.isnan().sum() == 1


def test_inf_in_k_propagates_like_float_math():
    q, k, v = Problem(1, 3, 4, 1, 1, 2, seed=7, options={}).tensors()
    q.abs_()  # q . k_j = +inf for a positive inf entry in k_j
    k[0, 1, 0, 0] = math.inf
    out, lse = attention_ref(q, k, v, return_lse=True)
    assert (lse == math.inf).all()
    assert out.isnan().all()  # exp(inf - inf) = NaN, as torch.softmax would give


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_inputs_are_upcast(dtype):
    q, k, v = Problem(1, 5, 7, 2, 1, 4, seed=8, options={}).tensors(dtype)
    out, lse = attention_ref(q, k, v, causal=True, return_lse=True)
    assert out.dtype == lse.dtype == torch.float64 and out.device == q.device
    expected = attention_ref(q.double(), k.double(), v.double(), causal=True, return_lse=True)
    assert_same(out, expected[0])
    assert_same(lse, expected[1])


def test_return_lse_false_returns_only_out():
    q, k, v = Problem(1, 2, 3, 1, 1, 2, seed=9, options={}).tensors()
    out = attention_ref(q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape


# ---- invariants ---------------------------------------------------------------------------------------------


@FEW
@given(problems(softcap=False), st.floats(-20, 20))
def test_adding_a_constant_to_a_score_row_changes_nothing(problem, shift):
    """Append a coordinate: q' = [q, c / s], k' = [k, 1], v' = [v, 0] adds c to every score of every row."""
    q, k, v = problem.tensors()
    options = problem.options | {"softmax_scale": problem.options["softmax_scale"] or 1 / math.sqrt(problem.headdim)}
    q2 = torch.cat([q, torch.full_like(q[..., :1], shift / options["softmax_scale"])], dim=-1)
    k2, v2 = torch.cat([k, torch.ones_like(k[..., :1])], dim=-1), torch.cat([v, torch.zeros_like(v[..., :1])], dim=-1)
    out, lse = attention_ref(q, k, v, **options, return_lse=True)
    out2, lse2 = attention_ref(q2, k2, v2, **options, return_lse=True)
    assert_same(out2[..., :-1], out, atol=1e-10)
    assert_same(lse2, lse + shift, atol=1e-10)


@FEW
@given(problems())
def test_batch_elements_are_independent(problem):
    q, k, v = problem.tensors()
    out = attention_ref(q, k, v, **problem.options)
    for b in range(problem.batch):
        assert_same(out[b : b + 1], attention_ref(q[b : b + 1], k[b : b + 1], v[b : b + 1], **problem.options))
    k_changed = k.clone()
    k_changed[-1] += 1.0
    assert_same(attention_ref(q, k_changed, v, **problem.options)[:-1], out[:-1])


@FEW
@given(problems())
def test_rows_of_p_sum_to_one(problem):
    """With V = identity (headdim = seqlen_k) the output is P itself: P >= 0, 0 on hidden keys, rows sum to 1."""
    q, k, _ = dataclasses.replace(problem, headdim=problem.seqlen_k).tensors()
    v = torch.eye(problem.seqlen_k, dtype=torch.float64)[None, :, None, :].expand_as(k)
    probs, lse = attention_ref(q, k, v, **problem.options, return_lse=True)  # (batch, seqlen_q, nheads, seqlen_k)
    args = validate_attention_args(q, k, v, **problem.options)
    visible = visibility_mask(args, torch.arange(problem.seqlen_q), torch.arange(problem.seqlen_k))
    sees_a_key = visible.any(dim=-1)  # (seqlen_q,)
    assert (probs >= 0).all()
    assert (probs.transpose(1, 2)[:, :, ~visible] == 0).all()  # (batch, nheads, hidden (i, j) pairs)
    row_sums = probs.sum(dim=-1)  # (batch, seqlen_q, nheads)
    assert_same(row_sums, sees_a_key[None, :, None].double().expand_as(row_sums))
    assert torch.equal(lse == -math.inf, ~sees_a_key[None, None, :].expand_as(lse))


# ---- the same-precision baseline of the error budget ---------------------------------------------------------


@FEW
@given(problems(sinks=True, alibi=True))
def test_same_precision_baseline_in_float64_is_the_spec(problem):
    """Same math as the spec (masks, windows, softcap, sinks, ALiBi, GQA, rows that see no key); only the precision
    differs."""
    q, k, v = problem.tensors()
    assert_same(attention_same_precision(q, k, v, **problem.options), attention_ref(q, k, v, **problem.options))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_same_precision_baseline_stays_in_the_input_dtype(dtype):
    q, k, v = Problem(2, 37, 53, 4, 2, 16, seed=10, options={}).tensors(dtype)
    out = attention_same_precision(q, k, v, causal=True)
    assert out.dtype == dtype and out.shape == q.shape
    err = (out.double() - attention_ref(q, k, v, causal=True)).abs().max().item()
    assert 0 < err < 0.05  # rounding of a 16-bit computation: not zero, but small
