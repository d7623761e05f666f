"""flashcute.bench on the CPU: FLOP counts, the grid and its flags, the packed variable-length case, the decoding
case, the sweep's bookkeeping (timing faked), the correctness check, reports, JSON, --compare, plots, and the command
without a GPU."""

import argparse
import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
from functools import partial
from types import SimpleNamespace

import pytest
import torch

import flashcute
from flashcute.bench import backends as bench_backends
from flashcute.bench import cli, graphs, inputs, runner
from flashcute.bench.backends import Backend, flashcute_backend, registry, select_backends
from flashcute.bench.check import Checker, make_reference
from flashcute.bench.flops import attention_flops
from flashcute.bench.grid import (
    DECODE,
    FULL,
    VARLEN,
    DecodePoint,
    DecodeSpec,
    GridSpec,
    Shape,
    VarlenSpec,
    group_label,
    make_grid,
    packed_lengths,
)
from flashcute.bench.inputs import block_table, make_inputs, rotation_count
from flashcute.bench.passes import make_step
from flashcute.bench.plot import write_plots
from flashcute.bench.report import DECODE_NOTE, PACKED_NOTE, compare, group_table, render, speedup
from flashcute.bench.results import Results, Row, flashcute_kernel
from flashcute.bench.runner import Settings, classify, sweep
from flashcute.reference import attention_ref, attention_same_precision
from tests.helpers import time_on_the_cpu

SHAPE = Shape(dtype="bf16", headdim=128, causal=False, seqlen=4096, batch=4, nheads=16)
PACKED = Shape(dtype="bf16", headdim=32, causal=True, seqlen=48, batch=3, nheads=2, lengths=(16, 48, 32))
DECODE_SHAPE = Shape("bf16", 128, False, seqlen=32768, batch=8, nheads=32, seqlen_q=1, nheads_k=8)
PAGED = Shape("bf16", 128, False, seqlen=32768, batch=8, nheads=32, seqlen_q=1, nheads_k=8, page_size=64)
PLAIN = (0.0, False, False)
"""Shape.scores without a score variant: no softcap, no sink, no ALiBi."""
PLAIN_VARIANTS = (*PLAIN, None)
"""Shape.variants of plain attention: no score variant, and v as wide as q and k."""


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


# ---- FLOPs and the grid ------------------------------------------------------------------------------------------


def test_flops_convention():
    fwd = attention_flops(2, 16, 4096, 4096, 128, causal=False)
    assert fwd == 4 * 2 * 16 * 4096 * 4096 * 128
    assert attention_flops(2, 16, 4096, 4096, 128, causal=True) == fwd / 2
    assert attention_flops(2, 16, 4096, 4096, 128, causal=False, pass_="bwd") == 2.5 * fwd
    assert attention_flops(2, 16, 4096, 4096, 128, causal=False, pass_="fwd+bwd") == 3.5 * fwd
    # bottom-right causal with seqlen_q != seqlen_k counts the area under the shifted diagonal
    assert attention_flops(1, 1, 1, 1000, 1, causal=True) == 4 * 999.5
    assert attention_flops(1, 1, 1000, 10, 1, causal=True) == 4 * 50


def test_default_grid_follows_design():
    shapes = make_grid(FULL)
    assert len(shapes) == 2 * 3 * 2 * 5
    assert all(s.batch * s.seqlen == 16384 and s.nheads * s.headdim == 2048 for s in shapes)
    firsts = {}
    for s in shapes:
        firsts.setdefault(s.group, s)
    assert len(firsts) == 12 and all(s.seqlen == 1024 for s in firsts.values())


def test_flags_narrow_and_override_the_grid():
    args = parse("--dtype", "fp16", "--headdim", "128", "--causal", "yes", "--seqlen", "4k,2k", "--batch", "3")
    shapes = make_grid(cli.grid_spec(args))
    assert [(s.dtype, s.headdim, s.causal, s.seqlen, s.batch, s.nheads) for s in shapes] == [
        ("fp16", 128, True, 2048, 3, 16),
        ("fp16", 128, True, 4096, 3, 16),
    ]


def test_quick_grid_and_timing():
    args = parse("--quick", "--headdim", "256")
    spec = cli.grid_spec(args)
    assert spec.dtypes == ("bf16",) and spec.headdims == (256,) and spec.batch == 2
    assert cli.settings(args) == Settings(warmup_ms=5.0, rep_ms=20.0)
    assert cli.settings(parse("--pass", "bwd", "--repeats", "50", "--no-check")) == Settings("bwd", 25.0, 50.0, False)


def test_varlen_grid_packs_seeded_lengths_beside_a_dense_batch_of_as_many_tokens():
    shapes = make_grid(VARLEN)
    assert [(s.causal, s.packed) for s in shapes] == [(False, True), (False, False), (True, True), (True, False)]
    assert all((s.dtype, s.headdim, s.nheads, s.tokens) == ("bf16", 128, 16, 65536) for s in shapes)
    packed, dense = shapes[:2]
    assert (dense.batch, dense.seqlen, dense.lengths) == (16, 4096, ())
    lengths = packed.lengths
    assert sum(lengths) == 65536 and all(256 <= n <= 8192 for n in lengths[:-1]) and 0 < lengths[-1] <= 8192
    assert (packed.batch, packed.seqlen) == (len(lengths), max(lengths))
    # one draw of random.Random(0), the same in every group and every run
    assert shapes[2].lengths == lengths == packed_lengths(65536, 256, 8192, seed=0)
    assert lengths[:3] == (7173, 3411, 6465) and packed_lengths(65536, 256, 8192, seed=1) != lengths


def test_varlen_flags_quick_and_refusals(capsys):
    packed, dense = make_grid(cli.grid_spec(parse("--varlen", "--quick", "--causal", "yes", "--nheads", "8")))
    assert sum(packed.lengths) == 4096 and all(64 <= n <= 1024 for n in packed.lengths[:-1])
    assert (dense.batch, dense.seqlen, dense.packed) == (4, 1024, False)
    assert all(s.causal and s.nheads == 8 for s in (packed, dense))
    assert cli.settings(parse("--varlen", "--quick")) == Settings(warmup_ms=5.0, rep_ms=20.0)
    # checked before the GPU: the answer is the same on any machine
    assert cli.main(["--varlen", "--batch", "8"]) == 2
    assert "drop --seqlen and --batch" in capsys.readouterr().err


def test_packed_flops_are_counted_per_sequence():
    assert PACKED.flops("bwd") == sum(attention_flops(1, 2, n, n, 32, causal=True, pass_="bwd") for n in (16, 48, 32))
    equal = Shape("bf16", 32, True, 48, 3, 2, lengths=(48, 48, 48))
    assert equal.flops("fwd") == Shape("bf16", 32, True, 48, 3, 2).flops("fwd")  # as many as the dense batch
    assert PACKED.tokens == 96 and PACKED.label() == "bf16 · D=32 · causal · L=packed 16..48 B=3 (96 tokens) H=2"


@pytest.mark.parametrize(
    "flag", [("--dtype", "fp8"), ("--seqlen", "0"), ("--causal", "maybe"), ("--pass", "x"), ("--rounds", "0")]
)
def test_malformed_flags_are_argparse_errors(flag, capsys):
    with pytest.raises(SystemExit):
        parse(*flag)
    assert flag[1] in capsys.readouterr().err


def test_rotation_exceeds_l2():
    assert rotation_count(set_bytes=256 << 20, l2=50 << 20) == 2
    assert rotation_count(set_bytes=10 << 20, l2=50 << 20) == 6
    assert rotation_count(set_bytes=1 << 10, l2=50 << 20) == 32


def test_step_cycles_through_input_sets():
    shape = Shape("fp16", 8, False, 4, 1, 1)
    sets = [make_inputs(shape, with_grad=False, device="cpu") for _ in range(3)]
    seen = []
    step = make_step(lambda q, k, v: seen.append(q) or q, sets, "fwd")
    for _ in range(7):
        step()
    assert [next(i for i, s in enumerate(sets) if s.q is q) for q in seen] == [0, 1, 2, 0, 1, 2, 0]


# ---- backends and the sweep (timing faked, CPU tensors) ------------------------------------------------------------


def test_unknown_backend_is_reported_not_fatal():
    backends, skipped = select_backends("sdpa-flash,bogus")
    assert [b.name for b in backends] == ["sdpa-flash", "bogus"] and skipped == {}
    assert "unknown backend" in backends[1].supports(SHAPE, "fwd")
    rows = list(sweep(make_grid(GridSpec(seqlens=(1024, 2048))), backends[1:], Settings()))
    assert len(rows) == 24 and {(r.status, r.reason.split(";")[0]) for r in rows} == {
        ("unsupported", "unknown backend")
    }


def test_the_sweep_frees_memory_after_each_shape_that_ran(cpu_clock, monkeypatch):
    collected = []
    monkeypatch.setattr(runner.gc, "collect", lambda: collected.append(1))
    shapes = make_grid(
        GridSpec(dtypes=("bf16",), headdims=(32,), causals=(False,), seqlens=(64, 128), batch=1, nheads=2)
    )
    runs = _attention_backend("spec")
    rows = list(sweep(shapes, [runs, select_backends("bogus")[0][0]], Settings(check=False)))
    assert [r.status for r in rows] == ["ok", "unsupported"] * len(shapes) and len(collected) == len(shapes)
    collected.clear()
    assert {r.status for r in sweep(shapes, select_backends("bogus")[0], Settings())} == {"unsupported"}
    assert collected == []  # (no inputs were made)


def test_default_selection_skips_what_is_missing():
    backends, skipped = select_backends(None)
    names = [b.name for b in backends]
    assert {"sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math"} <= set(names)
    assert set(skipped).isdisjoint(names)
    if not torch.cuda.is_available():
        assert "flashcute" in skipped


