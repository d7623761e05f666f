"""`flashcute check`: compile every kernel variant for a target, without a GPU, and report what the compiler made
of each: registers, stack, spill instructions (STL/LDL) and the SASS of the algorithm's steps (HMMA tensor-core
MMAs, LDGSTS cp.async loads, LDSM ldmatrix reads, MUFU.EX2 exponentials; for the Hopper kernel HGMMA warpgroup MMAs
and UTMALDG TMA loads; the Hopper backward too), and "step": the SASS instructions of its largest innermost loop,
one main-loop step (sass.step_loops)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from flashcute.kernels.common.limits import HEAD_DIM_BUCKETS

COLUMNS = ("HMMA", "LDGSTS", "LDSM", "LDSM.16.MT88", "MUFU.EX2", "HGMMA", "UTMALDG")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--arch", choices=("sm_80", "sm_90a"), nargs="+", default=["sm_90a"], help="targets (default: sm_90a)"
    )
    parser.add_argument(
        "--headdim", type=int, choices=HEAD_DIM_BUCKETS, nargs="+", help="head-dim buckets (default: all)"
    )
    parser.add_argument("--exact-only", action="store_true", help="skip the padded-head-dim variants")
    parser.add_argument(
        "--group",
        nargs="+",
        metavar="GROUP",
        help="only these groups of variants: a family's kernel kind (e.g. sm90-fwd, sm80-bwd-packed) or prepost "
        "(default: all)",
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles (default: cores)")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="keep each variant's .ptx and .cubin under DIR")


def run(args: argparse.Namespace) -> int:
    """Print one row per variant; 1 if any variant failed to compile, else 0 (spills are reported, not failed)."""
    from flashcute.kernels.sass import inspect_variants

    try:
        variants = selected(args)
    except ValueError as error:
        print(f"flashcute check: {error}", file=sys.stderr)
        return 2
    print(f"compiling {len(variants)} variants with {args.jobs} processes ...", flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="flashcute-check-") as tmp:
        reports = inspect_variants(variants, args.keep or Path(tmp), args.jobs)
    header = f"{'arch':<7} {'variant':<36} {'regs':>4} {'stack':>5} {'STL+LDL':>7} " + " ".join(
        f"{name:>{max(len(name), 6)}}" for name in COLUMNS
    )
    header += f" {'step':>5}"
    lines, failed, spilled = [header], 0, 0
    for (config, arch), report in zip(variants, reports, strict=True):
        row = f"{arch:<7} {config.label:<36}"
        if isinstance(report, Exception):
            failed += 1
            lines.append(f"{row} failed: {type(report).__name__}: {report}")
            continue
        spilled += report.spills > 0
        counts = " ".join(f"{report.count(name):>{max(len(name), 6)}}" for name in COLUMNS)
        step = report.loops[0] if report.loops else 0
        lines.append(f"{row} {report.registers:>4} {report.stack_bytes:>5} {report.spills:>7} {counts} {step:>5}")
    print("\n".join(lines))
    print(
        f"{len(variants)} variants in {time.perf_counter() - start:.0f} s: {failed} failed to compile, "
        f"{spilled} spill registers to local memory"
    )
    return 1 if failed else 0


def selected(args: argparse.Namespace) -> list[tuple]:
    """The (config, arch) pairs ``args`` asks for, in order: of registry.variants' groups (those named by --group)
    the sample the compile tests build (in_sample) at the --headdim buckets (a head-dim-free variant at any)."""
    from flashcute.kernels import registry
    from flashcute.kernels.common.limits import in_sample

    groups = {arch: registry.variants(arch, args.exact_only) for arch in args.arch}
    known = sorted({name for found in groups.values() for name in found})
    unknown = set(args.group or ()) - set(known)
    if unknown:
        raise ValueError(f"--group {' '.join(sorted(unknown))}: not a group of {' '.join(args.arch)}; they are {known}")
    return [
        (config, arch)
        for arch, found in groups.items()
        for name, group in found.items()
        if args.group is None or name in args.group
        for config in group
        if args.headdim is None or getattr(config, "head_dim_padded", None) in (None, *args.headdim)  # (None: any)
        if in_sample(name, config)
    ]
