"""validate_attention_args: resolved values, and errors that name the argument, the value and what is allowed."""

import math
import re
from fractions import Fraction

import numpy as np
import pytest
import torch

from flashcute.validation import (
    AttentionArgs,
    aligned_rows,
    validate_attention_args,
    validate_kvcache_args,
    validate_tile_sizes,
    validate_varlen_args,
    validate_varlen_values,
)


def shaped(*shape: int) -> np.ndarray:
    return np.zeros(shape)


Q, KV = shaped(2, 3, 4, 8), shaped(2, 5, 2, 8)


def test_resolves_sizes_and_defaults():
    args = validate_attention_args(Q, KV, KV)
    assert args == AttentionArgs(
        batch=2,
        seqlen_q=3,
        seqlen_k=5,
        nheads=4,
        nheads_k=2,
        headdim=8,
        headdim_v=8,
        softmax_scale=1 / math.sqrt(8),
        causal=False,
        causal_align="bottom_right",
        window_left=-1,
        window_right=-1,
        softcap=0.0,
    )
    assert not args.has_mask and args.diagonal_offset == 2 and args.qheads_per_kvhead == 2
    assert args.learnable_sink is None and args.alibi_slopes is None


def test_v_may_have_a_head_dim_of_its_own():
    args = validate_attention_args(Q, KV, shaped(2, 5, 2, 16))
    assert (args.headdim, args.headdim_v, args.softmax_scale) == (8, 16, 1 / math.sqrt(8))  # the scale is q's


def test_causal_is_window_right_zero_and_keeps_window_left():
    args = validate_attention_args(Q, KV, KV, causal=True, window_size=(3, 7))
    assert (args.window_left, args.window_right, args.causal, args.has_mask) == (3, 0, True, True)


def test_a_window_side_of_none_is_unbounded():
    """flash-attn-4 writes an unbounded side as None where flash_attn 2 writes -1."""
    args = validate_attention_args(Q, KV, KV, window_size=(None, 4))
    assert (args.window_left, args.window_right) == (-1, 4)
    assert not validate_attention_args(Q, KV, KV, window_size=[None, None]).has_mask


@pytest.mark.parametrize(
    "window_size",
    [torch.tensor([3, 0]), np.array([3, 0]), (torch.tensor(3), np.int32(0)), (torch.tensor([3, 0])[0], 0)],
    ids=["tensor", "array", "0-dim sides", "tensor elements"],
)
def test_a_window_may_be_a_tensor_or_array_of_two_ints(window_size):
    """flash_attn's tests draw windows as torch.randint(0, seqlen_k, (2,))."""
    args = validate_attention_args(Q, KV, KV, window_size=window_size)
    assert (args.window_left, args.window_right) == (3, 0) and type(args.window_left) is int


@pytest.mark.parametrize("sizes", [(0, 3, 5), (2, 0, 5), (2, 3, 0)], ids=str)
def test_an_empty_batch_or_length_is_a_call_with_nothing_to_compute(sizes):
    batch, seqlen_q, seqlen_k = sizes
    args = validate_attention_args(shaped(batch, seqlen_q, 4, 8), *(shaped(batch, seqlen_k, 2, 8) for _ in "kv"))
    assert args.empty and (args.batch, args.seqlen_q, args.seqlen_k) == sizes
    assert not validate_attention_args(Q, KV, KV).empty


def test_top_left_alignment_has_no_offset():
    assert validate_attention_args(Q, KV, KV, causal_align="top_left").diagonal_offset == 0


def test_accepts_torch_numpy_fractions_and_numpy_scalars():
    fractions = np.full((1, 2, 1, 2), Fraction(1, 3), dtype=object)
    assert validate_attention_args(fractions, fractions, fractions).headdim == 2
    tensor = torch.zeros(1, 2, 1, 2, dtype=torch.bfloat16)
    args = validate_attention_args(tensor, tensor, tensor, softmax_scale=np.float32(0.5), window_size=(np.int64(1), -1))
    assert args.softmax_scale == 0.5 and args.window_left == 1 and type(args.window_left) is int