def test_math_sdpa_only_on_small_sizes():
    math_sdpa = select_backends("sdpa-math")[0][0]
    assert math_sdpa.supports(Shape("bf16", 128, False, 1024, 16, 16), "fwd") is None
    assert "GiB" in math_sdpa.supports(Shape("bf16", 128, False, 16384, 1, 16), "fwd")


def test_sdpa_and_flex_refuse_packed_batches_fa4_takes_them():
    known = registry()
    for name in ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math", "flex"):
        assert known[name].supports(PACKED, "fwd").startswith("no packed variable-length batches:"), name
        assert known[name].supports(Shape("bf16", 32, True, 48, 3, 2), "fwd") is None, name
    assert known["fa4"].supports(PACKED, "fwd+bwd") is None


def varlen_same_precision(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, kernel=None):
    """flash_attn_varlen_func on the CPU: attention_same_precision sequence by sequence."""
    lengths = cu_seqlens_q.diff().tolist()
    assert cu_seqlens_q.dtype == torch.int32 and torch.equal(cu_seqlens_q, cu_seqlens_k) and sum(lengths) == len(q)
    assert max_seqlen_q == max_seqlen_k == max(lengths)
    parts = zip(*(t.split(lengths) for t in (q, k, v)), strict=True)
    return torch.cat([attention_same_precision(qs[None], ks[None], vs[None], causal=causal)[0] for qs, ks, vs in parts])


def kvcache_same_precision(q, k_cache, v_cache, cache_seqlens, block_table=None, causal=False, kernel=None):
    """flash_attn_with_kvcache on the CPU over a full cache: a paged one's pages gathered sequence by sequence, page
    by page, then attention_same_precision."""
    if block_table is not None:
        k_cache, v_cache = (
            torch.stack([torch.cat([t[page] for page in row]) for row in block_table]) for t in (k_cache, v_cache)
        )
    assert cache_seqlens == k_cache.shape[1]
    return attention_same_precision(q, k_cache, v_cache, causal=causal)


def stand_in_flashcute(
    last_sequence_scale: float = 1.0, calls: list | None = None, pages_in_order: bool = False
) -> SimpleNamespace:
    """flashcute's three entry points on the CPU (flash_attn_func with its score variants), each call's name and
    keyword arguments appended to ``calls``; the varlen one's last sequence scaled by ``last_sequence_scale``; the
    cache one reading a paged cache's pages in their order in memory rather than the block table's if
    ``pages_in_order``."""
    calls = [] if calls is None else calls

    def flash_attn_func(q, k, v, causal, kernel, softcap=0.0, deterministic=False, **scores):
        mode = {"deterministic": True} if deterministic else {}
        calls.append(("flash_attn_func", {"causal": causal, "kernel": kernel, "softcap": softcap, **mode, **scores}))
        return attention_same_precision(q, k, v, causal=causal, softcap=softcap, **scores)

    def flash_attn_varlen_func(q, k, v, **kwargs):
        calls.append(("flash_attn_varlen_func", kwargs))
        out = varlen_same_precision(q, k, v, **kwargs)
        last = int(kwargs["cu_seqlens_q"][-2])
        return torch.cat([out[:last], out[last:] * last_sequence_scale])

    def flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs):
        calls.append(("flash_attn_with_kvcache", kwargs))
        table = kwargs["block_table"]
        if pages_in_order and table is not None:
            kwargs = {**kwargs, "block_table": torch.arange(table.numel(), dtype=table.dtype).view(table.shape)}
        return kvcache_same_precision(q, k_cache, v_cache, **kwargs)

    return SimpleNamespace(
        flash_attn_func=flash_attn_func,
        flash_attn_varlen_func=flash_attn_varlen_func,
        flash_attn_with_kvcache=flash_attn_with_kvcache,
    )


def test_flashcute_backend_runs_packed_shapes_through_the_varlen_entry(cpu_clock):
    calls: list[tuple[str, dict]] = []
    backend = flashcute_backend("flashcute-sm80", stand_in_flashcute(calls=calls), "sm80")
    assert backend.supports(PACKED, "fwd+bwd") is None
    for shape in (PACKED, Shape("bf16", 32, True, 48, 2, 2)):
        x = make_inputs(shape, with_grad=False, device="cpu")
        assert backend.build(shape)(x.q, x.k, x.v).shape == x.q.shape
    (varlen, kwargs), dense = calls
    assert varlen == "flash_attn_varlen_func" and kwargs["cu_seqlens_q"].tolist() == [0, 16, 64, 96]
    assert (kwargs["max_seqlen_q"], kwargs["causal"], kwargs["kernel"]) == (48, True, "sm80")
    assert dense == ("flash_attn_func", {"causal": True, "kernel": "sm80", "softcap": 0.0})


def test_softcap_grid_backends_and_check(cpu_clock, capsys):
    """--softcap crosses the dense grid with caps, each cap a group of its own; flashcute passes it on, SDPA says it
    cannot cap, flex caps through a score_mod; the check holds each backend to the capped reference."""
    shapes = make_grid(cli.grid_spec(parse("--quick", "--headdim", "32", "--causal", "yes", "--softcap", "0,30")))
    assert [(s.softcap, s.seqlen) for s in shapes] == [(0.0, 512), (0.0, 1024), (30.0, 512), (30.0, 1024)]
    assert group_label(shapes[2].group) == "bf16 · D=32 · causal · softcap 30"
    assert group_label(shapes[0].group) == "bf16 · D=32 · causal"
    known = registry()
    capped = Shape("bf16", 32, True, 48, 2, 2, softcap=2.0)
    for name in ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math"):
        assert known[name].supports(capped, "fwd").startswith("no softcap:"), name
    assert known["flex"].supports(capped, "fwd") is None and known["fa4"].supports(capped, "fwd") is None
    calls: list[tuple[str, dict]] = []
    good = flashcute_backend("flashcute-sm80", stand_in_flashcute(calls=calls), "sm80")
    uncapped = dataclasses.replace(
        good, name="ignores-softcap", build=lambda shape: good.build(Shape("bf16", 32, True, 48, 2, 2))
    )
    rows = {r.backend: r for r in sweep([capped], [good, uncapped], Settings())}
    assert calls[0] == ("flash_attn_func", {"causal": True, "kernel": "sm80", "softcap": 2.0})
    assert rows["flashcute-sm80"].status == "ok" and rows["ignores-softcap"].status == "wrong"
    # checked before the GPU: the answer is the same on any machine
    assert cli.main(["--varlen", "--softcap", "30"]) == 2
    assert "--softcap applies to the dense grid" in capsys.readouterr().err


def _attention_backend(name: str, scale: float = 1.0, detach: bool = False) -> Backend:
    def build(shape: Shape):
        def attention(q, k, v):
            if detach:
                q, k, v = q.detach(), k.detach(), v.detach()
            return attention_same_precision(q, k, v, causal=shape.causal) * scale

        return attention

    return Backend(name, build)


def _failing_backend(name: str, exc: Exception) -> Backend:
    def build(shape: Shape):
        raise exc

    return Backend(name, build)


@pytest.fixture
def cpu_clock(monkeypatch):
    """The sweep with CPU inputs (packed shapes' sequence bounds too) and fake clocks: every timed row takes 1 ms."""
    monkeypatch.setattr(runner, "make_rotation", lambda shape, with_grad: [make_inputs(shape, with_grad, "cpu")])
    monkeypatch.setattr(runner, "wall_ms", lambda call: (5.0, call()))
    for name in ("cu_seqlens", "block_table", "bottom_right_causal_mask"):
        monkeypatch.setattr(bench_backends, name, partial(getattr(inputs, name), device="cpu"))

    def one_ms(step, warmup_ms, rep_ms):
        step()
        return 1.0

    monkeypatch.setattr(runner, "gpu_time_ms", one_ms)


@pytest.fixture
def cpu_sweep(cpu_clock):
    """A group of two dense shapes swept on the CPU (`cpu_clock`); rows by (backend, seqlen)."""
    shapes = make_grid(
        GridSpec(dtypes=("bf16",), headdims=(32,), causals=(True,), seqlens=(64, 128), batch=2, nheads=3)
    )
    return lambda backends, pass_: {(r.backend, r.shape.seqlen): r for r in sweep(shapes, backends, Settings(pass_))}


def test_sweep_checks_once_per_group_and_records_failures(cpu_sweep):
    backends = [
        _attention_backend("flashcute-good"),
        _attention_backend("flashcute-bad", scale=1.1),
        _failing_backend("refuses", ValueError("headdim 32 not supported")),
        _failing_backend("crashes", RuntimeError("boom")),
    ]
    rows = cpu_sweep(backends, "fwd")
    good, bad = rows[("flashcute-good", 64)], rows[("flashcute-bad", 64)]
    assert good.status == "ok" and good.ms == 1.0 and good.first_call_ms == 5.0
    assert good.errors["out"]["max_abs"] <= good.errors["out"]["max_abs_budget"]
    assert rows[("flashcute-good", 128)].errors is None  # checked on the group's first shape only
    assert bad.status == "wrong" and "out max_abs" in bad.reason and bad.ms == 1.0
    assert rows[("flashcute-bad", 128)].status == "wrong"  # the verdict holds for the group
    assert rows[("refuses", 64)].status == "unsupported" and "headdim 32" in rows[("refuses", 64)].reason
    assert rows[("crashes", 128)].status == "failed" and rows[("crashes", 128)].reason == "RuntimeError: boom"


def test_sweep_backward_checks_gradients_and_reports_no_backward(cpu_sweep):
    rows = cpu_sweep([_attention_backend("flashcute-good"), _attention_backend("fwd-only", detach=True)], "fwd+bwd")
    good = rows[("flashcute-good", 64)]
    assert good.status == "ok" and set(good.errors) == {"out", "dq", "dk", "dv"}
    assert rows[("fwd-only", 64)].status == "unsupported" and rows[("fwd-only", 64)].reason.startswith("no backward")


