"""The backward's preprocess (D = rowsum(dO * O), dQaccum zeroed, LSE * log2(e)) and postprocess (dQ = dQaccum *
scale) on the GPU, and a packed backward's rows of dK and dV outside every sequence zeroed.

Inputs are slices of packed tensors and outputs are NaN-poisoned views into larger buffers, so a kernel that reads
the wrong strides, leaves an element unwritten or writes a row past seqlen_q or a column past head_dim fails.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from flashcute.kernels.common.prepost import postprocess as launch_bwd_postprocess
from flashcute.kernels.common.prepost import preprocess as launch_bwd_preprocess
from flashcute.kernels.common.prepost import zero_rows_outside_sequences as launch_zero_rows

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]
HEAD_DIMS = [32, 64, 96, 128, 192, 256, 40, 200]
SEQLENS = [1, 17, 113, 300]
FP32_EPS = 2.0**-24  # unit roundoff of float32


def packed_pair(batch: int, seqlen: int, nheads: int, head_dim: int, dtype: torch.dtype):
    """Two (batch, seqlen, nheads, head_dim) tensors interleaved in one buffer: strided views, as in packed QKV."""
    packed = torch.randn(batch, seqlen, 2, nheads, head_dim, device="cuda", dtype=dtype)
    return packed.unbind(dim=2)


def poisoned_view(shape: tuple[int, ...], pad: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """A NaN-filled float32 buffer ``pad`` larger than ``shape`` in each dim, and its leading ``shape`` view."""
    buffer = torch.full([n + p for n, p in zip(shape, pad, strict=True)], torch.nan, device="cuda")
    return buffer, buffer[tuple(slice(0, n) for n in shape)]


def outside(buffer: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The elements of ``buffer`` outside its leading ``shape`` view."""
    mask = torch.ones_like(buffer, dtype=torch.bool)
    mask[tuple(slice(0, n) for n in shape)] = False
    return buffer[mask]


def check_delta(delta: torch.Tensor, dout: torch.Tensor, out: torch.Tensor) -> None:
    """D against float64 within float32 summation's error bound, head_dim * eps * sum |dO * O| per row (the
    products of two fp16 or bf16 values are exact in float32; only the additions round)."""
    products = dout.double() * out.double()
    ref = products.sum(-1).transpose(1, 2)
    bound = out.shape[-1] * FP32_EPS * products.abs().sum(-1).transpose(1, 2) + 1e-30
    assert not delta.isnan().any(), f"{delta.isnan().sum().item()} rows of D unwritten"
    err = (delta.double() - ref).abs()
    assert (err <= bound).all(), f"D off by {err.max().item():.3g}, bound {bound[err > bound].min().item():.3g}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("seqlen", SEQLENS)
@pytest.mark.parametrize("zero_dq_accum", [True, False], ids=["zero_dq_accum", "d_only"])
def test_preprocess(dtype, head_dim, seqlen, zero_dq_accum):
    batch, nheads = 2, 3
    out, dout = packed_pair(batch, seqlen, nheads, head_dim, dtype)
    delta_buffer, delta = poisoned_view((batch, nheads, seqlen), (1, 1, 5))
    accum_shape = (batch, seqlen, nheads, head_dim)
    accum_buffer, dq_accum = poisoned_view(accum_shape, (1, 3, 1, 8))
    launch_bwd_preprocess(dout, out, delta, dq_accum if zero_dq_accum else None)
    torch.cuda.synchronize()
    check_delta(delta, dout, out)
    assert outside(delta_buffer, delta.shape).isnan().all(), "D written past its rows"
    if zero_dq_accum:
        assert (dq_accum == 0).all(), f"{(dq_accum != 0).sum().item()} elements of dQaccum not zeroed"
    else:
        assert dq_accum.isnan().all(), "dQaccum written although not given"
    assert outside(accum_buffer, accum_shape).isnan().all(), "dQaccum written past its rows or head dim"