SHAPE_ERRORS = [
    ((Q.tolist(), KV, KV), TypeError, "q must be a tensor or array (batch, seqlen_q, nheads, headdim), got list"),
    (
        (shaped(2, 3, 8), KV, KV),
        ValueError,
        "q must have 4 dimensions (batch, seqlen_q, nheads, headdim), got shape (2, 3, 8)",
    ),
    (
        (Q, shaped(2, 5, 2, 8, 1), KV),
        ValueError,
        "k must have 4 dimensions (batch, seqlen_k, nheads_k, headdim), got shape (2, 5, 2, 8, 1)",
    ),
    ((shaped(2, 3, 0, 8), KV, KV), ValueError, "q.shape[2] (nheads) must be >= 1, got 0"),
    ((Q, shaped(2, 5, 0, 8), shaped(2, 5, 0, 8)), ValueError, "k.shape[2] (nheads_k) must be >= 1, got 0"),
    ((shaped(2, 3, 4, 0), KV, KV), ValueError, "q.shape[3] (headdim) must be >= 1"),
    ((Q, KV, shaped(2, 6, 2, 8)), ValueError, "v must have k's (batch, seqlen_k, nheads_k), (2, 5, 2), and any head"),
    ((Q, shaped(3, 5, 2, 8), shaped(3, 5, 2, 8)), ValueError, "k batch size (k.shape[0]) must equal q's (2), got 3"),
    ((Q, shaped(2, 5, 2, 4), shaped(2, 5, 2, 4)), ValueError, "k headdim (k.shape[3]) must equal q's (8), got 4"),
    (
        (Q, shaped(2, 5, 3, 8), shaped(2, 5, 3, 8)),
        ValueError,
        "k nheads_k (k.shape[2]) must divide q's nheads (4) for grouped-query attention, got 3",
    ),
]


@pytest.mark.parametrize(("tensors", "error", "message"), SHAPE_ERRORS)
def test_shape_errors(tensors, error, message):
    with pytest.raises(error, match=re.escape(message)):
        validate_attention_args(*tensors)


OPTION_ERRORS = [
    ("softmax_scale", 0.0, ValueError, "None (meaning 1/sqrt(headdim)) or a finite number > 0, got 0.0"),
    ("softmax_scale", -1.5, ValueError, "got -1.5"),
    ("softmax_scale", math.nan, ValueError, "got nan"),
    ("softmax_scale", math.inf, ValueError, "got inf"),
    ("softmax_scale", "0.5", TypeError, "got '0.5' (str)"),
    ("softmax_scale", True, TypeError, "got True (bool)"),
    ("causal", 1, TypeError, "must be a bool (True or False), got 1 (int)"),
    ("causal", None, TypeError, "got None (NoneType)"),
    ("causal_align", "bottom", ValueError, "must be one of ('bottom_right', 'top_left'), got 'bottom'"),
    (
        "window_size",
        (-2, 0),
        ValueError,
        "a pair (window_left, window_right) of ints >= -1 (-1 or None = unbounded), got (-2, 0)",
    ),
    ("window_size", (3,), TypeError, "got (3,)"),
    ("window_size", 3, TypeError, "got 3"),
    ("window_size", (1.0, 2), TypeError, "got (1.0, 2)"),
    ("window_size", (True, 0), TypeError, "got (True, 0)"),
    ("window_size", torch.tensor([1.5, 2.0]), TypeError, "got tensor([1.5000, 2.0000])"),
    ("window_size", torch.tensor([[1, 2]]), TypeError, "got tensor([[1, 2]])"),
    ("softcap", -1.0, ValueError, "must be a finite number >= 0 (0 = no softcap), got -1.0"),
    ("softcap", math.inf, ValueError, "got inf"),
    ("softcap", None, TypeError, "got None (NoneType)"),
]


@pytest.mark.parametrize(("name", "value", "error", "message"), OPTION_ERRORS)
def test_option_errors(name, value, error, message):
    with pytest.raises(error, match=re.escape(message)) as info:
        validate_attention_args(Q, KV, KV, **{name: value})
    assert str(info.value).startswith(f"{name} must be")


