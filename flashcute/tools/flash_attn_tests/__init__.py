"""`flashcute flash-attn-tests TEST_FILE`: flash-attention 2's own tests (its tests/test_flash_attn.py) run against
flashcute, through a stand-in ``flash_attn`` package that hands each call to flashcute's entry of the same name.

The command copies TEST_FILE into a scratch folder with a conftest.py that imports ``selection`` (which cases run:
no dropout, no test of flash-attention 2's internals, a sample of the rest) and runs pytest there, in --workers
pytest-xdist processes. The tests compare each output and gradient with their own float32 reference, against the
error of the same computation in the inputs' dtype, and need a GPU, ``einops`` and nothing of flash-attention
itself. The file is read from a flash-attention checkout (github.com/Dao-AILab/flash-attention) and never kept.
Arguments after ``--`` go to pytest (e.g. ``-k kvcache``, or test ids to rerun). Exit status: pytest's, and the
last line of the output says what it means.

The largest cases (a KV cache of 100,000 keys) take about 20 GB of GPU memory each: more than about 12 workers on
an 80 GB GPU runs out of memory.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import flashcute

CONFTEST = "from flashcute.tools.flash_attn_tests.selection import *  # noqa: F403\n"
REQUIRED = ("einops",)  # what flash-attention's tests import besides torch, pytest and flash_attn
OUTCOMES = {0: "every case run passed", 1: "some cases failed", 5: "no case was run"}  # by pytest's exit status


def sample_size(text: str) -> str:
    """An argparse type: "all" or a whole number of cases."""
    if text != "all" and not (text.isdigit() and int(text) > 0):
        raise argparse.ArgumentTypeError(f"--sample must be 'all' or a number of cases above 0, got {text!r}")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description, parser.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    parser.add_argument("tests", metavar="TEST_FILE", type=Path, help="flash-attention's tests/test_flash_attn.py")
    parser.add_argument(
        "--sample", type=sample_size, default="400", help="cases to run, or 'all' (default: 400, every test sampled)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default: 0)")
    parser.add_argument("--workers", type=int, default=8, help="pytest-xdist processes (default: 8; 1: none)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: arguments for pytest")


def run(args: argparse.Namespace) -> int:
    if not args.tests.is_file():
        print(f"flashcute flash-attn-tests: {args.tests} is not a file", file=sys.stderr)
        return 2
    missing = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
    if missing:
        print(f"flashcute flash-attn-tests: flash-attention's tests import {', '.join(missing)}: pip install them",
              file=sys.stderr)  # fmt: skip
        return 2
    pytest_args = [arg for arg in args.pytest_args if arg != "--"]
    if args.workers > 1 and importlib.util.find_spec("xdist") is not None:
        pytest_args = ["-n", str(args.workers), *pytest_args]
    with tempfile.TemporaryDirectory(prefix="flashcute-flash-attn-tests-") as folder:
        here = Path(folder)
        shutil.copyfile(args.tests, here / "test_flash_attn.py")
        (here / "conftest.py").write_text(CONFTEST)
        (here / "pytest.ini").write_text("[pytest]\n")  # this folder is pytest's root, apart from any project's
        env = dict(os.environ, FLASHCUTE_FA_SAMPLE=args.sample, FLASHCUTE_FA_SEED=str(args.seed))
        source = str(Path(flashcute.__file__).resolve().parents[1])  # flashcute importable from the scratch folder
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (source, os.environ.get("PYTHONPATH"))))
        command = [sys.executable, "-m", "pytest", "-q", "-rfE", "--tb=short", "-p", "no:cacheprovider"]
        status = subprocess.call([*command, "test_flash_attn.py", *pytest_args], cwd=here, env=env)
        selection = here / "selection.txt"
        if selection.exists():
            print(selection.read_text(), end="")
    # the outcome last, below the list of what was not run (a log's tail shows it)
    print(f"flashcute flash-attn-tests: {OUTCOMES.get(status, 'pytest exit status')} ({status})")
    return status