@pytest.mark.parametrize("head_dim", [64, 128, 72])
@pytest.mark.parametrize("seqlen,rows", [(1, 64), (113, 128), (128, 128), (300, 384), (37, 37)])
def test_preprocess_pads_d_and_writes_lse_log2(head_dim, seqlen, rows):
    """With the LSE given, D and LSE * log2(e) come out with ``rows`` rows, as the Hopper backward reads whole Q
    tiles of them: past seqlen_q D = 0 and LSE * log2(e) = +inf; within, LSE * log2(e) bitwise as torch computes
    it, +inf for a row that saw no key (LSE = -inf), +inf and NaN kept."""
    batch, nheads = 2, 3
    out, dout = packed_pair(batch, seqlen, nheads, head_dim, torch.bfloat16)
    lse = torch.randn(batch, nheads, seqlen, device="cuda") * 20
    lse[0, 0, :4] = torch.tensor([-math.inf, math.inf, math.nan, 0.0])[:seqlen]
    delta_buffer, delta = poisoned_view((batch, nheads, rows), (1, 1, 0))
    lse2_buffer, lse_log2 = poisoned_view((batch, nheads, rows), (1, 1, 0))
    dq_accum = torch.full(out.shape, torch.nan, device="cuda")
    launch_bwd_preprocess(dout, out, delta, dq_accum, lse, lse_log2)
    torch.cuda.synchronize()
    check_delta(delta[..., :seqlen], dout, out)
    assert (delta[..., seqlen:] == 0).all(), "D not zero past seqlen_q"
    expected = torch.full((batch, nheads, rows), math.inf, device="cuda")
    expected[..., :seqlen] = torch.where(lse == -math.inf, math.inf, lse * math.log2(math.e))
    assert torch.equal(lse_log2.isnan(), expected.isnan())
    assert torch.equal(lse_log2.nan_to_num(nan=7.0), expected.nan_to_num(nan=7.0))
    assert (dq_accum == 0).all()
    for buffer in (delta_buffer, lse2_buffer):
        assert outside(buffer, delta.shape).isnan().all(), "written past the rows given"