def test_sweep_checks_packed_and_dense_shapes_of_a_group_apart(cpu_clock):
    spec = VarlenSpec(headdims=(32,), causals=(True,), tokens=96, min_len=8, max_len=48, dense_batch=2, nheads=2)
    backends = [
        flashcute_backend("flashcute-good", stand_in_flashcute(), "sm80"),
        flashcute_backend("flashcute-bad", stand_in_flashcute(last_sequence_scale=1.1), "sm80"),
        registry()["sdpa-math"],
    ]
    rows = {(r.backend, r.shape.packed): r for r in sweep(make_grid(spec), backends, Settings("fwd+bwd"))}
    good = rows[("flashcute-good", True)]
    assert good.status == "ok" and set(good.errors) == {"out", "dq", "dk", "dv"}
    assert rows[("flashcute-good", False)].errors is not None  # the dense entry point is checked on its own
    bad = rows[("flashcute-bad", True)]  # wrong in the last sequence only: the check samples it
    assert bad.status == "wrong" and "(checked at L=packed " in bad.reason and "out max_abs" in bad.reason
    assert rows[("flashcute-bad", False)].status == "ok"
    refused = rows[("sdpa-math", True)]
    assert refused.status == "unsupported" and refused.reason.startswith("no packed variable-length batches:")
    assert rows[("sdpa-math", False)].status == "ok"


def test_round_order_gives_every_item_every_predecessor():
    for n in range(1, 8):
        items = list(range(n))
        rounds = [runner.round_order(items, r) for r in range(n if n % 2 == 0 else 2 * n)]
        assert all(sorted(order) == items for order in rounds)
        pairs = [pair for order in rounds for pair in itertools.pairwise(order)]
        assert len(set(pairs)) == n * (n - 1)  # every ordered pair of neighbours occurs ...
        assert len(set(map(pairs.count, pairs))) <= 1  # ... equally often


def test_sweep_rounds_alternate_backends_and_keep_the_median(monkeypatch):
    calls: list[str] = []
    clocks = {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 9.0, 7.0]), "flaky": iter([4.0])}

    def backend(name: str) -> Backend:
        def build(shape: Shape):
            def attention(q, k, v):
                calls.append(name)
                if name == "flaky" and calls.count("flaky") > 2:
                    raise RuntimeError("lost the GPU")
                return attention_same_precision(q, k, v)

            return attention

        return Backend(name, build)

    def fake_clock(step, warmup_ms, rep_ms):
        step()
        return next(clocks[calls[-1]])

    monkeypatch.setattr(runner, "make_rotation", lambda shape, with_grad: [make_inputs(shape, with_grad, "cpu")])
    monkeypatch.setattr(runner, "gpu_time_ms", fake_clock)
    monkeypatch.setattr(runner, "wall_ms", lambda call: (5.0, call()))
    shape = Shape("bf16", 32, False, 64, 1, 2)
    rows = list(sweep([shape], [backend("a"), backend("b"), backend("flaky")], Settings(rounds=3, check=False)))
    assert [(r.backend, r.status, r.ms) for r in rows] == [("a", "ok", 2.0), ("b", "ok", 7.0), ("flaky", "ok", 4.0)]
    # each round kept, and their spread: (slowest - fastest) / median; none from the one round flaky finished
    assert [r.rounds_ms for r in rows] == [(3.0, 1.0, 2.0), (5.0, 9.0, 7.0), (4.0,)]
    assert [r.spread for r in rows] == [pytest.approx(1.0), pytest.approx(4 / 7), None]
    # first call and first timing per backend, then rounds 1 and 2 of runner.round_order: b flaky(fails) a,
    # flaky(fails) a b
    assert calls == ["a", "a", "b", "b", "flaky", "flaky", "b", "flaky", "a", "flaky", "a", "b"]
    assert cli.settings(parse("--rounds", "3")).rounds == 3


def test_check_fails_nan():
    shape = Shape("fp16", 16, False, 32, 1, 2)
    inputs = make_inputs(shape, with_grad=False, device="cpu")
    out = attention_same_precision(inputs.q, inputs.k, inputs.v)
    checker = Checker()
    checker.check("b", shape, inputs, {"out": out.index_fill(1, torch.tensor([3]), float("nan"))})
    assert "out max_abs nan" in checker.wrong("b", shape)


def test_classify_reads_sdpa_refusals():
    refused = RuntimeError("No available kernel. Aborting execution.")
    assert classify(refused, ["Flash attention requires head_dim <= 256\nmore", "x"]) == (
        "unsupported",
        "RuntimeError: No available kernel. Aborting execution. (Flash attention requires head_dim <= 256; x)",
    )
    assert classify(NotImplementedError("no sm90"), []) == ("unsupported", "NotImplementedError: no sm90")
    status, reason = classify(MemoryError("x" * 1000), [])
    assert status == "failed" and len(reason) == 400


# ---- learnable sinks and ALiBi -------------------------------------------------------------------------------------

SINK = Shape("bf16", 32, True, 64, 2, 3, sink=True)
ALIBI = Shape("bf16", 32, True, 64, 2, 3, alibi=True)


def test_sink_and_alibi_flags_cross_the_dense_grid_each_variant_a_group(capsys):
    """--sink and --alibi cross the dense grid with and without the variant, the plain grid first; with --softcap
    every combination is timed, each a group (table, plot) of its own."""
    grid = ("--quick", "--headdim", "32", "--causal", "yes")
    assert [(s.scores, s.seqlen) for s in make_grid(cli.grid_spec(parse(*grid)))] == [(PLAIN, 512), (PLAIN, 1024)]
    assert [(s.sink, s.alibi, s.seqlen) for s in make_grid(cli.grid_spec(parse(*grid, "--sink")))] == [
        (False, False, 512),
        (False, False, 1024),
        (True, False, 512),
        (True, False, 1024),
    ]
    assert [(s.sink, s.alibi) for s in make_grid(cli.grid_spec(parse(*grid, "--alibi")))[1::2]] == [
        (False, False),
        (False, True),
    ]
    crossed = make_grid(cli.grid_spec(parse(*grid, "--softcap", "0,30", "--sink", "--alibi")))
    groups = list(dict.fromkeys(s.group for s in crossed))
    assert len(crossed) == 16 and [group[3] for group in groups] == list(
        itertools.product((0.0, 30.0), (False, True), (False, True), (None,))
    )
    assert [group_label(group) for group in groups[1:4]] == [
        "bf16 · D=32 · causal · alibi",
        "bf16 · D=32 · causal · sink",
        "bf16 · D=32 · causal · sink · alibi",
    ]
    assert group_label(groups[-1]) == "bf16 · D=32 · causal · softcap 30 · sink · alibi"
    assert SINK.label() == "bf16 · D=32 · causal · sink · L=64 B=2 H=3" and SINK.size_label == "L=64"
    # checked before the GPU: the answer is the same on any machine
    for flags, why in [
        (("--varlen", "--sink"), "--sink applies to the dense grid; drop --varlen or --decode"),
        (("--decode", "--alibi"), "--alibi applies to the dense grid; drop --varlen or --decode"),
        (("--decode", "--softcap", "30", "--sink", "--alibi"), "--softcap, --sink and --alibi apply to the dense"),
    ]:
        assert cli.main(list(flags)) == 2
        assert why in capsys.readouterr().err


def test_sink_and_alibi_rows_round_trip_and_plot_apart(tmp_path):
    shapes = [SHAPE, dataclasses.replace(SHAPE, sink=True), dataclasses.replace(SHAPE, softcap=30.0, alibi=True)]
    rows = [Row("flashcute-sm90", shape, "fwd", "ok", ms=1.0) for shape in shapes]
    # the first with two rounds (a list in JSON, a tuple again once loaded)
    results = Results({"pass": "fwd"}, [dataclasses.replace(rows[0], rounds_ms=(1.0, 1.25)), *rows[1:]])
    results.save(tmp_path / "results.json")
    loaded = Results.load(tmp_path / "results.json")
    assert loaded == results and [row.shape.scores for row in loaded.rows] == [
        PLAIN,
        (0.0, True, False),
        (30.0, False, True),
    ]
    old_row = {k: v for k, v in results.rows[0].to_dict().items() if k not in ("sink", "alibi", "rounds_ms")}
    (tmp_path / "old.json").write_text(json.dumps({"meta": {}, "rows": [old_row]}))
    # saved before sinks, ALiBi and the rounds' times: plain, one reading
    assert Results.load(tmp_path / "old.json").rows == [dataclasses.replace(results.rows[0], rounds_ms=None)]
    text = render(results)
    assert (
        "## bf16 · D=128 · non-causal · sink\n" in text
        and "## bf16 · D=128 · non-causal · softcap 30 · alibi\n" in text
    )
    assert [path.name for path in write_plots(results, tmp_path)] == [
        "fwd_bf16_d128_noncausal.png",
        "fwd_bf16_d128_noncausal_sink.png",
        "fwd_bf16_d128_noncausal_softcap30_alibi.png",
    ]


def test_score_tensors_sink_logits_and_geometric_slopes():
    assert bench_backends.score_tensors(SHAPE, "cpu") == {}
    both = dataclasses.replace(SHAPE, sink=True, alibi=True)  # 16 heads
    made = bench_backends.score_tensors(both, "cpu")
    sink, slopes = made["learnable_sink"], made["alibi_slopes"]
    assert sink.dtype == slopes.dtype == torch.float32 and sink.shape == slopes.shape == (16,)
    assert not sink.requires_grad and not slopes.requires_grad
    assert torch.equal(sink, torch.linspace(-1.0, 1.0, 16).bfloat16().float())  # the same logits in bfloat16
    assert sink[0] == -1.0 and sink[-1] == 1.0 and bool((sink.diff() > 0).all())
    assert torch.equal(slopes, torch.tensor([2 ** (-8 * (h + 1) / 16) for h in range(16)], dtype=torch.float32))
    assert slopes[0] == 2**-0.5 and slopes[-1] == 2**-8
    trained = bench_backends.score_tensors(both, "cpu", requires_grad=True, sink_dtype=torch.bfloat16)
    assert trained["learnable_sink"].requires_grad and trained["learnable_sink"].dtype == torch.bfloat16
    assert torch.equal(trained["learnable_sink"].float(), sink) and not trained["alibi_slopes"].requires_grad


