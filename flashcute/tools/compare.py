"""`flashcute compare`: this checkout's kernels against an earlier commit's, timed side by side in one process.

`compare prepare REV DIR`, where the git checkout is, writes DIR/flashcute_base: the flashcute package of commit REV
with its imports (and its torch.library namespace) renamed, so that it imports beside this one. `compare run DIR
OUT.json`, on the GPU host, times this checkout's flash_attn_func ("new"), flashcute_base's ("base") and a
reference backend at each point of the grid (B = 16384 / L, H = 2048 / D unless given), in turn, --rounds times
(tools/side_by_side.py), and prints new/base and the reference's ratios per point and their min, median and max.

The renamed package has compile-cache entries of its own (the cache keys on the package's sources); compile both
before timing: `flashcute warmup --all` and `PYTHONPATH=DIR python -P -m flashcute_base warmup --all` (a commit older
than that command: `python -P -m flashcute_base.kernels.variants --arch sm_90a`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import io
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from flashcute.bench.command import (
    add_family_argument,
    add_grid_arguments,
    add_timing_arguments,
    grid_from_flags,
    no_gpu,
)
from flashcute.bench.flops import PASSES
from flashcute.bench.grid import FULL, make_grid
from flashcute.kernels import registry

BASE = "flashcute_base"
REPO = Path(__file__).resolve().parents[2]
GRID = dataclasses.replace(FULL, seqlens=(1024, 4096, 16384))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    steps = parser.add_subparsers(dest="step", required=True, metavar="STEP")
    prepare = steps.add_parser(
        "prepare", help="write DIR/flashcute_base from commit REV (needs git)", description=prepare_package.__doc__
    )
    prepare.add_argument("rev", metavar="REV", help="a commit, branch or tag of this checkout")
    prepare.add_argument("dir", metavar="DIR", type=Path, help="where flashcute_base goes")
    timed = steps.add_parser(
        "run",
        help="time new, base and the reference (needs a GPU)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    timed.add_argument("dir", metavar="DIR", type=Path, help="the DIR of `flashcute compare prepare`")
    timed.add_argument("out", metavar="OUT.json", type=Path, help="the rows, ratios and metadata")
    add_family_argument(timed, "the family timed")
    timed.add_argument(
        "--reference",
        metavar="BACKEND",
        help="the bench backend timed beside (default: the family's REFERENCE: fa4 for sm90, sdpa-flash for sm80)",
    )
    timed.add_argument(
        "--pass",
        dest="pass_",
        choices=PASSES,
        default="fwd",
        help="what is timed, as in flashcute bench (default: fwd)",
    )
    timed.add_argument(
        "--deterministic",
        action="store_true",
        help="both trees with deterministic=True (the backward's fixed order of dQ adds)",
    )
    add_timing_arguments(timed, rounds=5)
    add_grid_arguments(timed, GRID)


def run(args: argparse.Namespace) -> int:
    if args.step == "prepare":
        return prepare_package(args.rev, args.dir)
    return time_trees(args)


def renamed(source: str) -> str:
    """A module of flashcute as a module of flashcute_base: its imports, the dotted names in its strings (as
    importlib takes them) and its torch.library ops ("flashcute::fwd", which would otherwise replace this tree's)."""
    source = re.sub(r"\bflashcute(?=\.|::)", BASE, source)
    return re.sub(r"^(\s*)(from|import) flashcute\b", rf"\1\2 {BASE}", source, flags=re.MULTILINE)


def prepare_package(rev: str, out_dir: Path) -> int:
    """Write DIR/flashcute_base: the flashcute package of commit REV of this checkout, renamed so that it imports
    beside flashcute, and DIR/flashcute_base/COMMIT, the commit's hash."""
    try:
        commit = git("rev-parse", "--verify", f"{rev}^{{commit}}").decode().strip()
        archive = git("archive", commit, "flashcute")
    except (OSError, subprocess.CalledProcessError) as exc:
        reason = exc.stderr.decode().strip() if isinstance(exc, subprocess.CalledProcessError) else exc
        print(f"flashcute compare prepare: no package of {rev!r} in {REPO}: {reason}", file=sys.stderr)
        return 2
    target = out_dir / BASE
    shutil.rmtree(target, ignore_errors=True)  # no module of another commit stays behind
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(".py"):
                path = target / Path(member.name).relative_to("flashcute")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(renamed(tar.extractfile(member).read().decode()))
    (target / "COMMIT").write_text(commit + "\n")
    print(f"{target}: flashcute of {rev} ({commit[:12]})")
    return 0


def git(*command: str) -> bytes:
    return subprocess.run(["git", "-C", str(REPO), *command], capture_output=True, check=True).stdout


def time_trees(args: argparse.Namespace) -> int:
    """new, base and the reference side by side on the grid; 2 without flashcute_base in DIR, a GPU or the family
    on it."""
    sys.path.insert(0, str(args.dir.resolve()))
    try:
        base = importlib.import_module(BASE)
    except ImportError as exc:
        print(
            f"flashcute compare run: no {BASE} in {args.dir} ({exc}); write it with "
            f"`flashcute compare prepare REV {args.dir}`",
            file=sys.stderr,
        )
        return 2
    if no_gpu("compare run"):
        return 2
    import flashcute
    from flashcute.bench.backends import flashcute_backend, select_backends
    from flashcute.bench.runner import Settings
    from flashcute.tools.side_by_side import time_side_by_side

    if args.kernel not in flashcute.available_kernels():
        print(f"flashcute compare run: kernel {args.kernel} does not run on this GPU", file=sys.stderr)
        return 2
    reference = args.reference or registry.family(args.kernel).REFERENCE
    trees = [
        flashcute_backend("new", flashcute, args.kernel, args.deterministic),
        flashcute_backend("base", base, args.kernel, args.deterministic),
    ]
    spec = grid_from_flags(args, GRID)
    settings = Settings(pass_=args.pass_, check=not args.no_check, rounds=args.rounds)
    commit = Path(base.__file__).with_name("COMMIT").read_text().strip()
    extra = {
        "base": commit,
        "kernel": args.kernel,
        "reference": reference,
        "pass": args.pass_,
        "deterministic": args.deterministic,
        "grid": dataclasses.asdict(spec),
    }
    pairs = [("new", "base"), ("new", reference), ("base", reference)]
    backends = [*trees, *select_backends(reference)[0]]
    return time_side_by_side(make_grid(spec), backends, settings, pairs, args.out, extra)
