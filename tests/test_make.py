"""The Makefile's newcomer path, run through make: the targets it lists, and the one-line reasons it gives when the
machine lacks Python, venv support or the package index (no target here installs anything)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def make(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_help_lists_the_targets():
    result = make("help")
    assert result.returncode == 0, result.stderr
    listed = [line.split()[1] for line in result.stdout.splitlines()]
    assert listed == ["help", "env", "demo", "test", "bench", "check", "walkthrough", "lint", "clean"]


def test_a_missing_python_is_one_line(tmp_path):
    result = make("demo", PYTHON="/nonexistent/python3", VENV=str(tmp_path / "venv"))
    assert result.returncode == 2
    reasons = [line for line in result.stderr.splitlines() if "*** [" not in line]  # make's own "Error 2" line
    assert reasons == ["make: no '/nonexistent/python3' on PATH: install Python 3.10 or newer (or set PYTHON=...)"]


def test_a_python_without_venv_support_is_one_line(tmp_path):
    python = tmp_path / "python3"
    python.write_text("#!/bin/sh\necho 'No module named venv' >&2\nexit 1\n")
    python.chmod(0o755)
    result = make("env", PYTHON=str(python), VENV=str(tmp_path / "venv"))
    assert result.returncode == 2
    assert "cannot make a virtual environment: install venv support" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "venv").exists()


def test_an_unreachable_package_index_is_one_line(tmp_path):
    venv = tmp_path / "venv"
    result = make("env", VENV=str(venv), TORCH="torch==0.0.1", PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path))
    assert result.returncode == 2
    assert f"pip could not install torch: is the package index reachable? (pip's log: {venv}/pip.log)" in result.stderr
    assert "Traceback" not in result.stderr and "ERROR" in (venv / "pip.log").read_text()
