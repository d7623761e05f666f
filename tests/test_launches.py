"""What each family's backward hands its kernels, on the CPU: the kernels (by config) in launch order and the
arguments each takes, in its order, with the compiled kernels left out. The GPU tests check what the kernels do
with them; these keep the host path, which runs at every call, checkable without a GPU."""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
import torch

from flashcute.kernels.common import prepost
from flashcute.kernels.common.bwd_pre import FlashAttentionBackwardPreprocess
from flashcute.kernels.common.prepost_config import bwd_post_config, bwd_pre_config
from flashcute.kernels.launch import DENSE
from flashcute.kernels.sm80 import family as sm80
from flashcute.kernels.sm80.config import bwd_config, dq_config
from flashcute.kernels.sm80.fwd import FlashAttentionForwardSm80
from flashcute.kernels.sm90 import family as sm90
from flashcute.kernels.sm90.bwd import FlashAttentionBackwardSm90
from flashcute.kernels.sm90.config import SHORT_QUERY_ROWS, sm90_bwd_config, sm90_fwd_config
from flashcute.kernels.sm90.fwd import FlashAttentionForwardSm90

BATCH, SEQLEN_Q, SEQLEN_K, NHEADS, NHEADS_K, HEAD_DIM = 2, 100, 70, 4, 2, 64
SCALE, DIAG, WINDOW = 0.125, SEQLEN_K - SEQLEN_Q, (-1, 0)


def parameters_taken(kernel_class) -> int:
    """How many arguments the compiled kernel of ``kernel_class`` takes: every parameter of its ``__call__`` but
    self and the stream (build.compile_kernel), given or None: it refuses a call with fewer."""
    return len(inspect.signature(kernel_class.__call__).parameters) - 2


def recorded_launches(monkeypatch, *modules) -> list:
    """(config, args) of every launch of ``modules`` and of the shared pre- and postprocess, in order."""
    launches = []

    def compiled(config, device, compile):
        return lambda *args: launches.append((config, args))

    def run_on_device(device, kernel, *args):
        kernel(*args)

    for patched in (*modules, prepost):
        monkeypatch.setattr(patched, "compiled", compiled)
        monkeypatch.setattr(patched, "run_on_device", run_on_device)
    return launches


def tensors(head_dim: int = HEAD_DIM):
    q = torch.randn(BATCH, SEQLEN_Q, NHEADS, head_dim, dtype=torch.bfloat16)
    k, v = (torch.randn(BATCH, SEQLEN_K, NHEADS_K, head_dim, dtype=torch.bfloat16) for _ in "kv")
    out, dout = torch.randn_like(q), torch.randn_like(q)
    return dout, q, k, v, out, torch.randn(BATCH, NHEADS, SEQLEN_Q)


@pytest.mark.parametrize(("softcap", "alibi"), [(0.0, False), (20.0, True)])
def test_hopper_backward_launches(monkeypatch, softcap, alibi):
    """The preprocess (D, dQaccum zeroed, LSE * log2(e), both padded to whole Q tiles), the Hopper kernel on q, k,
    v, dO, those statistics and dQaccum into dk and dv, then the postprocess into dq, which applies softmax_scale;
    the cap only where the config caps, the slopes as given, None for the counters of the deterministic order:
    every argument the compiled kernel takes."""
    launches = recorded_launches(monkeypatch, sm90)
    dout, q, k, v, out, lse = tensors()
    slopes = torch.rand(BATCH, NHEADS) if alibi else None
    dq, dk, dv, sink_rows = sm90.backward(dout, q, k, v, out, lse, SCALE, DIAG, *WINDOW, False, None, softcap, slopes)
    config = sm90_bwd_config(HEAD_DIM, "bfloat16", *WINDOW, softcap=softcap > 0, alibi=alibi)
    rows = math.ceil(SEQLEN_Q / config.block_m) * config.block_m
    assert [c for c, _ in launches[:2]] == [bwd_pre_config(HEAD_DIM, "bfloat16", lse_log2=True), config]
    (_, pre), (_, main) = launches[:2]
    delta = pre[2]
    assert pre[:2] == (out, dout) and pre[4] is lse and pre[6:] == (None, None, None) and sink_rows is None
    assert len(pre) == parameters_taken(FlashAttentionBackwardPreprocess)
    assert delta.shape == pre[5].shape == (BATCH, NHEADS, rows) and delta.dtype == pre[5].dtype == torch.float32
    dq_accum = pre[3]
    assert dq_accum.shape == q.shape and dq_accum.dtype == torch.float32 and dq_accum.is_contiguous()
    assert main[:4] == (q, k, v, dout) and main[4] is pre[5] and main[5] is delta and main[6] is dq_accum
    assert main[7] is dk and main[8] is dv and dk.shape == k.shape and dv.shape == v.shape
    assert main[9:] == (SCALE, DIAG, *WINDOW, *DENSE, softcap if softcap else None, slopes, None)
    assert len(main) == parameters_taken(FlashAttentionBackwardSm90)
    post_config, post = launches[2]
    assert len(launches) == 3 and post_config == bwd_post_config(HEAD_DIM, "bfloat16")
    assert post[0] is dq_accum and post[1] is dq and post[2] == SCALE and dq.shape == q.shape


