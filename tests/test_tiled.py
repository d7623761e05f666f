"""reference/tiled.py, the kernel's block algorithm on the CPU: equal to the spec, exact on the seed example."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashcute.reference import InexactError, attention_ref, tiled_attention, visibility_mask
from flashcute.reference.tiled import ceil_div, n_block_range, query_range, tile_needs_mask
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

FEW = settings(max_examples=30, deadline=None)
tile_sizes = st.integers(1, 9)


def seed_trace(**options):
    return tiled_attention(SEED_Q, SEED_K, SEED_V, LN2, block_m=2, block_n=2, exact=True, trace=True, **options)


def as_fractions(rows):
    return np.array([[Fraction(x) for x in row] for row in rows], dtype=object)


def assert_exact(actual, expected):
    assert actual.dtype == object and np.array_equal(actual, as_fractions(expected)), actual


# ---- equal to the specification -----------------------------------------------------------------------------


@FEW
@given(problems(), tile_sizes, tile_sizes)
def test_matches_spec(problem, block_m, block_n):
    q, k, v = problem.tensors()
    result = tiled_attention(q, k, v, **problem.options, block_m=block_m, block_n=block_n)
    out, lse = attention_ref(q, k, v, **problem.options, return_lse=True)
    np.testing.assert_allclose(result.out, out.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(result.lse, lse.numpy(), rtol=1e-12, atol=1e-12)  # -inf rows must match exactly


@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(1, 1), (1, 17), (17, 1), (13, 29), (29, 13), (64, 64)])
@pytest.mark.parametrize("mask", [{}, {"causal": True}, {"causal": True, "causal_align": "top_left"}])
def test_matches_spec_on_tile_breaking_lengths(seqlen_q, seqlen_k, mask):
    q, k, v = Problem(1, seqlen_q, seqlen_k, 4, 2, 8, seed=seqlen_q * 100 + seqlen_k, options={}).tensors()
    result = tiled_attention(q, k, v, **mask, block_m=16, block_n=8)
    out, lse = attention_ref(q, k, v, **mask, return_lse=True)
    np.testing.assert_allclose(result.out, out.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(result.lse, lse.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("head_dim_v", [4, 12])
def test_matches_spec_with_v_head_dim_of_its_own(head_dim_v):
    q, k, _ = Problem(2, 13, 29, 4, 2, 8, seed=head_dim_v, options={}).tensors()
    v = torch.randn(2, 29, 2, head_dim_v, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    result = tiled_attention(q, k, v, causal=True, block_m=4, block_n=8)
    out, lse = attention_ref(q, k, v, causal=True, return_lse=True)
    assert result.out.shape == (2, 13, 4, head_dim_v)
    np.testing.assert_allclose(result.out, out.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(result.lse, lse.numpy(), rtol=1e-12, atol=1e-12)


def test_accepts_numpy_and_low_precision_torch():
    q, k, v = Problem(1, 5, 6, 2, 1, 3, seed=11, options={}).tensors(torch.bfloat16)
    from_torch = tiled_attention(q, k, v, block_m=2, block_n=4)
    from_numpy = tiled_attention(*(x.double().numpy() for x in (q, k, v)), block_m=2, block_n=4)
    assert from_torch.out.dtype == np.float64 and np.array_equal(from_torch.out, from_numpy.out)


def test_rows_that_see_no_key_give_zero_and_neg_inf():
    q, k, v = Problem(1, 6, 3, 1, 1, 2, seed=12, options={}).tensors()
    result = tiled_attention(q, k, v, causal=True, block_m=2, block_n=2)  # bottom-right: row i sees j <= i - 3
    assert np.array_equal(result.out[0, :3], np.zeros((3, 1, 2)))
    assert (result.lse[0, 0, :3] == -math.inf).all() and np.isfinite(result.lse[0, 0, 3:]).all()


def test_rows_that_see_no_key_in_exact_mode():
    q, k, v = (np.ones((1, n, 1, 1), dtype=int) for n in (3, 1, 1))
    result = tiled_attention(q, k, v, LN2, window_size=(0, 0), causal_align="top_left", exact=True, block_m=3)
    assert list(result.out[0, :, 0, 0]) == [1, 0, 0]
    assert list(result.lse_arg[0, 0]) == [2, 0, 0] and list(result.lse[0, 0]) == [LN2, -math.inf, -math.inf]


# ---- tile skipping and masking ------------------------------------------------------------------------------


@FEW
@given(problems(max_seqlen=20, softcap=False), tile_sizes, tile_sizes)
def test_skipped_tiles_are_wholly_masked_and_unmasked_tiles_wholly_visible(problem, block_m, block_n):
    q, k, v = problem.tensors()
    args = validate_attention_args(q, k, v, **problem.options)
    for m_block in range(ceil_div(args.seqlen_q, block_m)):
        rows = np.array(query_range(args, m_block, block_m))
        visited = n_block_range(args, m_block, block_m, block_n)
        for n_block in range(ceil_div(args.seqlen_k, block_n) + 1):
            cols = n_block * block_n + np.arange(block_n)
            visible = visibility_mask(args, rows, cols)
            if n_block not in visited:
                assert not visible.any(), (m_block, n_block)
            elif not tile_needs_mask(args, m_block, n_block, block_m, block_n):
                assert visible.all(), (m_block, n_block)
            else:
                assert visible.any(), (m_block, n_block)  # the range is tight: no wasted tile


def test_causal_tile_skipping_halves_the_work():
    q = np.zeros((1, 64, 1, 1))
    result = tiled_attention(q, q, q, causal=True, block_m=16, block_n=16, trace=True)
    visited = [len(block.rounds) for block in result.trace]
    masked = [[record.masked for record in block.rounds] for block in result.trace]
    assert visited == [1, 2, 3, 4] and all(
        flags == [False] * (n - 1) + [True] for flags, n in zip(masked, visited, strict=True)
    )


# ---- exact mode: the seed's worked example ------------------------------------------------------------------


def test_seed_example_exact_output():
    result = seed_trace()
    assert_exact(result.out[0, :, 0], SEED_OUT)
    assert list(result.lse_arg[0, 0]) == SEED_LSE_ARG and result.scale_log2 == 1
    np.testing.assert_allclose(result.lse[0, 0], np.log(SEED_LSE_ARG), rtol=1e-15)


def test_seed_example_trace_is_the_articles_figures():
    (block,) = seed_trace().trace
    assert block.queries == range(2) and block.visited == range(2) and block.skipped == ()
    round0, round1 = block.rounds
    assert round0.keys == range(2) and round1.keys == range(2, 4) and not round0.masked and not round1.masked
    assert_exact(np.concatenate([round0.acc_s, round1.acc_s], axis=1), [[0, 1, 2, 0], [1, 0, 1, 2]])  # Fig. 5
    assert_exact(round0.acc_p, [[Fraction(1, 2), 1], [1, Fraction(1, 2)]])  # Fig. 6
    assert list(round0.row_max) == [1, 1] and list(round0.row_sum) == [Fraction(3, 2)] * 2
    assert_exact(round0.acc_o, [[Fraction(1, 2), 1], [1, Fraction(1, 2)]])  # Fig. 8
    assert list(round1.row_max) == [2, 2] and list(round1.alpha) == [Fraction(1, 2)] * 2
    assert_exact(round1.acc_p, [[1, Fraction(1, 4)], [Fraction(1, 2), 1]])  # Fig. 7
    assert_exact(round1.d_acc_o, [[Fraction(3, 2), 1], [Fraction(5, 2), Fraction(1, 2)]])  # Fig. 9
    assert_exact(round1.acc_o, [[Fraction(7, 4), Fraction(3, 2)], [3, Fraction(3, 4)]])  # Fig. 10
    assert list(round1.row_sum) == [2, Fraction(9, 4)]


def test_seed_example_top_left_causal_skips_the_second_tile():
    result = seed_trace(causal=True, causal_align="top_left")
    (block,) = result.trace
    assert block.visited == range(1) and block.skipped == (1,)
    (round0,) = block.rounds
    assert round0.masked and round0.acc_s[0, 0] == 0 and round0.acc_s[1, 0] == 1 and round0.acc_s[1, 1] == 0
    assert round0.acc_s[0, 1] == -math.inf  # Fig. 11
    assert_exact(result.out[0, :, 0], SEED_CAUSAL_OUT)
    assert list(result.lse_arg[0, 0]) == SEED_CAUSAL_LSE_ARG


@pytest.mark.parametrize(("block_m", "block_n"), [(1, 1), (1, 3), (2, 4), (5, 3)])
def test_seed_example_exact_for_any_tiling(block_m, block_n):
    result = tiled_attention(SEED_Q, SEED_K, SEED_V, LN2, block_m=block_m, block_n=block_n, exact=True)
    assert_exact(result.out[0, :, 0], SEED_OUT)
    assert list(result.lse_arg[0, 0]) == SEED_LSE_ARG


@FEW
@given(problems(max_seqlen=9, softcap=False), tile_sizes, tile_sizes, st.sampled_from([1, 2]))
def test_exact_mode_agrees_with_float_mode(problem, block_m, block_n, scale_log2):
    """Integer inputs with softmax_scale = k ln 2 make every exp2 argument an integer."""
    q, k, v = (torch.round(x) for x in problem.tensors())
    options = problem.options | {"softmax_scale": scale_log2 * LN2}
    exact = tiled_attention(q, k, v, **options, block_m=block_m, block_n=block_n, exact=True)
    floats = tiled_attention(q, k, v, **options, block_m=block_m, block_n=block_n)
    assert exact.scale_log2 == scale_log2
    np.testing.assert_allclose(exact.out.astype(np.float64), floats.out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(exact.lse, floats.lse, rtol=1e-12, atol=1e-12)


def test_exact_trace_keeps_the_online_softmax_invariant():
    """After each round, l = sum over keys seen of 2^(S * scale_log2 - m * scale_log2), exactly."""
    q, k, v = (torch.round(x) for x in Problem(1, 3, 7, 1, 1, 2, seed=13, options={}).tensors())
    (block,) = tiled_attention(q, k, v, LN2, block_m=4, block_n=3, exact=True, trace=True).trace
    scores = np.concatenate([record.acc_s for record in block.rounds], axis=1)
    for round_idx, record in enumerate(block.rounds):
        seen = scores[:, : (round_idx + 1) * 3]
        expected = [
            sum(Fraction(2) ** int(x - m) for x in row if x != -math.inf)
            for row, m in zip(seen, record.row_max, strict=True)
        ]
        assert list(record.row_sum) == expected


@FEW
@given(problems(), tile_sizes, tile_sizes, st.sampled_from([0.0, 1.0, 8.0]))
def test_lazy_rescaling_matches_spec(problem, block_m, block_n, threshold):
    """A row that keeps an old max (lazy rescaling, the sm80 bf16 D=128 kernel's) gives the spec's O and LSE."""
    q, k, v = problem.tensors()
    result = tiled_attention(q, k, v, **problem.options, block_m=block_m, block_n=block_n, rescale_threshold=threshold)
    out, lse = attention_ref(q, k, v, **problem.options, return_lse=True)
    np.testing.assert_allclose(result.out, out.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(result.lse, lse.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("threshold", "moves"), [(0.0, 8), (2.0, 8), (8.0, 3)])
def test_lazy_rescaling_keeps_the_max_within_the_threshold_exactly(threshold, moves):
    """Scores rising by 1 a key (scale_log2 = 1): the kept max trails the true one by at most the threshold, alpha is
    1 whenever it is kept, every E stays at most 2^threshold, and O and LSE are exactly the eager ones. The max rises
    by 3 a tile of 3 keys, so above a threshold of 3 it moves at the first of 8 tiles and then every third one."""
    seqlen = 24
    q = torch.ones(1, 1, 1, 1)
    k = torch.arange(seqlen, dtype=torch.float64).reshape(1, seqlen, 1, 1)
    v = torch.arange(seqlen, dtype=torch.float64).reshape(1, seqlen, 1, 1) % 5
    lazy = tiled_attention(q, k, v, LN2, block_m=1, block_n=3, exact=True, trace=True, rescale_threshold=threshold)
    eager = tiled_attention(q, k, v, LN2, block_m=1, block_n=3, exact=True)
    assert np.array_equal(lazy.out, eager.out) and np.array_equal(lazy.lse_arg, eager.lse_arg)
    (block,) = lazy.trace
    for record in block.rounds:
        assert record.acc_s.max() - record.row_max[0] <= threshold
        assert max(record.acc_p[0]) <= 2**threshold
    assert sum(record.alpha[0] != 1 for record in block.rounds) == moves


@pytest.mark.parametrize(
    ("inputs", "options", "message"),
    [
        ("halves", {"softmax_scale": LN2}, "integer, got 1/2"),  # score 1/2, and 2^(1/2) is irrational
        ("integers", {"softmax_scale": 0.5}, "rational multiple of ln 2"),
        ("integers", {}, "rational multiple of ln 2"),  # default 1 / sqrt(headdim)
        ("integers", {"softmax_scale": LN2, "softcap": 3.0}, "softcap"),
        ("nan", {"softmax_scale": LN2}, "finite rational inputs"),
    ],
)
def test_exact_mode_says_why_it_cannot(inputs, options, message):
    q = np.array({"halves": [[0.5, 0.5]], "integers": [[1, 2]], "nan": [[math.nan, 1]]}[inputs])[None, :, None, :]
    with pytest.raises(InexactError, match=message):
        tiled_attention(q, q, q, **options, exact=True)


# ---- trace layout -------------------------------------------------------------------------------------------


def test_trace_has_one_block_per_batch_head_and_q_tile():
    q, k, v = Problem(2, 5, 7, 4, 2, 3, seed=14, options={}).tensors()
    result = tiled_attention(q, k, v, block_m=2, block_n=3, trace=True, window_size=(1, 1))
    expected = list(itertools.product(range(2), range(4), range(3)))
    assert [(block.batch_idx, block.head_idx, block.m_block) for block in result.trace] == expected
    for block in result.trace:
        assert [record.n_block for record in block.rounds] == list(block.visited)
        assert sorted([*block.visited, *block.skipped]) == [0, 1, 2]
        assert all(record.acc_s.shape == (2, 3) and record.acc_o.shape == (2, 3) for record in block.rounds)


def test_no_trace_unless_asked():
    assert tiled_attention(SEED_Q, SEED_K, SEED_V).trace is None


@pytest.mark.parametrize(("name", "value", "error"), [("block_m", 0, ValueError), ("block_n", 2.0, TypeError)])
def test_bad_tile_sizes(name, value, error):
    with pytest.raises(error, match=rf"{name} must be an int >= 1, got {value!r}"):
        tiled_attention(SEED_Q, SEED_K, SEED_V, **{name: value})