def test_what_each_backend_runs_of_sinks_and_alibi():
    """SDPA runs neither, flex ALiBi only, fa4 the sink only, flashcute both; each says why not."""
    known = registry()
    both = dataclasses.replace(SINK, alibi=True)
    for name in ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math"):
        assert known[name].supports(SINK, "fwd") == f"no learnable sink: {bench_backends.SDPA_SINK}", name
        assert known[name].supports(ALIBI, "fwd") == f"no ALiBi: {bench_backends.SDPA_ALIBI}", name
        assert known[name].supports(dataclasses.replace(SINK, sink=False), "fwd") is None, name
    assert known["flex"].supports(SINK, "fwd+bwd").startswith("no learnable sink: FlexAttention")
    assert known["flex"].supports(ALIBI, "fwd+bwd") is None
    assert known["fa4"].supports(SINK, "fwd+bwd") is None
    refused = "no ALiBi: flash-attn-4 takes no alibi_slopes"
    assert known["fa4"].supports(ALIBI, "fwd") == known["fa4"].supports(both, "fwd") == refused
    flashcute_sm80 = flashcute_backend("flashcute-sm80", stand_in_flashcute(), "sm80")
    assert flashcute_sm80.supports(both, "fwd+bwd") is None


@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_flex_score_mod_biases_as_the_reference_does(softcap):
    """flex's score_mod, applied by hand to the scores of a problem with fewer query rows than keys (the bias's
    offset), gives attention_ref's output with the same slopes and cap."""
    shape = Shape("fp16", 8, False, seqlen=7, batch=1, nheads=3, seqlen_q=4, softcap=softcap, alibi=True)
    assert bench_backends.flex_score_mod(dataclasses.replace(shape, softcap=0.0, alibi=False), "cpu") is None
    modified = bench_backends.flex_score_mod(shape, "cpu")
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, 3, 8, generator=generator, dtype=torch.float64) for n in (4, 7, 7))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * 8**-0.5
    heads, rows, keys = torch.arange(3)[:, None, None], torch.arange(4)[:, None], torch.arange(7)
    probs = torch.softmax(modified(scores, 0, heads, rows, keys), dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v)
    slopes = bench_backends.score_tensors(shape, "cpu")["alibi_slopes"]
    expected = attention_ref(q, k, v, softcap=softcap, alibi_slopes=slopes)
    assert torch.allclose(out, expected, atol=1e-6)
    biased = bench_backends.flex_score_mod(dataclasses.replace(shape, seqlen_q=None, seqlen=4), "cpu")
    assert not torch.allclose(modified(scores, 0, heads, rows, keys), biased(scores, 0, heads, rows, keys))


def _ignoring(backend: Backend, **plain) -> Backend:
    """``backend`` on the shape without the variants in ``plain`` (sink=False, alibi=False): the scores wrong."""
    return dataclasses.replace(
        backend,
        name=f"ignores-{'-'.join(plain)}",
        build=lambda shape: backend.build(dataclasses.replace(shape, **plain)),
    )


@pytest.mark.parametrize("pass_", ["fwd", "fwd+bwd"])
def test_the_check_holds_backends_to_the_sink_and_alibi_reference(cpu_clock, pass_):
    """flashcute gets the sink (requiring grad with a backward) and slopes and passes the check; a backend that
    drops either is wrong in that variant's groups only; SDPA's rows say it does not run them."""
    calls: list[tuple[str, dict]] = []
    good = flashcute_backend("flashcute-sm80", stand_in_flashcute(calls=calls), "sm80")
    other = flashcute_backend("flashcute-sm80", stand_in_flashcute(), "sm80")
    backends = [good, _ignoring(other, sink=False), _ignoring(other, alibi=False), registry()["sdpa-math"]]
    plain, both = dataclasses.replace(SINK, sink=False), dataclasses.replace(SINK, alibi=True)
    rows = {(r.backend, r.shape): r for r in sweep([plain, SINK, ALIBI, both], backends, Settings(pass_))}
    assert all(rows[("flashcute-sm80", s)].status == "ok" for s in (plain, SINK, ALIBI, both))
    assert set(rows[("flashcute-sm80", both)].errors) == ({"out"} if pass_ == "fwd" else {"out", "dq", "dk", "dv"})
    for name, wrong in [("ignores-sink", (SINK, both)), ("ignores-alibi", (ALIBI, both))]:
        assert [s for s in (plain, SINK, ALIBI, both) if rows[(name, s)].status == "wrong"] == list(wrong), name
        assert rows[(name, wrong[0])].reason.startswith("wrong (checked at L=64): out max_abs")
    assert rows[("sdpa-math", plain)].status == "ok"
    for shape, what in [(SINK, "learnable sink"), (ALIBI, "ALiBi"), (both, "ALiBi")]:
        assert rows[("sdpa-math", shape)].status == "unsupported"
        assert rows[("sdpa-math", shape)].reason.startswith(f"no {what}:")
    given = [kwargs for _, kwargs in calls if "learnable_sink" in kwargs or "alibi_slopes" in kwargs]
    sink, slopes = given[-1]["learnable_sink"], given[-1]["alibi_slopes"]  # of the last shape, both
    assert sink.tolist() == [-1.0, 0.0, 1.0] and sink.dtype == torch.float32
    assert sink.requires_grad == (pass_ != "fwd") and torch.equal(
        slopes, torch.tensor([2 ** (-8 * h / 3) for h in (1, 2, 3)])
    )
    assert all(kwargs["learnable_sink"] is sink for kwargs in given[-2:])  # made once, not in what is timed
    assert not any("learnable_sink" in kwargs or "alibi_slopes" in kwargs for _, kwargs in calls[:2])  # plain


def test_fa4_gets_a_bfloat16_sink_and_the_check_holds_it(cpu_clock, monkeypatch):
    """flash-attn-4 (a CPU stand-in here) gets the sink in bfloat16, which its releases before float32 sinks assert,
    with the same logits as flashcute; returning (out, lse) as some versions do."""
    given = []

    def flash_attn_func(q, k, v, causal, learnable_sink=None, softcap=0.0):
        given.append(learnable_sink)
        assert learnable_sink is None or learnable_sink.dtype == torch.bfloat16, "learnable_sink must be bfloat16"
        return attention_same_precision(q, k, v, causal=causal, learnable_sink=learnable_sink), None

    cute = SimpleNamespace(flash_attn_func=flash_attn_func)
    monkeypatch.setitem(sys.modules, "flash_attn", SimpleNamespace(cute=cute))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    fa4 = registry()["fa4"]
    rows = list(sweep([SINK], [fa4, _ignoring(fa4, sink=False)], Settings("fwd+bwd")))
    assert [(row.backend, row.status) for row in rows] == [("fa4", "ok"), ("ignores-sink", "wrong")]
    assert given[0].tolist() == [-1.0, 0.0, 1.0] and given[0].requires_grad


# ---- v's own head dim ----------------------------------------------------------------------------------------------

DEEPSEEK = Shape("bf16", 192, True, 64, 2, 3, headdim_v=128)
"""q and k of head dim 192, v of 128, as DeepSeek's attention reads them."""


def test_flops_with_v_head_dim():
    """2 B H Lq Lk (D + Dv) a forward, halved for causal; the backward 2.5 forwards; Dv = D: as before."""
    fwd = attention_flops(2, 16, 4096, 4096, 192, causal=False, headdim_v=128)
    assert fwd == 2 * 2 * 16 * 4096 * 4096 * (192 + 128)
    assert attention_flops(2, 16, 4096, 4096, 192, causal=True, headdim_v=128) == fwd / 2
    assert attention_flops(2, 16, 4096, 4096, 192, False, "bwd", headdim_v=128) == 2.5 * fwd
    assert attention_flops(2, 16, 4096, 4096, 192, False, "fwd+bwd", headdim_v=128) == 3.5 * fwd
    assert attention_flops(1, 1, 1, 1000, 128, causal=True, headdim_v=64) == 2 * 999.5 * (128 + 64)
    for pass_ in ("fwd", "bwd", "fwd+bwd"):
        plain = attention_flops(2, 16, 4096, 4096, 128, True, pass_)
        assert attention_flops(2, 16, 4096, 4096, 128, True, pass_, headdim_v=128) == plain
    assert DEEPSEEK.flops("fwd+bwd") == attention_flops(2, 3, 64, 64, 192, True, "fwd+bwd", headdim_v=128)
    packed = dataclasses.replace(PACKED, headdim_v=16)
    assert packed.flops("bwd") == sum(attention_flops(1, 2, n, n, 32, True, "bwd", headdim_v=16) for n in (16, 48, 32))


