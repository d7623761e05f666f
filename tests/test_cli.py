"""The `flashcute` command: demo (the no-GPU path; the GPU path's table on the CPU), walkthrough, bench, --help (the
tools' own commands are tested in test_compare.py, test_tune.py, test_sanitize.py and test_power.py)."""

from __future__ import annotations

import argparse
import functools
import re
import subprocess
import sys

import pytest
import torch

from flashcute import demo
from flashcute.cli import COMMANDS, main
from flashcute.reference import attention_same_precision
from tests.helpers import no_gpu, run_main

SEED_O = "O   = [[7/8, 3/4], [4/3, 1/3]]"


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


def test_a_command_is_required(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2 and "COMMAND" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["compare", "run", "--help"], ["tune", "--help"], ["sanitize", "--help"], ["power", "--help"]],
    ids=lambda argv: " ".join(argv),
)
def test_help_does_not_import_torch(argv):
    code = f"import sys\nfrom flashcute.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
    code += "print('torch' in sys.modules, 'cutlass' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines()[-1] == "False False"


@no_gpu
def test_demo_without_gpu(capsys):
    code, out, _ = run_main(capsys, "demo")
    assert code == 0
    assert out.startswith("No CUDA GPU found")
    errors = re.search(r"max \|tiled - spec\|: out (\S+), lse (\S+)", out)
    assert errors and float(errors[1]) < 1e-12 and float(errors[2]) < 1e-12, out
    assert SEED_O in out and "LSE = [ln 8, ln 9]" in out
    assert "flashcute walkthrough" in out


@no_gpu
def test_demo_without_gpu_as_a_subprocess():
    result = subprocess.run(
        [sys.executable, "-m", "flashcute.cli", "demo", "--no-causal"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "No CUDA GPU found" in result.stdout and "no mask" in result.stdout and SEED_O in result.stdout


def test_demo_rejects_a_bad_size(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--seqlen", "0"])
    assert exit_info.value.code == 2 and "--seqlen" in capsys.readouterr().err


def test_demo_table_on_the_cpu():
    """The GPU path's table, with CPU tensors, a stand-in for the kernel and a fake clock (every call 2 ms)."""
    shape = (2, 96, 3, 64)
    q, k, v = (torch.randn(shape, dtype=torch.bfloat16) for _ in range(3))
    backends = {
        "flashcute": functools.partial(attention_same_precision, causal=True),
        "torch SDPA": functools.partial(demo.sdpa, causal=True),
    }
    table = demo.compare(backends, q, k, v, causal=True, time_ms=lambda step: (step(), 2.0)[1])
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:3]}
    tflops = 4 * 2 * 3 * 96 * 96 * 64 / 2 / 2e-3 / 1e12
    for name in ("flashcute", "torch"):
        max_err, rel_err, ms, speed = (float(x) for x in rows[name][-4:])
        assert 0 < max_err < 0.05 and 0 < rel_err < 0.02 and ms == 2.0
        assert speed == pytest.approx(tflops, abs=0.1)
    assert "flashcute / torch SDPA: 1.00x the speed" in table


def test_walkthrough_prints_the_figures(capsys):
    code, out, err = run_main(capsys, "walkthrough")
    assert code == 0 and err == ""
    assert all(f"(Fig. {n})" in out for n in (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12))
    assert "LSE = ln(2^(m * scale_log2) * l)  [finalize]: ln 8, ln 9" in out


def test_walkthrough_options_and_bad_input(capsys):
    code, out, _ = run_main(capsys, "walkthrough", "--random", "3", "--seqlen-k", "5", "--causal", "bottom_right")
    assert code == 0 and "Causal, bottom-right aligned" in out
    code, _, err = run_main(capsys, "walkthrough", "--q", "1,x")
    assert code == 2 and "--q must be a matrix" in err


@no_gpu
def test_bench_without_gpu_says_so(capsys):
    code, _, err = run_main(capsys, "bench", "--quick")
    assert code == 2 and "no CUDA GPU" in err


def test_check_selects_every_sampled_variant_of_its_targets():
    from flashcute import check

    parser = argparse.ArgumentParser()
    check.add_arguments(parser)

    def labels(*argv):
        return [config.label for config, _ in check.selected(parser.parse_args(argv))]

    every = labels("--arch", "sm_80", "--headdim", "32", "--exact-only")
    # 2 dtypes x (4 mask variants x 4 kernels (forward; dK/dV with and without dQ atomics; deterministic dQ)
    # + the backward's preprocess, with and without zeroing dQaccum and with the LSE a tiled backward reads, its
    # postprocess and split-KV's combine, which have no mask, and the combine with sinks) + the 4 kernels' packed
    # variable-length, softcap and ALiBi variants and the forward's with sinks, 4 masks with the dtypes in turn + the
    # 3 preprocesses with the LSE's gradient, the sinks' or both, 2 dtypes + a decoding step's writes into its
    # cache, built for any head dim (9 kinds: 7 and 2 that leave a masked tail out of the counts, 2 dtypes) + a
    # packed backward's zeroing of the rows outside every sequence, any head dim, 2 dtypes
    assert len(every) == 42 + 2 + 16 + 16 + 16 + 4 + 18 + 18 + 2
    assert {label.split("-")[0] for label in every} == {
        "float16", "bfloat16", "bwd", "bwdnodq", "dq", "bwdpre", "bwdpost", "combine", "append", "zerorows"
    }  # fmt: skip
    forwards = labels("--arch", "sm_80", "--headdim", "32", "--exact-only", "--group", "sm80-fwd", "sm80-fwd-sink")
    assert len(forwards) == 8 + 4 and all(label.startswith(("float16", "bfloat16")) for label in forwards)
    assert [label for label in every if label in forwards] == forwards  # (the same variants, in the same order)


def test_check_names_the_groups_it_has_when_asked_for_another(capsys):
    code, _, err = run_main(capsys, "check", "--arch", "sm_80", "--group", "sm90-fwd")
    assert code == 2
    assert "--group sm90-fwd: not a group of sm_80" in err and "'sm80-fwd'" in err and "'prepost'" in err


@pytest.mark.compile
def test_check_compiles_and_reports(capsys):
    argv = ("check", "--arch", "sm_80", "--headdim", "32", "--exact-only", "--jobs", "2", "--group", "sm80-fwd")
    code, out, _ = run_main(capsys, *argv, "sm80-dq")
    assert code == 0
    rows = [line.split() for line in out.splitlines() if line.startswith("sm_80 ")]
    assert len(rows) == 16 and {row[1].split("-")[0] for row in rows} == {"float16", "bfloat16", "dq"}
    assert all(int(row[2]) <= 255 for row in rows)  # registers
    assert all(int(row[5]) > 0 for row in rows)  # HMMA
    assert all(int(row[-1]) > 50 for row in rows if row[1].startswith(("float16", "bfloat16")))  # a forward's step
    assert "16 variants in" in out and "0 failed to compile" in out
