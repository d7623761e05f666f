"""Where and with what a run happened: GPU, clocks, versions, commit, date, command line."""

import os
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

DISTRIBUTIONS = ("flashcute", "torch", "triton", "nvidia-cutlass-dsl", "flash-attn-4")
CLOCK_FIELDS = ("clocks.sm", "clocks.max.sm", "clocks.applications.graphics", "clocks.mem", "power.limit")
REPO = Path(__file__).resolve().parents[2]


def _run(command: list[str]) -> str | None:
    """A command's stdout, or None if it is missing or fails."""
    try:
        return subprocess.run(command, capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, str | int | None]:
    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    found = {name: installed(name) for name in DISTRIBUTIONS}
    if found.get("flashcute") is None:  # a source tree on PYTHONPATH, never pip-installed
        import flashcute

        found["flashcute"] = flashcute.__version__
    return {**found, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}


def git_commit() -> str | None:
    """HEAD of the flashcute checkout, with "+dirty" if it has uncommitted changes.

    A copy of the tree (as on a lent GPU host) names its commit in FLASHCUTE_GIT_COMMIT, which wins: the copy may
    carry no .git, or a stale one.
    """
    if os.environ.get("FLASHCUTE_GIT_COMMIT"):
        return os.environ["FLASHCUTE_GIT_COMMIT"]
    commit = _run(["git", "-C", str(REPO), "rev-parse", "HEAD"])
    if commit is None:
        return None
    dirty = _run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"])
    return commit + ("+dirty" if dirty else "")


def clocks(uuid: str) -> dict[str, str] | None:
    """SM and memory clocks (MHz) and power limit (W) from nvidia-smi, where it is there to ask."""
    query = ",".join(("uuid", *CLOCK_FIELDS))
    text = _run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"])
    if not text:
        return None
    lines = [[value.strip() for value in line.split(",")] for line in text.splitlines()]
    ours = next((values for values in lines if uuid and uuid in values[0]), lines[0])
    return dict(zip(CLOCK_FIELDS, ours[1:], strict=False))


def gpu() -> dict:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    uuid = str(getattr(props, "uuid", ""))
    return {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "clocks": clocks(uuid),
    }


def collect(extra: dict) -> dict:
    """Metadata for results.json; `extra` adds the run's own settings."""
    return {
        "gpu": gpu(),
        "versions": versions(),
        "git": git_commit(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(sys.argv),
        **extra,
    }
