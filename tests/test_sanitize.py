"""`flashcute sanitize`: its cases (what the kernels branch on, every head-dim bucket and kernel kind), its flags and
refusals, its reading of compute-sanitizer's output (CPU); the driver on a case of each family (GPU)."""

import itertools
import os
import stat

import pytest
import torch

from flashcute.kernels import registry
from flashcute.kernels.common.limits import HEAD_DIM_BUCKETS, head_dim_bucket
from flashcute.tools.sanitize import CASES, sanitize
from flashcute.validation import validate_attention_args, validate_varlen_args, validate_varlen_values
from tests.helpers import no_gpu, run_main


def test_cases_are_valid_and_cover_what_the_kernels_branch_on():
    assert len({str(case) for case in CASES}) == len(CASES)
    for case in CASES:
        b, sq, sk, h, hk, d = case.sizes
        if case.packed is None:
            q, k = torch.empty(b, sq, h, d), torch.empty(b, sk, hk, d)
            validate_attention_args(q, k, k, **case.options)
        else:
            (lens_q, lens_k), (cu_q, cu_k) = case.packed, (cumulative(lens) for lens in case.packed)
            q, k = torch.empty(sum(lens_q), h, d), torch.empty(sum(lens_k), hk, d)
            args = validate_varlen_args(q, k, k, cu_q, cu_k, max(lens_q), max(lens_k), **case.options)
            validate_varlen_values(args, cu_q, cu_k, None, None)
    packed = [case for case in CASES if case.packed is not None]
    assert any(0 in case.packed[0] for case in packed) and any(case.backward for case in packed)
    sizes = [case.sizes for case in CASES if case.packed is None]
    assert {head_dim_bucket(d) for *_, d in sizes} == set(HEAD_DIM_BUCKETS)
    assert any(d != head_dim_bucket(d) for *_, d in sizes), "a padded head dim"
    assert any(sq < sk for _, sq, sk, *_ in sizes) and any(sq > sk for _, sq, sk, *_ in sizes)
    assert any(h != hk for _, _, _, h, hk, _ in sizes), "GQA"
    assert any(sq == 1 for _, sq, *_ in sizes)
    assert any(case.q_strided for case in CASES)
    options = [case.options for case in CASES if case.packed is None]
    assert any(o.get("causal_align") == "top_left" for o in options) and any("window_size" in o for o in options)
    assert {case.dtype for case in CASES} == {"float16", "bfloat16"}


@pytest.mark.parametrize("name", registry.FAMILIES)
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic-dq", "deterministic-dq"])
def test_cases_reach_every_kind_of_kernel_of_each_family(name, deterministic):
    """The driver runs every case with each family first, so each family's forward runs every case. Its backward,
    in each dQ mode it covers at some head dim (atomic dQ with the postprocess; the deterministic dQ kernel), takes
    some case; the preprocess runs before either."""
    family = registry.family(name)
    if not any(family.supports_backward(bucket, deterministic, False) for bucket in HEAD_DIM_BUCKETS):
        pytest.skip(f"{name} has no backward in this mode (the next family takes it)")
    assert any(
        case.backward
        and case.deterministic == deterministic
        and family.supports_backward(case.sizes[-1], deterministic, False)
        for case in CASES
    )


def test_list_prints_each_case_with_its_index(capsys):
    code, out, _ = run_main(capsys, "sanitize", "--list")
    assert code == 0 and out.splitlines() == [f"{i:>2}  {case}" for i, case in enumerate(CASES)]
    code, out, _ = run_main(capsys, "sanitize", "--list", "--cases", "3,1")
    assert out.splitlines() == [f" 3  {CASES[3]}", f" 1  {CASES[1]}"]


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--tools", "memcheck,bogus"], "tool 'bogus' is not one of memcheck, racecheck, synccheck"),
        (["--cases", str(len(CASES))], f"case {len(CASES)} is not in 0..{len(CASES) - 1}"),
    ],
)
def test_malformed_flags_are_argparse_errors(tmp_path, capsys, flag, message):
    with pytest.raises(SystemExit) as exit_info:
        run_main(capsys, "sanitize", str(tmp_path), *flag)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kernels", "sm90,sm70"], "kernel must be one of ('sm90', 'sm80')"),
        ([], "OUT_DIR is required (unless --driver or --list)"),
    ],
)
def test_an_unknown_family_or_no_out_dir_is_refused(capsys, argv, message):
    code, _, err = run_main(capsys, "sanitize", *argv)
    assert code == 2 and message in err


@no_gpu
@pytest.mark.parametrize("argv", [["OUT_DIR"], ["--driver", "--cases", "2"]])
def test_without_gpu_says_so(tmp_path, capsys, argv):
    code, _, err = run_main(capsys, "sanitize", *(str(tmp_path / arg) if arg == "OUT_DIR" else arg for arg in argv))
    assert code == 2 and "flashcute sanitize: no CUDA GPU" in err
    assert not (tmp_path / "OUT_DIR").exists()


@pytest.mark.parametrize(
    ("printed", "status", "errors"),
    [
        ("========= ERROR SUMMARY: 0 errors", 0, 0),
        ("========= Invalid __global__ read of size 16 bytes\n========= ERROR SUMMARY: 3 errors", 9, 3),
        ("========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)", 9, 2),
        ("no summary: the run died", 1, None),
    ],
)
def test_a_run_reports_the_sanitizers_summary(tmp_path, monkeypatch, printed, status, errors):
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(f"#!/bin/sh\necho 'ran bf16-case'\ncat <<'END'\n{printed}\nEND\nexit {status}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    result = sanitize("memcheck", ["python", "driver"], tmp_path / "memcheck.log")
    assert result["returncode"] == status and result["errors"] == errors and result["cases_run"] == 1
    assert "ran bf16-case" in (tmp_path / "memcheck.log").read_text()


@pytest.mark.gpu
def test_the_driver_runs_a_case_on_each_family_and_matches_the_spec(capsys):
    code, out, _ = run_main(capsys, "sanitize", "--driver", "--check", "--cases", "1")
    assert code == 0, out
    from flashcute import available_kernels

    assert [line.split()[1] for line in out.splitlines() if line.startswith("ran ")] == available_kernels()
    assert "all outputs match attention_ref" in out


def cumulative(lengths: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