def test_headdim_v_flag_pairs_with_headdim():
    """--headdim-v pairs with --headdim in order, or one value serves every head dim; v as wide as q is the plain
    shape; the heads follow q's head dim."""
    args = parse("--dtype", "bf16", "--headdim", "192,128", "--headdim-v", "128,64", "--causal", "no", "--seqlen", "1k")
    assert cli.grid_spec(args).headdims_v == (128, 64) and cli.refusal(args) is None
    shapes = make_grid(cli.grid_spec(args))
    assert [(s.headdim, s.headdim_v, s.v_headdim, s.nheads) for s in shapes] == [(192, 128, 128, 10), (128, 64, 64, 16)]
    one = make_grid(cli.grid_spec(parse("--headdim", "192,256", "--headdim-v", "128", "--seqlen", "1k")))
    assert {(s.headdim, s.headdim_v) for s in one} == {(192, 128), (256, 128)}
    # a list paired with --headdim keeps its repeats; v as wide as q is the plain shape
    same = parse("--headdim", "64,128", "--headdim-v", "64,64")
    assert same.headdim_v == (64, 64)
    assert {(s.headdim, s.headdim_v) for s in make_grid(cli.grid_spec(same))} == {(64, None), (128, 64)}
    assert make_grid(cli.grid_spec(parse("--headdim-v", "64,128,256"))) == make_grid(FULL)
    assert parse().headdim_v is None and cli.grid_spec(parse()) == FULL
    # a head dim repeated to pair it with two v head dims: the pair and the plain shape in one run; repeated
    # without a list of --headdim-v it is one head dim
    both = parse("--dtype", "bf16", "--headdim", "192,192", "--headdim-v", "128,192", "--seqlen", "1k")
    both = make_grid(cli.grid_spec(both))
    assert [(s.headdim, s.headdim_v) for s in both if s.causal] == [(192, 128), (192, None)]
    assert cli.grid_spec(parse("--headdim", "128,128,64")).headdims == (128, 64)


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (("--headdim", "192,128", "--headdim-v", "128,64,32"), "--headdim-v gives 3 head dims for 2 of --headdim"),
        (("--headdim-v", "128,64"), "for 3 of --headdim (64,128,256); give one, or one per --headdim"),
        (("--varlen", "--headdim-v", "64"), "--headdim-v applies to the dense grid; drop --varlen or --decode"),
        (("--decode", "--sink", "--headdim-v", "64"), "--sink and --headdim-v apply to the dense grid"),
    ],
)
def test_headdim_v_refusals(flags, why, capsys):
    """Checked before the GPU: the answer is the same on any machine."""
    assert cli.main(list(flags)) == 2
    assert why in capsys.readouterr().err


def test_inputs_at_v_head_dim():
    """v, dout (and so out) at v's head dim, q and k at q's; bytes moved counted at each width."""
    x = make_inputs(DEEPSEEK, with_grad=True, device="cpu")
    assert [t.shape[-1] for t in (x.q, x.k, x.v, x.dout)] == [192, 192, 128, 128]
    assert {tuple(t.shape[:-1]) for t in (x.q, x.k, x.v, x.dout)} == {(2, 64, 3)}
    assert inputs.touched_bytes(x) == 2 * 2 * (2 * 64 * 3) * (192 + 192 + 128 + 128)
    plain = make_inputs(dataclasses.replace(DEEPSEEK, headdim_v=None), with_grad=False, device="cpu")
    assert plain.v.shape == plain.q.shape and inputs.touched_bytes(plain) == 4 * plain.q.nbytes
    assert DEEPSEEK.kv_bytes == 2 * 64 * 3 * (192 + 128) * 2


def test_labels_json_and_plots_name_the_head_dims(tmp_path):
    """Titles, row labels and plot names say d192v128 where v's head dim differs, and a row's JSON holds headdim_v
    only there; the plain grid's labels, JSON keys and metadata stay as they were."""
    assert group_label(DEEPSEEK.group) == "bf16 · d192v128 · causal" and DEEPSEEK.group[3] == (*PLAIN, 128)
    assert DEEPSEEK.label() == "bf16 · d192v128 · causal · L=64 B=2 H=3"
    assert group_label(SHAPE.group) == "bf16 · D=128 · non-causal"
    rows = [Row("fa4", SHAPE, "fwd", "ok", ms=1.0), Row("fa4", DEEPSEEK, "fwd", "ok", ms=1.0)]
    assert "headdim_v" not in rows[0].to_dict() and rows[1].to_dict()["headdim_v"] == 128
    results = Results({"pass": "fwd"}, rows)
    results.save(tmp_path / "results.json")
    assert Results.load(tmp_path / "results.json") == results
    assert "## bf16 · d192v128 · causal\n" in render(results) and "## bf16 · D=128 · non-causal\n" in render(results)
    names = [path.name for path in write_plots(results, tmp_path)]
    assert names == ["fwd_bf16_d128_noncausal.png", "fwd_bf16_d192v128_causal.png"]
    assert "headdims_v" not in cli.grid_meta(FULL)
    assert cli.grid_meta(cli.grid_spec(parse("--headdim-v", "64")))["headdims_v"] == (64,)
    assert all(s.headdim_v is None for s in make_grid(FULL))


def test_what_each_backend_runs_of_a_v_head_dim_apart():
    """SDPA's flash backend refuses v of another head dim than q's; the others try it (cuDNN refuses some pairs at
    the call, which the sweep reports)."""
    known = registry()
    assert known["sdpa-flash"].supports(DEEPSEEK, "fwd") == (
        f"no v head dim apart from q's: {bench_backends.SDPA_FLASH_HEADDIM_V}"
    )
    assert known["sdpa-flash"].supports(dataclasses.replace(DEEPSEEK, headdim_v=None), "fwd") is None
    for name in ("sdpa-cudnn", "sdpa-efficient", "sdpa-math", "flex", "fa4"):
        assert known[name].supports(DEEPSEEK, "fwd+bwd") is None, name
    assert flashcute_backend("flashcute-sm80", stand_in_flashcute(), "sm80").supports(DEEPSEEK, "fwd+bwd") is None


@pytest.mark.parametrize("pass_", ["fwd", "fwd+bwd"])
def test_the_check_holds_backends_to_v_of_its_own_head_dim(cpu_clock, pass_):
    """The reference reads v at its own head dim: out and dv at v's width, dq and dk at q's; a backend right there
    passes, one that scales its output is wrong."""
    x = make_inputs(DEEPSEEK, with_grad=pass_ != "fwd", device="cpu")
    reference = make_reference(x, DEEPSEEK)
    widths = {name: t.shape[-1] for name, t in reference.expected.items()}
    assert widths == ({"out": 128} if pass_ == "fwd" else {"out": 128, "dq": 192, "dk": 192, "dv": 128})
    rows = {
        r.backend: r
        for r in sweep([DEEPSEEK], [_attention_backend("good"), _attention_backend("bad", 1.1)], Settings(pass_))
    }
    assert rows["good"].status == "ok" and rows["bad"].status == "wrong"


def test_bench_headdim_v_on_a_cpu_stand_in(monkeypatch, cpu_clock, tmp_path, capsys):
    """`flashcute bench --headdim 64,32 --headdim-v 32,16 --pass fwd+bwd` end to end, flashcute's entry point and the
    clocks standing in: a table and a plot per head-dim pair, SDPA's flash backend n/a with the reason."""
    package = stand_in_flashcute()
    monkeypatch.setattr(flashcute, "available_kernels", lambda: ["sm80"], raising=False)
    monkeypatch.setattr(flashcute, "flash_attn_func", package.flash_attn_func, raising=False)
    time_on_the_cpu(monkeypatch, lambda: 1.0)
    grid = ["--quick", "--headdim", "64,32", "--headdim-v", "32,16", "--causal", "yes", "--seqlen", "128"]
    backends = "flashcute-sm80,sdpa-math,sdpa-flash"
    assert cli.main([*grid, "--pass", "fwd+bwd", "--backends", backends, "--out", str(tmp_path)]) == 0
    saved = Results.load(tmp_path / "results.json")
    assert [(row.backend, row.shape.headdim, row.shape.headdim_v, row.status) for row in saved.rows] == [
        ("flashcute-sm80", 64, 32, "ok"),
        ("sdpa-math", 64, 32, "ok"),
        ("sdpa-flash", 64, 32, "unsupported"),
        ("flashcute-sm80", 32, 16, "ok"),
        ("sdpa-math", 32, 16, "ok"),
        ("sdpa-flash", 32, 16, "unsupported"),
    ]
    assert saved.rows[0].tflops == pytest.approx(3.5 * 2 * 2 * 4 * (128 * 64) * (64 + 32) / 1e9)
    assert saved.meta["grid"]["headdims_v"] == [32, 16] and saved.rows[0].errors["dv"]["max_abs"] >= 0
    text = (tmp_path / "results.md").read_text()
    assert "## bf16 · d64v32 · causal\n" in text and "## bf16 · d32v16 · causal\n" in text
    assert (
        f"- sdpa-flash unsupported (L=128): no v head dim apart from q's: {bench_backends.SDPA_FLASH_HEADDIM_V}" in text
    )
    assert sorted(path.name for path in tmp_path.glob("*.png")) == [
        "fwd+bwd_bf16_d32v16_causal.png",
        "fwd+bwd_bf16_d64v32_causal.png",
    ]


# ---- reports, JSON, --compare, plots -------------------------------------------------------------------------------