@pytest.mark.parametrize("head_dim", [64, 256])
def test_deterministic_hopper_backward_takes_zeroed_q_tile_counters(monkeypatch, head_dim):
    """The deterministic Hopper backward: the same launches, its kernel's config deterministic, and behind every
    optional argument (None where not given) an int32 counter per (batch, head, Q tile), zeroed; Q tiles of 128
    rows at D=64, of 64 at D=256 (queries as rows)."""
    launches = recorded_launches(monkeypatch, sm90)
    dout, q, k, v, out, lse = tensors(head_dim)
    sm90.backward(dout, q, k, v, out, lse, SCALE, DIAG, *WINDOW, True)
    config = sm90_bwd_config(head_dim, "bfloat16", *WINDOW, deterministic=True)
    assert config.block_m == (128 if head_dim == 64 else 64)
    assert [c for c, _ in launches] == [
        bwd_pre_config(head_dim, "bfloat16", lse_log2=True),
        config,
        bwd_post_config(head_dim, "bfloat16"),
    ]
    main = launches[1][1]
    assert main[9:-1] == (SCALE, DIAG, *WINDOW, *DENSE, None, None)
    counters = main[-1]
    assert counters.shape == (BATCH, NHEADS, math.ceil(SEQLEN_Q / config.block_m)) and counters.dtype == torch.int32
    assert not counters.any()
    assert len(main) == parameters_taken(FlashAttentionBackwardSm90)


@pytest.mark.parametrize("deterministic", [False, True])
def test_mma_sync_backward_launches(monkeypatch, deterministic):
    """The preprocess (D, and dQaccum zeroed unless deterministic), the dK/dV kernel, then either the postprocess
    from dQaccum at softmax_scale or the dQ kernel straight into dq."""
    launches = recorded_launches(monkeypatch, sm80)
    dout, q, k, v, out, lse = tensors()
    dq, dk, dv, sink_rows = sm80.backward(dout, q, k, v, out, lse, SCALE, DIAG, *WINDOW, deterministic)
    config = bwd_config(HEAD_DIM, "bfloat16", *WINDOW, deterministic=deterministic)
    pre_config = bwd_pre_config(HEAD_DIM, "bfloat16", clear_dq_accum=not deterministic)
    last = dq_config(HEAD_DIM, "bfloat16", *WINDOW) if deterministic else bwd_post_config(HEAD_DIM, "bfloat16")
    assert [c for c, _ in launches] == [pre_config, config, last]
    (_, pre), (_, main), (_, after) = launches
    dq_accum, delta = pre[3], pre[2]
    assert pre[:2] == (out, dout) and delta.shape == (BATCH, NHEADS, SEQLEN_Q) and sink_rows is None
    assert pre[4:] == (None,) * 5 and len(pre) == parameters_taken(FlashAttentionBackwardPreprocess)
    assert (dq_accum is None) == deterministic
    assert main[:9] == (q, k, v, dout, lse, delta, dq_accum, dk, dv)
    assert main[9:] == (SCALE, DIAG, *WINDOW, *DENSE, None, None)
    if deterministic:
        assert after[:7] == (q, k, v, dout, lse, delta, dq) and after[7:] == main[9:]
    else:
        assert after == (dq_accum, dq, SCALE)


@pytest.mark.parametrize("family", [sm80, sm90], ids=["sm80", "sm90"])
@pytest.mark.parametrize("dlse", [False, True], ids=["", "dlse"])
def test_backward_preprocess_takes_sinks_and_the_lse_gradient(monkeypatch, family, dlse):
    """With learnable sinks the preprocess takes the LSE, the sinks and a float32 tensor shaped like the LSE, its
    rows of their gradient, which the backward returns; the LSE's gradient (any layout autograd made) goes in as
    float32 with a unit last stride; each only where given."""
    launches = recorded_launches(monkeypatch, family)
    dout, q, k, v, out, lse = tensors()
    sink = torch.randn(NHEADS)
    grad = torch.randn(BATCH, SEQLEN_Q, NHEADS).transpose(1, 2) if dlse else None  # a last stride of NHEADS
    *_, sink_rows = family.backward(dout, q, k, v, out, lse, SCALE, DIAG, *WINDOW, False, dlse=grad, sink=sink)
    pre_config, pre = launches[0]
    assert pre_config.sink and pre_config.dlse == dlse and pre_config.lse_log2 == (family is sm90)
    assert pre[4] is lse and pre[7] is sink and pre[8] is sink_rows
    assert sink_rows.shape == lse.shape and sink_rows.dtype == torch.float32
    if dlse:
        assert pre[6].stride(-1) == 1 and pre[6].dtype == torch.float32 and torch.equal(pre[6], grad)
    else:
        assert pre[6] is None
    assert len(pre) == parameters_taken(FlashAttentionBackwardPreprocess)