@pytest.mark.parametrize(
    ("block_m", "block_n", "error", "message"),
    [
        (0, 64, ValueError, "block_m must be an int >= 1, got 0"),
        (64, -3, ValueError, "block_n must be an int >= 1, got -3"),
        (64.0, 64, TypeError, "block_m must be an int >= 1, got 64.0 (float)"),
        (64, None, TypeError, "block_n must be an int >= 1, got None (NoneType)"),
    ],
)
def test_tile_size_errors(block_m, block_n, error, message):
    with pytest.raises(error, match=re.escape(message)):
        validate_tile_sizes(block_m, block_n)


def test_tma_addressable_materializes_broadcast_dims_only():
    from flashcute.kernels.sm90.family import tma_addressable

    k = torch.randn(1, 64, 2, 32).expand(3, 64, 2, 32)
    dense = tma_addressable(k)
    assert dense.stride() == (4096, 64, 32, 1) and torch.equal(dense, k)
    one = torch.randn(64, 2, 32).as_strided((1, 64, 2, 32), (0, 64, 32, 1))
    view = tma_addressable(one)
    assert view.stride() == (4096, 64, 32, 1) and view.data_ptr() == one.data_ptr()
    sliced = torch.randn(2, 64, 3, 32)[:, :, 1:]
    assert tma_addressable(sliced) is sliced


@pytest.mark.parametrize(
    "make, kept",
    [
        (lambda: torch.zeros(2, 5, 4, 16, dtype=torch.bfloat16), "as is"),
        (lambda: torch.zeros(2, 4, 5, 16, dtype=torch.bfloat16).transpose(1, 2), "as is"),
        (lambda: torch.zeros(2, 1, 4, 16, dtype=torch.bfloat16).as_strided((2, 1, 4, 16), (64, 3, 16, 1)), "view"),
        (lambda: torch.zeros(2, 5, 4, 32, dtype=torch.bfloat16)[..., ::2], "copy"),
        (lambda: torch.zeros(2, 5, 4, 17, dtype=torch.bfloat16)[..., :16], "copy"),
    ],
    ids=["contiguous", "heads first", "size-1 dim", "last stride 2", "rows of 17"],
)
def test_aligned_rows_reads_in_place_where_it_can_and_copies_elsewhere(make, kept):
    t = make()
    rows = aligned_rows("q", t)
    assert torch.equal(rows, t) and rows.stride(-1) == 1
    assert all(stride % 8 == 0 for stride in rows.stride()[:-1])
    assert (rows is t) == (kept == "as is")
    assert (rows.data_ptr() == t.data_ptr()) == (kept != "copy")
    if kept == "copy":  # a tensor the kernels write in place is refused instead
        with pytest.raises(ValueError, match=r"k_cache(.stride\(\d\))? must"):
            aligned_rows("k_cache", t, copy=False)


# ---- packed variable-length batches ---------------------------------------------------------------------------


def packed_args(**changes):
    """flash_attn_varlen_func's arguments for two sequences (4 and 6 queries, 5 and 7 keys), on the CPU, with
    ``changes`` applied."""
    args = {
        "q": torch.empty(10, 4, 64),
        "k": torch.empty(12, 2, 64),
        "v": torch.empty(12, 2, 64),
        "cu_seqlens_q": torch.tensor([0, 4, 10], dtype=torch.int32),
        "cu_seqlens_k": torch.tensor([0, 5, 12], dtype=torch.int32),
        "max_seqlen_q": 6,
        "max_seqlen_k": 7,
    }
    return {**args, **changes}


def test_packed_batch_resolves():
    args = validate_varlen_args(**packed_args(), causal=True, window_size=(3, 5))
    assert (args.batch, args.total_q, args.total_k, args.nheads, args.nheads_k, args.headdim) == (2, 10, 12, 4, 2, 64)
    assert (args.window_left, args.window_right, args.softmax_scale) == (3, 0, 0.125)
    empty = validate_varlen_args(**packed_args(q=torch.empty(0, 4, 64), cu_seqlens_q=torch.zeros(3, dtype=torch.int32)))
    assert empty.total_q == 0
    assert (args.headdim_v, validate_varlen_args(**packed_args(v=torch.empty(12, 2, 32))).headdim_v) == (64, 32)


