"""`flashcute tune`: a family's heuristic forward config against the same config with fields overridden.

    flashcute tune --kernel sm90 --headdim 192 --causal yes --try exp_in_place=false
    flashcute tune --kernel sm80 --headdim 128 --try num_stages=2 --try block_n=128,num_warps=8

Each --try is one candidate: FIELD=VALUE[,FIELD=VALUE] replaces those fields of the config the heuristic picks at a
point (dataclasses.replace); a value is read as an int, a float, true or false, or else a string. At each point of
the grid (B = 16384 / L, H = 2048 / D unless given) the heuristic's config, every candidate and the reference
backends are timed side by side in one process (tools/side_by_side.py), each launched through the family's forward
and checked against the float64 spec first; a line per point gives each candidate / heuristic. The candidates are
compiled first, in parallel, into the disk cache. --dry-run prints the configs instead, without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from flashcute.bench.command import (
    add_family_argument,
    add_grid_arguments,
    add_timing_arguments,
    grid_from_flags,
    no_gpu,
)
from flashcute.bench.grid import DTYPES, FULL, group_label, make_grid
from flashcute.kernels import registry

GRID = dataclasses.replace(FULL, dtypes=("bf16",), seqlens=(4096, 16384))
# (window_left, window_right) of the grid's masks: none, causal (seqlen_q == seqlen_k, so no diagonal offset)
WINDOWS = {False: (-1, -1), True: (-1, 0)}


def parse_value(text: str) -> int | float | bool | str:
    """An int, a float, true or false, or else the string itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_try(text: str) -> dict[str, int | float | bool | str]:
    """--try's FIELD=VALUE[,FIELD=VALUE] as config fields."""
    items = [item.partition("=") for item in text.split(",")]
    if any(not name or not sep or not value for name, sep, value in items):
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE[,FIELD=VALUE], got {text!r}")
    if len({name for name, _, _ in items}) < len(items):
        raise argparse.ArgumentTypeError(f"a field is given twice in {text!r}")
    return {name.strip(): parse_value(value.strip()) for name, _, value in items}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description, parser.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    add_family_argument(parser, "the kernel family whose forward is tuned")
    parser.add_argument(
        "--try",
        dest="tries",
        metavar="FIELD=VALUE[,FIELD=VALUE]",
        type=parse_try,
        action="append",
        default=[],
        help="a candidate: the heuristic's config with these fields replaced (repeatable)",
    )
    parser.add_argument(
        "--backends",
        default="fa4,sdpa-flash",
        help="references timed beside, as in flashcute bench (default: %(default)s)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("out/tune.json"), help="rows and ratios (default: %(default)s)"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles (default: cores)")
    parser.add_argument("--dry-run", action="store_true", help="print each point's configs and exit (no GPU needed)")
    add_timing_arguments(parser, rounds=3)
    add_grid_arguments(parser, GRID)


def override(config, fields: dict):
    """``config`` with ``fields`` replaced; a ValueError names a field it does not have or a value of another type."""
    for name, value in fields.items():
        if not hasattr(config, name):
            known = ", ".join(field.name for field in dataclasses.fields(config))
            raise ValueError(f"{type(config).__name__} has no field {name!r}; its fields: {known}")
        if type(value) is not type(getattr(config, name)):
            raise ValueError(f"{name} takes a value of type {type(getattr(config, name)).__name__}, got {value!r}")
    return dataclasses.replace(config, **fields)


def candidates(family, arch: str, group: tuple, tries: list[dict]) -> dict:
    """The configs timed for a (dtype, head dim, causal, no score variant) group by name: "heuristic", the forward
    config the family picks on target ``arch`` (the one flash_attn_func launches), and one per --try."""
    dtype, head_dim, causal, _ = group
    # variants of one exact head dim and one mask: the heuristic's config for exactly these
    heuristic = family.variants(arch, (DTYPES[dtype],), (head_dim,), (WINDOWS[causal],), True)["fwd"][0]
    tried = {",".join(f"{name}={value}" for name, value in fields.items()): fields for fields in tries}
    return {"heuristic": heuristic, **{name: override(heuristic, fields) for name, fields in tried.items()}}


def config_backend(name: str, family, configs: dict):
    """The family's forward with the config ``name`` of the shape's group, as flash_attn_func launches it."""
    import torch

    from flashcute.bench.backends import Backend
    from flashcute.kernels.launch import dtype_name

    def build(shape):
        config, window = configs[shape.group][name], WINDOWS[shape.causal]
        launchers = {}

        def attention(q, k, v):
            out = torch.empty_like(q)
            lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
            if not launchers:
                launchers[0] = family.forward_launcher(q.device, dtype_name(q), q.shape[-1], *window, config=config)
            launchers[0](q, k, v, out, lse, q.shape[-1] ** -0.5, 0)
            return out

        return attention

    return Backend(name, build)


def precompile(configs: list, arch: str, jobs: int) -> None:
    """Fill the disk cache in parallel, so that the timing only loads; a config that does not compile is reported
    here, and its rows fail with the reason."""
    from flashcute.kernels.variants import compile_one

    with ProcessPoolExecutor(jobs) as pool:
        futures = [pool.submit(compile_one, config, arch) for config in configs]
    for config, future in zip(configs, futures, strict=True):
        if future.exception() is not None:
            print(f"{config.label} does not compile: {future.exception()}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """The side-by-side timing; 2 for an unknown family or field, or without a GPU (unless --dry-run)."""
    import torch

    from flashcute.kernels.launch import device_arch

    gpu = torch.cuda.is_available()
    spec = grid_from_flags(args, GRID)
    shapes = make_grid(spec)
    try:
        family = registry.family(args.kernel)
        if gpu and args.kernel not in registry.available():
            raise ValueError(f"kernel {args.kernel} does not run on {torch.cuda.get_device_name()}")
        # without a GPU (--dry-run, or the refusal below) the configs of the family's newest target
        arch = device_arch(torch.device("cuda")) if gpu else family.ARCHS[-1]
        configs = {
            group: candidates(family, arch, group, args.tries) for group in dict.fromkeys(s.group for s in shapes)
        }
    except ValueError as exc:
        print(f"flashcute tune: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        for group, named in configs.items():
            print(f"{group_label(group)} on {arch}")
            print("\n".join(f"  {name:<40} {config.label}" for name, config in named.items()))
        return 0
    if no_gpu("tune"):
        return 2
    from flashcute.bench.backends import select_backends
    from flashcute.bench.runner import Settings
    from flashcute.tools.side_by_side import time_side_by_side

    precompile(list(dict.fromkeys(c for named in configs.values() for c in named.values())), arch, args.jobs)
    names = list(next(iter(configs.values())))
    backends = [config_backend(name, family, configs) for name in names] + select_backends(args.backends)[0]
    settings = Settings(check=not args.no_check, rounds=args.rounds)
    pairs = [(name, "heuristic") for name in names[1:]]
    extra = {"kernel": args.kernel, "tries": names[1:], "grid": dataclasses.asdict(spec)}
    return time_side_by_side(shapes, backends, settings, pairs, args.out, extra)
