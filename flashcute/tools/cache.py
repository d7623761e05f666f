"""`flashcute cache`: where the compiled-kernel disk cache is, how big, and what it holds; `--clear` empties it.

Entries are counted per kernel kind (the config's type) and target. An entry is current when the kernel sources and
tools of this installation would make its name for some variant the heuristics pick (`flashcute warmup --all`'s),
stale when no current code makes it (left by an edit of the kernels' code or another version of the tools).
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

from flashcute import compile_cache


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clear", action="store_true", help="delete the entries (with --stale: the stale ones)")
    parser.add_argument("--stale", action="store_true", help="with --clear: only the stale entries")


def current_names() -> set[str]:
    """The entry names of every variant of every target the families are built for, with this code and tools."""
    from flashcute.kernels import registry
    from flashcute.kernels.variants import all_variants

    archs = dict.fromkeys(arch for name in registry.FAMILIES for arch in registry.family(name).ARCHS)
    return {compile_cache.entry_name(arch, config) for arch in archs for config in all_variants(arch)}


def _kind_and_arch(path: Path) -> tuple[str, str]:
    """("fwdconfig", "sm_80") from "fwdconfig_sm_80_<key>.so" (or .o)."""
    kind, _, rest = path.stem.partition("_")
    return kind, rest.rpartition("_")[0]


def run(args: argparse.Namespace) -> int:
    directory = compile_cache.cache_dir()
    if directory is None:
        print("the disk cache is off (FLASHCUTE_CACHE_DIR=off): kernels are compiled once a process")
        return 0
    entries = compile_cache.entries(directory)
    current = current_names()
    stale = [path for path in entries if path.stem not in current]
    if args.clear:
        doomed = stale if args.stale else entries
        for path in doomed:
            path.unlink()
        print(f"deleted {len(doomed)} {'stale ' if args.stale else ''}entries from {directory}")
        return 0
    size = sum(path.stat().st_size for path in entries)
    print(f"{directory}: {len(entries)} entries, {size / 2**20:.1f} MiB, {len(stale)} of them stale")
    counts = collections.Counter((*_kind_and_arch(path), path.stem in current) for path in entries)
    if counts:
        print(f"{'kernel kind':<16} {'target':<8} {'current':>7} {'stale':>5}")
    for kind, arch in sorted({key[:2] for key in counts}):
        print(f"{kind:<16} {arch:<8} {counts[kind, arch, True]:>7} {counts[kind, arch, False]:>5}")
    return 0