def test_max_seqlen_left_out_is_the_total_rows():
    """flash-attn-4's default: without max_seqlen a side is bounded by its total rows (a paged cache's: the pages a
    sequence has), which no sequence can exceed."""
    args = validate_varlen_args(**packed_args(max_seqlen_q=None, max_seqlen_k=None))
    assert (args.max_seqlen_q, args.max_seqlen_k) == (10, 12)
    pages = {"k": torch.empty(5, 4, 2, 64), "v": torch.empty(5, 4, 2, 64)}
    table = torch.zeros(2, 3, dtype=torch.int32)
    args = validate_varlen_args(**packed_args(max_seqlen_k=None, block_table=table, **pages))
    assert (args.max_seqlen_q, args.max_seqlen_k) == (6, 12)


@pytest.mark.parametrize(
    "changes, error, message",
    [
        ({"q": torch.empty(10, 4)}, ValueError, r"q must have 3 dimensions \(total_q, nheads, headdim\)"),
        ({"q": torch.empty(10, 0, 64)}, ValueError, r"q.shape\[1\] \(nheads\) must be >= 1"),
        ({"v": torch.empty(11, 2, 64)}, ValueError, r"v must have k's \(total_k, nheads_k\), \(12, 2\), and any head"),
        ({"k": torch.empty(12, 3, 64), "v": torch.empty(12, 3, 64)}, ValueError, "must divide q's nheads"),
        ({"cu_seqlens_q": torch.tensor([0, 4, 10])}, TypeError, "cu_seqlens_q must have dtype int32"),
        ({"cu_seqlens_q": [0, 4, 10]}, TypeError, "cu_seqlens_q must be an int32 torch.Tensor"),
        ({"cu_seqlens_k": torch.tensor([0, 12], dtype=torch.int32)}, ValueError, "as many entries as cu_seqlens_q"),
        ({"cu_seqlens_q": torch.zeros(0, dtype=torch.int32)}, ValueError, "at least one entry"),
        ({"seqused_q": torch.tensor([4], dtype=torch.int32)}, ValueError, r"seqused_q must have shape \(batch,\)"),
        ({"max_seqlen_q": -1}, ValueError, "max_seqlen_q must be an int >= 0"),
        ({"max_seqlen_k": 7.0}, TypeError, "max_seqlen_k must be an int >= 0"),
    ],
)
def test_packed_batch_errors_name_the_argument(changes, error, message):
    with pytest.raises(error, match=message):
        validate_varlen_args(**packed_args(**changes))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"cu_seqlens_q": torch.tensor([1, 4, 10], dtype=torch.int32)}, r"cu_seqlens_q\[0\] must be 0"),
        ({"cu_seqlens_k": torch.tensor([0, 8, 7], dtype=torch.int32)}, "cu_seqlens_k must not decrease"),
        ({"cu_seqlens_q": torch.tensor([0, 4, 9], dtype=torch.int32)}, r"cu_seqlens_q\[-1\] \(9\) must equal"),
        ({"max_seqlen_k": 6}, r"max_seqlen_k \(6\) is smaller than sequence 1's length 7"),
        ({"seqused_q": torch.tensor([4, 7], dtype=torch.int32)}, r"seqused_q\[1\] must be in \[0, 6\]"),
    ],
)
def test_packed_batch_values_are_checked_on_request(changes, message):
    given = packed_args(**changes)
    args = validate_varlen_args(**given)
    with pytest.raises(ValueError, match=message):
        validate_varlen_values(args, given["cu_seqlens_q"], given["cu_seqlens_k"], given.get("seqused_q"), None)


def test_seqused_bounds_the_lengths_max_seqlen_must_cover():
    given = packed_args(seqused_q=torch.tensor([2, 3], dtype=torch.int32), max_seqlen_q=3)
    args = validate_varlen_args(**given)
    validate_varlen_values(args, given["cu_seqlens_q"], given["cu_seqlens_k"], given["seqused_q"], None)