def test_sink_grad_sums_the_rows_over_batch_and_rows():
    rows = torch.randn(3, 4, 5)
    dsink = prepost.sink_grad(rows, torch.bfloat16)
    assert dsink.dtype == torch.bfloat16 and torch.equal(dsink, rows.sum(dim=(0, 2)).to(torch.bfloat16))


@pytest.fixture
def recorded_forward_launches(monkeypatch):
    """recorded_launches of both families' forwards, on the CPU: the Hopper forward's tile counter a CPU tensor,
    the mma.sync forward's configs those of an sm_80 device."""
    monkeypatch.setattr(sm90, "tile_counter", lambda device: torch.zeros(2, dtype=torch.int32))
    monkeypatch.setattr(sm80, "device_arch", lambda device: "sm_80")
    return recorded_launches(monkeypatch, sm90, sm80)


@pytest.mark.parametrize("family", ["sm80", "sm90"])
@pytest.mark.parametrize("variant", ["dense", "capped", "paged"])
def test_forward_launches_pass_every_argument_the_kernel_takes(recorded_forward_launches, family, variant):
    """Every forward launch passes as many arguments as the compiled kernel takes (it refuses a call with fewer),
    None for each optional one the config leaves out: a dense call, a capped one with sinks, and (the Hopper
    forward) a packed read of a paged cache, whose block table, page size and sequence span come last."""
    if variant == "paged" and family == "sm80":
        pytest.skip("the mma.sync forward reads no pages")
    _, q, k, v, out, lse = tensors()
    cpu, module = torch.device("cpu"), sm90 if family == "sm90" else sm80
    options = {"softcap": True, "sink": True} if variant == "capped" else {}
    if variant == "paged":
        options = {"packed": True, "page_size": 16}
    if family == "sm90":
        options["grid"] = 132
    launch = module.forward_launcher(cpu, "bfloat16", HEAD_DIM, *WINDOW, **options)
    call = {"softcap": 30.0, "sink": torch.zeros(NHEADS)} if variant == "capped" else {}
    packed_args = DENSE
    if variant == "paged":
        table = torch.zeros(BATCH, 4, dtype=torch.int32)
        packed_args = (torch.zeros(BATCH + 1, dtype=torch.int32),) * 2 + (torch.zeros(BATCH, dtype=torch.int32),) * 2
        packed_args += (SEQLEN_Q, SEQLEN_K)
        call["pages"] = (table, 16, 64)
    launch(q, k, v, out, lse, SCALE, DIAG, packed_args, **call)
    ((_, args),) = recorded_forward_launches
    kernel_class = FlashAttentionForwardSm90 if family == "sm90" else FlashAttentionForwardSm80
    assert len(args) == parameters_taken(kernel_class)
    if variant == "paged":
        assert args[-3:] == call["pages"]
    if variant == "capped":
        assert any(a is call["sink"] for a in args) and 30.0 in [a for a in args if isinstance(a, float)]


@pytest.mark.parametrize("page_size", [0, 16])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)])
def test_packed_forward_takes_short_query_tiles_where_every_sequence_fits_one_warpgroup(
    recorded_forward_launches, window, page_size
):
    """A packed Hopper launch without a mask whose max_seqlen_q is at most SHORT_QUERY_ROWS (decoding's split-KV
    walks) runs the 64-row tiles, and one more row runs the heuristic's; under a mask both run the heuristic's."""
    _, q, k, v, out, lse = tensors()
    options = {"packed": True, "grid": 132, "page_size": page_size}
    launch = sm90.forward_launcher(torch.device("cpu"), "bfloat16", HEAD_DIM, *window, **options)
    call = {"pages": (torch.zeros(BATCH, 4, dtype=torch.int32), 16, 64)} if page_size else {}
    sequences = (torch.zeros(BATCH + 1, dtype=torch.int32),) * 2 + (torch.zeros(BATCH, dtype=torch.int32),) * 2
    for max_seqlen_q in (SHORT_QUERY_ROWS, SHORT_QUERY_ROWS + 1, 1):
        launch(q, k, v, out, lse, SCALE, DIAG, (*sequences, max_seqlen_q, SEQLEN_K), **call)
    heuristic = sm90_fwd_config(HEAD_DIM, "bfloat16", *window, packed=True, page_size=page_size)
    rows = [config.block_m for config, _ in recorded_forward_launches]
    short = SHORT_QUERY_ROWS if window == (-1, -1) else heuristic.block_m
    assert heuristic.block_m > SHORT_QUERY_ROWS and rows == [short, heuristic.block_m, short]
    assert {dataclasses.replace(c, block_m=heuristic.block_m) for c, _ in recorded_forward_launches} == {heuristic}
