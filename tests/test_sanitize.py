"""scripts/sanitize.py: its cases and its reading of compute-sanitizer's output (CPU), its driver (GPU)."""

import os
import stat

import pytest
import torch

from flashcute.config import head_dim_bucket
from flashcute.validation import validate_attention_args
from tests.helpers import load_script


def test_cases_are_valid_and_cover_what_the_kernels_branch_on():
    sanitize = load_script("sanitize")
    cases = sanitize.CASES
    assert len({str(case) for case in cases}) == len(cases)
    for case in cases:
        b, sq, sk, h, hk, d = case.sizes
        q, k = torch.empty(b, sq, h, d), torch.empty(b, sk, hk, d)
        validate_attention_args(q, k, k, **case.options)
    sizes = [case.sizes for case in cases]
    assert {head_dim_bucket(d) for *_, d in sizes} == {32, 64, 96, 128, 192, 256}
    assert any(d != head_dim_bucket(d) for *_, d in sizes), "a padded head dim"
    assert any(sq < sk for _, sq, sk, *_ in sizes) and any(sq > sk for _, sq, sk, *_ in sizes)
    assert any(h != hk for _, _, _, h, hk, _ in sizes), "GQA"
    assert any(sq == 1 for _, sq, *_ in sizes)
    assert any(case.q_strided for case in cases)
    assert any(case.backward and case.deterministic for case in cases)
    assert any(case.backward and not case.deterministic and case.sizes[-1] <= 128 for case in cases), "sm90 bwd"
    options = [case.options for case in cases]
    assert any(o.get("causal_align") == "top_left" for o in options) and any("window_size" in o for o in options)
    assert {case.dtype for case in cases} == {"float16", "bfloat16"}


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
    sanitize = load_script("sanitize")
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(f"#!/bin/sh\necho 'ran bf16-case'\ncat <<'END'\n{printed}\nEND\nexit {status}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    result = sanitize.sanitize("memcheck", ["python", "driver"], tmp_path / "memcheck.log")
    assert result["returncode"] == status and result["errors"] == errors and result["cases_run"] == 1
    assert "ran bf16-case" in (tmp_path / "memcheck.log").read_text()


@pytest.mark.gpu
def test_the_driver_runs_a_case_on_both_kernels_and_matches_the_spec():
    from flashcute import available_kernels

    sanitize = load_script("sanitize")
    assert sanitize.run_cases(available_kernels(), [sanitize.CASES[1]], check=True) == []