def synthetic(ms_scale: float = 1.0) -> Results:
    def row(backend, seqlen, status="ok", ms=None, reason=""):
        shape = Shape("bf16", 128, True, seqlen, 16384 // seqlen, 16)
        return Row(backend, shape, "fwd", status, reason, ms and ms * ms_scale, 1000.0 if ms else None)

    rows = [
        *(row("flashcute-sm80", seqlen, ms=1.0) for seqlen in (1024, 2048)),
        *(row("fa4", seqlen, ms=0.5) for seqlen in (1024, 2048)),
        row("sdpa-flash", 1024, ms=2.0),
        row("sdpa-flash", 2048, ms=4.0),
        *(row("sdpa-cudnn", seqlen, "wrong", 0.25, "wrong (checked at L=1024): out") for seqlen in (1024, 2048)),
        *(row("flex", seqlen, "unsupported", reason="triton is not installed") for seqlen in (1024, 2048)),
    ]
    meta = {"pass": "fwd", "gpu": {"name": "Test GPU"}, "date": "2026-01-01", "versions": {"torch": "2.11"}}
    host = {
        "flashcute-sm80": {"fwd": 12.5, "fwd with grad": 20.0, "fwd compiled": 40.0, "bwd": 60.0},
        "fa4": {"fwd": 30.0, "fwd with grad": 35.0, "fwd compiled": "graph break", "bwd": 90.0},
        "flex": dict.fromkeys(("fwd", "fwd with grad", "fwd compiled", "bwd"), "triton is not installed"),
    }
    first = {"flashcute-sm80": {"cold import": 0.1, "cold fwd": 5.0, "warm import": 0.1, "warm fwd": 0.15}}
    return Results(meta, rows, host, first)


def test_tflops_and_ratios():
    results = synthetic()
    flashcute, fa4, cudnn = results.rows[0], results.rows[2], results.rows[6]
    assert flashcute.tflops == pytest.approx(4 * 16 * 16 * 1024 * 1024 * 128 / 2 / 1e-3 / 1e12)
    assert speedup(flashcute, fa4) == pytest.approx(0.5)
    assert speedup(flashcute, cudnn) is None  # a wrong backend is left out of the ratios
    table = group_table(
        results.rows,
        ["flashcute-sm80", "fa4", "sdpa-flash", "sdpa-cudnn", "flex"],
        ["flashcute-sm80", "fa4", "sdpa-flash"],
    )
    lines = table.splitlines()
    assert "sm80/fa4" in lines[0] and "sm80/sdpa-flash" in lines[0] and "sm80/sdpa-cudnn" not in lines[0]
    cells = [cell.strip() for cell in lines[2].strip("|").split("|")]
    assert cells[3:] == ["68.7", "137.4", "34.4", "274.9 ✗", "n/a", "0.50", "2.00"]
    assert [cell.strip() for cell in lines[-1].strip("|").split("|")][-2:] == ["0.50", "2.83"]  # geomean of 2 and 4


def test_render_has_notes_and_per_backend_costs():
    text = render(synthetic())
    assert "# flashcute bench: fwd on Test GPU" in text and "## bf16 · D=128 · causal" in text
    assert "- flex unsupported (L=1k, 2k): triton is not installed" in text
    assert "- sdpa-cudnn wrong (L=1k, 2k): wrong (checked at L=1024): out" in text
    flat = re.sub(" +", " ", text)  # (tables pad their cells)
    assert "| backend | host µs/call: fwd | host µs/call: fwd with grad | host µs/call: fwd compiled |" in flat
    assert "| flashcute-sm80 | 12.5 | 20.0 | 40.0 | 60.0 | 1000" in flat and "| fa4 | 30.0 | 35.0 | ✗ |" in flat
    assert "- fa4 fwd compiled: graph break" in text and "- flex bwd: triton is not installed" in text
    assert "## First calls in a fresh process" in text
    assert "| flashcute-sm80 | 0.10 | 5.00 | 0.10 | 0.15 |" in flat


def test_results_saved_with_one_host_figure_a_backend_still_load(tmp_path):
    """Runs saved before the kinds of call were told apart (one figure a backend, for the run's pass) load."""
    path = tmp_path / "results.json"
    path.write_text('{"meta": {"pass": "bwd"}, "host_overhead_us": {"fa4": 236.0, "flex": "no"}, "rows": []}')
    loaded = Results.load(path)
    assert loaded.host_overhead_us == {"fa4": {"bwd": 236.0}, "flex": {"bwd": "no"}} and loaded.first_call_s == {}


def test_packed_rows_round_trip_and_rows_saved_without_lengths_load(tmp_path):
    results = Results(
        {"pass": "fwd"}, [Row("fa4", PACKED, "fwd", "ok", ms=1.0), Row("fa4", SHAPE, "fwd", "ok", ms=2.0)]
    )
    results.save(tmp_path / "results.json")
    loaded = Results.load(tmp_path / "results.json")
    assert loaded == results and loaded.rows[0].shape.lengths == (16, 48, 32)
    assert {row.key for row in loaded.rows} == {row.key for row in results.rows}  # shapes hash as they did
    old_row = {name: value for name, value in results.rows[1].to_dict().items() if name != "lengths"}
    (tmp_path / "old.json").write_text(json.dumps({"meta": {}, "rows": [old_row]}))
    assert Results.load(tmp_path / "old.json").rows == results.rows[1:]


def test_json_round_trip_and_compare(tmp_path):
    old = synthetic()
    old.save(tmp_path / "results.json")
    loaded = Results.load(tmp_path / "results.json")
    assert loaded == old
    text = compare(loaded, synthetic(ms_scale=0.5))
    assert "(8 rows in both runs)" in text  # timed rows: ok and wrong ones
    assert "| flashcute-sm80 | bf16 · D=128 · causal · L=1k B=16 H=16 | 68.7" in text
    assert text.count("+100.0%") == 8 + 4  # every row, then the geometric mean of each backend


def test_plots_are_written(tmp_path):
    paths = write_plots(synthetic(), tmp_path)
    assert [p.name for p in paths] == ["fwd_bf16_d128_causal.png"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- the decoding case ---------------------------------------------------------------------------------------------


def _points(shapes: list[Shape]) -> list[tuple[int, int, int, bool, int]]:
    return [(s.q_seqlen, s.seqlen, s.batch, s.causal, s.page_size) for s in shapes]


def test_decode_grid_and_labels():
    shapes = make_grid(DECODE)
    assert _points(shapes) == [
        (1, 4096, 8, False, 0),
        (1, 32768, 8, False, 0),
        (1, 131072, 8, False, 0),
        (1, 131072, 1, False, 0),
        (4, 32768, 8, True, 0),
        (1, 32768, 8, False, 16),
        (1, 32768, 8, False, 64),
        (1, 32768, 8, False, 256),
    ]
    assert {(s.dtype, s.headdim, s.nheads, s.kv_heads, s.group) for s in shapes} == {
        ("bf16", 128, 32, 8, ("bf16", 128, None, PLAIN_VARIANTS))
    }
    assert all(s.decode and not s.packed for s in shapes) and (shapes[1], shapes[6]) == (DECODE_SHAPE, PAGED)
    assert DECODE_SHAPE.label() == "bf16 · D=128 · non-causal · Lq=1 Lk=32k B=8 H=32/8"
    assert PAGED.label() == "bf16 · D=128 · non-causal · Lq=1 Lk=32k B=8 H=32/8 page 64" and PAGED.num_pages == 4096
    assert shapes[4].label() == "bf16 · D=128 · causal · Lq=4 Lk=32k B=8 H=32/8"
    assert shapes[4].size_label == "Lq=4 Lk=32k B=8 H=32/8 causal" and shapes[4].tokens == 32
    assert shapes[4].flops("fwd") == attention_flops(8, 32, 4, 32768, 128, causal=True)
    # self-attention shapes: q's rows and K/V's heads follow seqlen and nheads, labels as before
    assert (SHAPE.q_seqlen, SHAPE.kv_heads, SHAPE.decode, SHAPE.paged) == (4096, 16, False, False)
    assert SHAPE.label() == "bf16 · D=128 · non-causal · L=4k B=4 H=16" and SHAPE.size_label == "L=4k"
    assert SHAPE.group == ("bf16", 128, False, PLAIN_VARIANTS)
    assert graphs.graph_shape(shapes) == shapes[0]  # the CUDA graph figures' shape: Lq=1 Lk=4k B=8


def test_decode_flags_quick_and_refusals(capsys):
    quick = make_grid(cli.grid_spec(parse("--decode", "--quick")))
    assert _points(quick) == [
        (1, 1024, 2, False, 0),
        (1, 4096, 2, False, 0),
        (4, 1024, 2, True, 0),
        (1, 4096, 2, False, 64),
    ]
    assert {(s.nheads, s.kv_heads) for s in quick} == {(8, 2)} and graphs.graph_shape(quick) == quick[0]
    assert cli.settings(parse("--decode", "--quick")) == Settings(warmup_ms=5.0, rep_ms=20.0)
    narrowed = make_grid(cli.grid_spec(parse("--decode", "--causal", "no", "--dtype", "fp16", "--headdim", "64,128")))
    assert len(narrowed) == 2 * 7 and not any(s.causal for s in narrowed)
    assert [s.group for s in narrowed[::7]] == [("fp16", 64, None, PLAIN_VARIANTS), ("fp16", 128, None, PLAIN_VARIANTS)]
    assert not parse().decode and parse("--decode").decode
    # checked before the GPU: the answer is the same on any machine
    for flags, why in [
        (("--seqlen", "4k"), "--decode sets its own shapes; drop --seqlen, --batch and --nheads"),
        (("--nheads", "8"), "--decode sets its own shapes"),
        (("--pass", "fwd+bwd"), "flash_attn_with_kvcache has no backward); drop --pass"),
    ]:
        assert cli.main(["--decode", *flags]) == 2
        assert why in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("--decode", "--varlen")
    assert "--varlen: not allowed with argument --decode" in capsys.readouterr().err


def test_import_of_the_grid_loads_no_torch():
    code = "import sys, flashcute.bench.grid as g; g.make_grid(g.DECODE)[0].kv_bytes; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_decode_inputs_and_block_table():
    shape = Shape("fp16", 16, False, seqlen=256, batch=3, nheads=4, seqlen_q=2, nheads_k=2, page_size=32)
    x = make_inputs(shape, with_grad=False, device="cpu")
    assert (x.q.shape, x.k.shape, x.v.shape) == ((3, 2, 4, 16), (24, 32, 2, 16), (24, 32, 2, 16))
    assert make_inputs(dataclasses.replace(shape, page_size=0), with_grad=False, device="cpu").k.shape == (
        3,
        256,
        2,
        16,
    )
    table = block_table(shape, device="cpu")
    assert table.dtype == torch.int32 and table.shape == (3, 8) and sorted(table.flatten().tolist()) == list(range(24))
    assert torch.equal(table, block_table(shape, device="cpu"))  # seeded: every run reads the same pages
    assert not torch.equal(table.flatten(), torch.arange(24, dtype=torch.int32))  # scattered over the cache
    mask = inputs.bottom_right_causal_mask(dataclasses.replace(shape, seqlen=5), device="cpu")
    assert mask.int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


def test_deterministic_backends_are_swept_only_where_named(monkeypatch):
    """flashcute-<kernel>-deterministic calls the kernel's entries with deterministic=True, refuses decode shapes,
    is left out of a sweep that names no backends, and is no flashcute kernel of its own in the tables."""
    calls = []
    package = stand_in_flashcute(calls=calls)
    monkeypatch.setattr(flashcute, "available_kernels", lambda: ["sm80"], raising=False)
    assert "flashcute-sm80-deterministic" not in [b.name for b in select_backends(None)[0]]
    chosen = select_backends("flashcute-sm80-deterministic")[0]
    assert [b.name for b in chosen] == ["flashcute-sm80-deterministic"]
    assert chosen[0].supports(DECODE_SHAPE, "fwd").startswith("no decode shapes")
    assert chosen[0].supports(SHAPE, "fwd+bwd") is None
    assert flashcute_kernel("flashcute-sm80-deterministic") is None and flashcute_kernel("flashcute-sm80") == "sm80"
    monkeypatch.setattr(flashcute, "flash_attn_func", package.flash_attn_func, raising=False)
    backend = registry()["flashcute-sm80-deterministic"]
    q, k, v = (torch.randn(1, 8, 2, 32) for _ in "qkv")
    backend.build(Shape("bf16", 32, True, 8, 1, 2))(q, k, v)
    assert calls == [("flash_attn_func", {"causal": True, "kernel": "sm80", "softcap": 0.0, "deterministic": True})]
    backend.build(Shape("bf16", 32, True, 8, 1, 2, sink=True))(q, k, v)  # the score variants' keywords beside it
    assert calls[1][1]["deterministic"] is True and "learnable_sink" in calls[1][1]


def test_decode_registry_and_what_each_backend_takes(monkeypatch):
    monkeypatch.setattr(flashcute, "available_kernels", lambda: ["sm80"], raising=False)
    assert "flashcute-sm80-func" not in registry() and "flashcute-sm80-func" not in select_backends(None)[0]
    known = registry(decode=True)
    assert list(known)[:2] == ["flashcute-sm80", "flashcute-sm80-func"]
    speculative = make_grid(DECODE)[4]
    for name in ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math", "flex"):
        assert known[name].supports(PAGED, "fwd").startswith("no paged KV cache:"), name
        assert known[name].supports(DECODE_SHAPE, "fwd") is None and known[name].supports(speculative, "fwd") is None
    assert known["fa4"].supports(PAGED, "fwd") is None and known["flashcute-sm80"].supports(PAGED, "fwd") is None
    func = known["flashcute-sm80-func"]
    assert func.supports(DECODE_SHAPE, "fwd") is None and func.supports(PAGED, "fwd").startswith("no paged KV cache:")
    assert func.supports(SHAPE, "fwd").startswith("decode shapes only")


def top_left_causal(name: str) -> Backend:
    """The causal mask aligned top-left, the rule SDPA's is_causal follows: wrong once seqlen_q < seqlen_k."""

    def build(shape: Shape):
        return partial(attention_same_precision, causal=shape.causal, causal_align="top_left")

    return Backend(name, build)


def test_sweep_checks_every_decode_shape(cpu_clock):
    spec = DecodeSpec(
        headdims=(32,),
        nheads=4,
        nheads_k=2,
        points=(DecodePoint(1, 256, 2), DecodePoint(3, 128, 2, causal=True), DecodePoint(1, 256, 2, page_size=16)),
    )
    shapes = make_grid(spec)
    calls: list[tuple[str, dict]] = []
    backends = [
        flashcute_backend("flashcute-good", stand_in_flashcute(calls=calls), "sm80"),
        flashcute_backend("flashcute-in-order", stand_in_flashcute(pages_in_order=True), "sm80"),
        bench_backends.flashcute_func_backend("flashcute-good-func", stand_in_flashcute(), "sm80"),
        registry()["sdpa-math"],
        top_left_causal("top-left"),
    ]
    rows = {(r.backend, r.shape): r for r in sweep(shapes, backends, Settings())}
    contiguous, speculative, paged = shapes
    assert all(rows[("flashcute-good", s)].status == "ok" and rows[("flashcute-good", s)].errors for s in shapes)
    assert calls[0] == (
        "flash_attn_with_kvcache",
        {"cache_seqlens": 256, "block_table": None, "causal": False, "kernel": "sm80"},
    )
    assert torch.equal(calls[-1][1]["block_table"], block_table(paged, device="cpu"))
    # the check gathers a paged cache through its block table, and is made on every decode shape
    wrong = rows[("flashcute-in-order", paged)]
    assert wrong.status == "wrong" and wrong.reason.startswith("wrong (checked at Lq=1 Lk=256 B=2 H=4/2 page 16): out")
    assert rows[("flashcute-in-order", contiguous)].status == rows[("flashcute-in-order", speculative)].status == "ok"
    # SDPA gets the bottom-right mask where seqlen_q < seqlen_k; the top-left rule fails the check there
    assert rows[("sdpa-math", speculative)].status == "ok" and rows[("sdpa-math", contiguous)].status == "ok"
    assert rows[("top-left", speculative)].status == "wrong" and rows[("top-left", contiguous)].status == "ok"
    for name in ("sdpa-math", "flashcute-good-func"):
        assert rows[(name, paged)].status == "unsupported" and rows[(name, paged)].reason.startswith(
            "no paged KV cache"
        )
    assert rows[("flashcute-good-func", speculative)].status == "ok"


def decode_results(ms_scale: float = 1.0) -> Results:
    speculative = make_grid(DECODE)[4]

    def row(backend, shape, ms=None, status="ok", reason=""):
        return Row(backend, shape, "fwd", status, reason, ms and ms * ms_scale)

    rows = []
    for shape in (DECODE_SHAPE, speculative, PAGED):
        rows += [
            row("flashcute-sm90", shape, 0.5),
            row("flashcute-sm90-func", shape, 1.0)
            if not shape.paged
            else row("flashcute-sm90-func", shape, status="unsupported", reason="no paged KV cache: flash_attn_func"),
            row("fa4", shape, 0.25),
            row("sdpa-flash", shape, 2.0)
            if shape == DECODE_SHAPE
            else row("sdpa-flash", shape, status="unsupported", reason=f"no {shape.size_label}"),
        ]
    graph = {
        "shape": make_grid(DECODE)[0].label(),
        "us": {
            "flashcute-sm90": {"step": 12.0, "attention": 11.0},
            "flashcute-sm80": dict.fromkeys(("step", "attention"), "RuntimeError: capture failed"),
        },
    }
    return Results({"pass": "fwd", "gpu": {"name": "Test GPU"}}, rows, decode_graph=graph)


def test_decode_rows_show_tbps_and_round_trip(tmp_path):
    row = Row("flashcute-sm90", PAGED, "fwd", "ok", ms=0.5)
    assert PAGED.kv_bytes == 2 * 8 * 32768 * 8 * 128 * 2 == 1 << 30  # K and V of bf16: 1 GiB
    assert row.tbps == pytest.approx((1 << 30) / 0.5e-3 / 1e12) == pytest.approx(2.147, abs=1e-3)
    assert (row.figure, row.unit) == (row.tbps, "TB/s")
    assert row.tflops == pytest.approx(4 * 8 * 32 * 32768 * 128 / 0.5e-3 / 1e12)
    dense = Row("fa4", SHAPE, "fwd", "ok", ms=1.0)
    assert (dense.figure, dense.unit, dense.tbps) == (dense.tflops, "TFLOP/s", None)
    results = decode_results()
    results.rows.append(dense)
    results.save(tmp_path / "results.json")
    saved = json.loads((tmp_path / "results.json").read_text())
    paged = next(r for r in saved["rows"] if r["page_size"])
    assert (paged["seqlen_q"], paged["nheads_k"], paged["page_size"], paged["seqlen"]) == (1, 8, 64, 32768)
    assert paged["tbps"] == pytest.approx(2.147, abs=1e-3) and saved["decode_graph"] == results.decode_graph
    assert (saved["rows"][-1]["seqlen_q"], saved["rows"][-1]["page_size"], saved["rows"][-1]["tbps"]) == (None, 0, None)
    loaded = Results.load(tmp_path / "results.json")
    assert loaded == results and {r.key for r in loaded.rows} == {r.key for r in results.rows}


def test_report_shows_decode_tables_in_tbps_and_the_graph_step(tmp_path):
    results = decode_results()
    text = render(results)
    flat = re.sub(" +", " ", text)
    assert "\nTB/s; ratios are flashcute's speedup" in text and DECODE_NOTE in text and PACKED_NOTE not in text
    assert text.count("## bf16 · D=128 · decode") == 1  # one table per dtype and head dim, both masks in it
    header = "| Lq | Lk | B | H | page | causal | flashcute-sm90 | flashcute-sm90-func | fa4 | sdpa-flash |"
    assert header + " sm90/flashcute-sm90-func | sm90/fa4 | sm90/sdpa-flash |" in flat and "sm90-func/" not in flat
    assert "| 1 | 32k | 8 | 32/8 | | no | 2.15 | 1.07 | 4.29 | 0.54 | 2.00 | 0.50 | 4.00 |" in flat
    assert "| 4 | 32k | 8 | 32/8 | | yes | 2.15 | 1.07 | 4.29 | n/a | 2.00 | 0.50 | |" in flat
    assert "| 1 | 32k | 8 | 32/8 | 64 | no | 2.15 | n/a | 4.29 | n/a | | 0.50 | |" in flat
    assert "| geomean | | | | | | | | | | 2.00 | 0.50 | 4.00 |" in flat
    assert "- sdpa-flash unsupported (Lq=4 Lk=32k B=8 H=32/8 causal): no Lq=4 Lk=32k B=8 H=32/8 causal" in text
    assert "- flashcute-sm90-func unsupported (Lq=1 Lk=32k B=8 H=32/8 page 64): no paged KV cache" in text
    graph = text[text.index("## Decode step in a CUDA graph") :]
    assert "at bf16 · D=128 · non-causal · Lq=1 Lk=4k B=8 H=32/8" in graph and "step / attention <= 1.1" in graph
    assert "| flashcute-sm90 | 12.0 | 11.0 | 1.09 |" in re.sub(" +", " ", graph)
    assert "| flashcute-sm80 | ✗ | ✗ | |" in re.sub(" +", " ", graph)
    assert graph.count("- flashcute-sm80 step: RuntimeError: capture failed") == 1
    assert [p.name for p in write_plots(results, tmp_path)] == ["fwd_bf16_d128_decode.png"]
    change = compare(results, decode_results(ms_scale=0.5))
    assert "| backend | shape | old TB/s | new TB/s | change |" in re.sub(" +", " ", change)
    assert "| fa4 | bf16 · D=128 · non-causal · Lq=1 Lk=32k B=8 H=32/8 page 64 | 4.29 | 8.59 | +100.0% |" in re.sub(
        " +", " ", change
    )


# ---- the command without a GPU ---------------------------------------------------------------------------------------


def test_cli_without_gpu_exits_with_a_clear_message(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["--quick", "--backends", "bogus"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_python_m_flashcute_bench_without_gpu():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "flashcute.bench", "--quick"], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "no CUDA GPU" in done.stderr


def test_first_calls_report_each_cache_state_and_call():
    """A fresh process per backend and cache state; where one cannot run (here: no GPU) each figure is the reason."""
    from flashcute.bench import host

    found = host.first_calls([Backend("sdpa-flash", lambda shape: None)], SHAPE)
    assert list(found) == ["sdpa-flash"]
    assert list(found["sdpa-flash"]) == [f"{s} {c}" for s in host.CACHE_STATES for c in host.FIRST_CALLS]
    values = found["sdpa-flash"].values()
    assert all(isinstance(v, str) and v for v in values) or all(isinstance(v, float) for v in values)


def test_first_call_reports_the_seconds_its_kernels_took(monkeypatch):
    """A backend whose first forward gets a kernel from flashcute's kernel cache reports the cache's seconds as "fwd
    kernels" (the rest of a cold first forward is imports); one that never asks the cache reports none."""
    from flashcute import compile_cache
    from flashcute.bench import host

    monkeypatch.setattr(compile_cache, "compile_seconds", {})
    monkeypatch.setattr(host, "make_inputs", lambda shape, with_grad: make_inputs(shape, with_grad, "cpu"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def compiling_forward(q, k, v):  # as flashcute's first forward: the cache built its kernel in 2.5 s
        compile_cache.compile_seconds.setdefault(("sm_90a", "a config"), 2.5)
        return q + k + v

    stand_ins = {
        "compiles": Backend("compiles", lambda shape: compiling_forward),
        "plain": Backend("plain", lambda shape: lambda q, k, v: q + k + v),
    }
    monkeypatch.setattr(bench_backends, "registry", lambda: stand_ins)
    plain = host.first_call("plain", host.tiny(SHAPE))
    assert list(plain) == list(host.FIRST_CALLS) and all(isinstance(v, float) for v in plain.values())
    compiles = host.first_call("compiles", host.tiny(SHAPE))
    assert list(compiles) == ["import", "fwd", "fwd kernels", "fwd+bwd"] and compiles["fwd kernels"] == 2.5


def test_bench_varlen_quick_on_a_cpu_stand_in(monkeypatch, cpu_clock, tmp_path, capsys):
    """`flashcute bench --varlen --quick` end to end, flashcute's entry points and the clocks standing in."""
    package = stand_in_flashcute()
    monkeypatch.setattr(flashcute, "available_kernels", lambda: ["sm80"], raising=False)
    monkeypatch.setattr(flashcute, "flash_attn_func", package.flash_attn_func, raising=False)
    monkeypatch.setattr(flashcute, "flash_attn_varlen_func", package.flash_attn_varlen_func, raising=False)
    time_on_the_cpu(monkeypatch, lambda: 1.0)
    flags = ["--varlen", "--quick", "--causal", "yes", "--backends", "flashcute-sm80,sdpa-math", "--out", str(tmp_path)]
    assert cli.main(flags) == 0, capsys.readouterr().err
    saved = Results.load(tmp_path / "results.json")
    assert [(row.backend, row.shape.packed, row.status) for row in saved.rows] == [
        ("flashcute-sm80", True, "ok"),
        ("sdpa-math", True, "unsupported"),
        ("flashcute-sm80", False, "ok"),
        ("sdpa-math", False, "ok"),
    ]
    assert saved.host_overhead_us == {} and saved.meta["grid"]["tokens"] == 4096
    text = re.sub(" +", " ", (tmp_path / "results.md").read_text())
    assert PACKED_NOTE in text and "| packed 105..975 | 7 | 4 |" in text and "| 1k | 4 | 4 |" in text
    assert [path.name for path in tmp_path.glob("*.png")] == ["fwd_bf16_d128_causal.png"]


def test_bench_decode_quick_on_a_cpu_stand_in(monkeypatch, cpu_clock, tmp_path, capsys):
    """`flashcute bench --decode --quick` end to end, flashcute's entry points, the clocks and the CUDA graphs
    standing in."""
    package = stand_in_flashcute()
    monkeypatch.setattr(flashcute, "available_kernels", lambda: ["sm80"], raising=False)
    for name in ("flash_attn_func", "flash_attn_with_kvcache"):
        monkeypatch.setattr(flashcute, name, getattr(package, name), raising=False)
    time_on_the_cpu(monkeypatch, lambda: 0.001)
    graphed = []
    monkeypatch.setattr(
        graphs,
        "graph_us",
        lambda kernel, shape, settings: graphed.append((kernel, shape)) or {"step": 10.5, "attention": 10.0},
    )
    backends = "flashcute-sm80,flashcute-sm80-func,sdpa-math"
    assert cli.main(["--decode", "--quick", "--backends", backends, "--out", str(tmp_path)]) == 0, (
        capsys.readouterr().err
    )
    saved = Results.load(tmp_path / "results.json")
    statuses = {(row.backend, row.shape.page_size, row.status) for row in saved.rows}
    assert len(saved.rows) == 4 * 3 and statuses == {
        ("flashcute-sm80", 0, "ok"),
        ("flashcute-sm80", 64, "ok"),
        ("flashcute-sm80-func", 0, "ok"),
        ("flashcute-sm80-func", 64, "unsupported"),
        ("sdpa-math", 0, "ok"),
        ("sdpa-math", 64, "unsupported"),
    }
    quick = make_grid(cli.grid_spec(parse("--decode", "--quick")))
    assert graphed == [("sm80", quick[0])] and saved.host_overhead_us == {} and saved.first_call_s == {}
    assert saved.decode_graph == {
        "shape": "bf16 · D=128 · non-causal · Lq=1 Lk=1k B=2 H=8/2",
        "us": {"flashcute-sm80": {"step": 10.5, "attention": 10.0}},
    }
    assert [point["seqlen_k"] for point in saved.meta["grid"]["points"]] == [1024, 4096, 1024, 4096]
    text = re.sub(" +", " ", (tmp_path / "results.md").read_text())
    tbps = 2 * 2 * 1024 * 2 * 128 * 2 / 1e-6 / 1e12
    assert (
        DECODE_NOTE in text
        and f"| 1 | 1k | 2 | 8/2 | | no | {tbps:.2f} | {tbps:.2f} | {tbps:.2f} | 1.00 | 1.00 |" in text
    )
    assert "| flashcute-sm80 | 10.5 | 10.0 | 1.05 |" in text
    assert [path.name for path in tmp_path.glob("*.png")] == ["fwd_bf16_d128_decode.png"]


def test_bench_sink_and_alibi_quick_on_a_cpu_stand_in(monkeypatch, cpu_clock, tmp_path, capsys):
    """`flashcute bench --quick --sink --alibi` end to end, flashcute's entry point and the clocks standing in: a
    table and a plot per variant, SDPA's rows n/a with the reason."""
    package = stand_in_flashcute()
    monkeypatch.setattr(flashcute, "available_kernels", lambda: ["sm80"], raising=False)
    monkeypatch.setattr(flashcute, "flash_attn_func", package.flash_attn_func, raising=False)
    time_on_the_cpu(monkeypatch, lambda: 1.0)
    grid = ["--quick", "--headdim", "32", "--causal", "yes", "--seqlen", "256", "--sink", "--alibi"]
    assert cli.main([*grid, "--backends", "flashcute-sm80,sdpa-math", "--out", str(tmp_path)]) == 0
    saved = Results.load(tmp_path / "results.json")
    assert [(row.backend, row.shape.sink, row.shape.alibi, row.status) for row in saved.rows] == [
        ("flashcute-sm80", False, False, "ok"),
        ("sdpa-math", False, False, "ok"),
        ("flashcute-sm80", False, True, "ok"),
        ("sdpa-math", False, True, "unsupported"),
        ("flashcute-sm80", True, False, "ok"),
        ("sdpa-math", True, False, "unsupported"),
        ("flashcute-sm80", True, True, "ok"),
        ("sdpa-math", True, True, "unsupported"),
    ]
    assert (saved.meta["grid"]["sinks"], saved.meta["grid"]["alibis"]) == ([False, True], [False, True])
    text = re.sub(" +", " ", (tmp_path / "results.md").read_text())
    assert "## bf16 · D=32 · causal · sink · alibi\n" in text
    assert f"- sdpa-math unsupported (L=256): no learnable sink: {bench_backends.SDPA_SINK}" in text
    assert sorted(path.name for path in tmp_path.glob("*.png")) == [
        "fwd_bf16_d32_causal.png",
        "fwd_bf16_d32_causal_alibi.png",
        "fwd_bf16_d32_causal_sink.png",
        "fwd_bf16_d32_causal_sink_alibi.png",
    ]