# ---- learnable_sink and alibi_slopes ----------------------------------------------------------------------------


def test_records_the_score_tensors_as_given():
    sink, slopes = torch.tensor([-1e30, -math.inf, 0.5, 3.0], dtype=torch.bfloat16), torch.rand(2, 4)
    args = validate_attention_args(Q, KV, KV, learnable_sink=sink, alibi_slopes=slopes)
    assert args.learnable_sink is sink and args.alibi_slopes is slopes
    assert args == validate_attention_args(Q, KV, KV)  # tensors are left out of ==
    per_head = validate_attention_args(Q, KV, KV, alibi_slopes=torch.rand(4, dtype=torch.float64))
    assert per_head.alibi_slopes.shape == (4,)


HEADS = "(nheads,) = (4,)"
SLOPES = f"{HEADS} or (batch, nheads) = (2, 4)"
SCORE_TENSOR_ERRORS = [
    ("learnable_sink", [0.0] * 4, TypeError, f"must be a floating-point torch.Tensor {HEADS}, got list"),
    ("learnable_sink", torch.zeros(4, dtype=torch.int8), TypeError, "must have a floating-point dtype, got torch.int8"),
    ("learnable_sink", torch.zeros(2), ValueError, f"must have shape {HEADS}, got (2,)"),
    ("learnable_sink", torch.zeros(2, 4), ValueError, f"must have shape {HEADS}, got (2, 4)"),
    ("learnable_sink", torch.zeros(4, device="meta"), ValueError, "must be on q's device (cpu), got meta"),
    ("alibi_slopes", np.zeros(4), TypeError, f"must be a floating-point torch.Tensor {SLOPES}, got ndarray"),
    ("alibi_slopes", torch.zeros(4, dtype=torch.int64), TypeError, "must have a floating-point dtype, got torch.int64"),
    ("alibi_slopes", torch.zeros(3, 4), ValueError, f"must have shape {SLOPES}, got (3, 4)"),
    ("alibi_slopes", torch.zeros(2, 4, device="meta"), ValueError, "must be on q's device (cpu), got meta"),
    ("alibi_slopes", torch.tensor([0.5, math.nan, 0.1, 0.2]), ValueError, "must be finite, got nan at index (1,)"),
    ("alibi_slopes", torch.tensor([[0.5] * 4, [0, 0, -math.inf, 0]]), ValueError, "got -inf at index (1, 2)"),
]


@pytest.mark.parametrize(("name", "value", "error", "message"), SCORE_TENSOR_ERRORS)
def test_score_tensor_errors(name, value, error, message):
    with pytest.raises(error, match=re.escape(message)) as info:
        validate_attention_args(Q, KV, KV, **{name: value})
    assert str(info.value).startswith(f"{name} must")


def test_score_tensors_index_the_sequences_of_a_packed_batch_and_q_of_a_kv_cache():
    args = validate_varlen_args(**packed_args(), learnable_sink=torch.zeros(4), alibi_slopes=torch.zeros(2, 4))
    assert args.learnable_sink.shape == (4,) and args.alibi_slopes.shape == (2, 4)
    with pytest.raises(ValueError, match=re.escape("(batch, nheads) = (2, 4), got (10, 4)")):
        validate_varlen_args(**packed_args(), alibi_slopes=torch.zeros(10, 4))
    q, cache = torch.zeros(3, 1, 4, 8), torch.zeros(3, 6, 2, 8)
    kvcache = validate_kvcache_args(q, cache, cache, learnable_sink=torch.zeros(4), alibi_slopes=torch.zeros(3, 4))
    assert kvcache.attention.learnable_sink.shape == (4,) and kvcache.attention.alibi_slopes.shape == (3, 4)
    with pytest.raises(ValueError, match=re.escape("learnable_sink must have shape (nheads,) = (4,), got (2,)")):
        validate_kvcache_args(q, cache, cache, learnable_sink=torch.zeros(2))