@pytest.mark.parametrize("lse_log2", [False, True], ids=["lse", "lse_log2"])
@pytest.mark.parametrize("with_dlse", [False, True], ids=["", "dlse"])
@pytest.mark.parametrize("seqlen", [1, 113])
def test_preprocess_takes_the_lse_gradient_and_gives_the_sinks_rows(lse_log2, with_dlse, seqlen):
    """D less dLSE (given), and each row's share of its head's sink gradient, -exp(sink - LSE) * D, 0 where that
    probability is NaN or +inf (LSE = -inf with a sink of -inf, or LSE = NaN); the Hopper backward's padded rows as
    without (D = 0 past seqlen_q)."""
    batch, nheads, head_dim = 2, 3, 64
    out, dout = packed_pair(batch, seqlen, nheads, head_dim, torch.bfloat16)
    lse = torch.randn(batch, nheads, seqlen, device="cuda") * 4
    sink = torch.tensor([0.5, -math.inf, 2.0], device="cuda")
    lse[:, 1, 0] = -math.inf  # a row that saw no key, its head's sink -inf: p = NaN, counted 0
    lse[0, 2, 0] = math.nan
    grad = torch.randn(batch, seqlen, nheads, device="cuda").transpose(1, 2) if with_dlse else None  # any layout
    rows = -(-seqlen // 64) * 64 if lse_log2 else seqlen
    delta = torch.full((batch, nheads, rows), math.nan, device="cuda")
    lse2 = torch.full_like(delta, math.nan) if lse_log2 else None
    sink_rows = launch_bwd_preprocess(dout, out, delta, None, lse, lse2, grad, sink)
    torch.cuda.synchronize()
    d = (dout.float() * out.float()).sum(-1).transpose(1, 2) - (0 if grad is None else grad)
    torch.testing.assert_close(delta[..., :seqlen], d, rtol=1e-4, atol=1e-4)
    assert (delta[..., seqlen:] == 0).all()
    p = torch.exp(sink[:, None] - lse).nan_to_num(nan=0.0, posinf=0.0)
    assert sink_rows.shape == lse.shape and sink_rows.dtype == torch.float32
    torch.testing.assert_close(sink_rows, -p * delta[..., :seqlen], rtol=1e-5, atol=1e-6)
    assert (sink_rows[:, 1, 0] == 0).all() and sink_rows[0, 2, 0] == 0


def test_preprocess_grid_over_65535_heads():
    """batch x nheads x row blocks is one grid dimension, past the 65535 limit of the others."""
    out, dout = packed_pair(2, 3, 40000, 64, torch.bfloat16)
    delta = torch.full((2, 40000, 3), torch.nan, device="cuda")
    dq_accum = torch.full(out.shape, torch.nan, device="cuda")
    launch_bwd_preprocess(dout, out, delta, dq_accum)
    torch.cuda.synchronize()
    check_delta(delta, dout, out)
    assert (dq_accum == 0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("seqlen", SEQLENS)
def test_postprocess(dtype, head_dim, seqlen):
    batch, nheads, scale = 2, 3, head_dim**-0.5
    dq_accum = torch.randn(batch, seqlen, 2, nheads, head_dim, device="cuda").mul(10)[:, :, 1]  # strided view
    shape = (batch, seqlen, nheads, head_dim)
    dq_buffer = torch.full((batch, seqlen + 3, nheads + 1, head_dim + 8), torch.nan, device="cuda", dtype=dtype)
    dq = dq_buffer[:batch, :seqlen, :nheads, :head_dim]
    launch_bwd_postprocess(dq_accum, dq, scale)
    torch.cuda.synchronize()
    # one float32 multiply and one round-to-nearest-even conversion, as torch does them: bitwise equal
    assert torch.equal(dq, (dq_accum * scale).to(dtype))
    assert outside(dq_buffer, shape).isnan().all(), "dQ written past its rows or head dim"


def covered_rows(rows: int, cu_seqlens: list[int], used: list[int]) -> torch.Tensor:
    """Row r is sequence b's where cu_seqlens[b] <= r < cu_seqlens[b] + min(its span, used[b])."""
    mask = torch.zeros(rows, dtype=torch.bool, device="cuda")
    for b, n in enumerate(used):
        start = cu_seqlens[b]
        mask[start : start + max(min(cu_seqlens[b + 1] - start, n), 0)] = True
    return mask


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("seqused", [False, True], ids=["spans", "seqused"])
def test_rows_outside_every_sequence_are_zeroed(dtype, seqused):
    """dk's and dv's rows before cu_seqlens[0], between a sequence's seqused and the next one's start, and past
    cu_seqlens[-1] become 0; every sequence's rows keep their values. A warp's 32 rows straddle the edges; v's
    head dim is its own; 40 sequences, so the search takes several steps."""
    spans = [0, 31, 1, 97, 64, 0, 200, 33] * 5
    cu_seqlens = [7, *(7 + s for s in itertools.accumulate(spans))]
    used = [n - 9 if n > 40 else n + 5 for n in spans] if seqused else spans
    total = cu_seqlens[-1] + 70
    dk = torch.randn(total, 3, 64, device="cuda", dtype=dtype)
    dv = torch.randn(total, 3, 40, device="cuda", dtype=dtype)
    expected_k, expected_v = dk.clone(), dv.clone()
    keep = covered_rows(total, cu_seqlens, used)
    expected_k[~keep], expected_v[~keep] = 0, 0
    cu = torch.tensor(cu_seqlens, dtype=torch.int32, device="cuda")
    launch_zero_rows(dk, dv, cu, torch.tensor(used, dtype=torch.int32, device="cuda") if seqused else cu[1:])
    assert torch.equal(dk, expected_k) and torch.equal(dv, expected_v)
