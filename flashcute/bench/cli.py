"""`flashcute bench` (also `python -m flashcute.bench`): flags, the sweep under a progress bar, the outputs."""

import argparse
import dataclasses
import sys
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import torch

from flashcute.bench import meta
from flashcute.bench.backends import select_backends
from flashcute.bench.grid import DTYPES, FULL, QUICK, GridSpec, make_grid
from flashcute.bench.passes import PASSES
from flashcute.bench.plot import write_plots
from flashcute.bench.report import compare, render
from flashcute.bench.results import Results, Row
from flashcute.bench.runner import Settings, host_overheads, sweep

T = TypeVar("T")
BOOLS = {"no": False, "false": False, "0": False, "yes": True, "true": True, "1": True}
QUICK_TIMING_MS = (5.0, 20.0)
NO_GPU = (
    "flashcute bench: no CUDA GPU here (torch {} reports torch.cuda.is_available() == False). "
    "The benchmark times GPU kernels; run it on a machine with an NVIDIA GPU."
)


def comma_list(parse_item: Callable[[str], T]) -> Callable[[str], tuple[T, ...]]:
    """An argparse type for "a,b,c": each item parsed, duplicates dropped, order kept."""

    def parse(text: str) -> tuple[T, ...]:
        try:
            items = tuple(dict.fromkeys(parse_item(item.strip()) for item in text.split(",") if item.strip()))
        except (KeyError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc
        if not items:
            raise argparse.ArgumentTypeError(f"{text!r} names nothing")
        return items

    return parse


def parse_dtype(text: str) -> str:
    if text not in DTYPES:
        raise ValueError(f"dtype {text!r} is not one of {', '.join(DTYPES)}")
    return text


def parse_size(text: str) -> int:
    """A positive int, with k for 1024: "4k" -> 4096."""
    value = int(text[:-1]) * 1024 if text.lower().endswith("k") else int(text)
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive size")
    return value


def parse_causal(text: str) -> bool:
    if text.lower() not in BOOLS:
        raise ValueError(f"causal {text!r} is not one of {', '.join(BOOLS)}")
    return BOOLS[text.lower()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    grid = parser.add_argument_group("grid (default: design.md's; each flag narrows or overrides it)")
    grid.add_argument("--dtype", type=comma_list(parse_dtype), help="comma list of bf16, fp16 (default: both)")
    grid.add_argument("--headdim", type=comma_list(parse_size), help="comma list (default: 64,128,256)")
    grid.add_argument("--causal", type=comma_list(parse_causal), help="comma list of no, yes (default: no,yes)")
    grid.add_argument("--seqlen", type=comma_list(parse_size), help="comma list, k = 1024 (default: 1k,2k,4k,8k,16k)")
    grid.add_argument("--batch", type=parse_size, help="batch for every seqlen (default: 16384 // seqlen)")
    grid.add_argument("--nheads", type=parse_size, help="heads for every headdim (default: 2048 // headdim)")
    grid.add_argument("--quick", action="store_true", help="a tiny grid and short timing, for smoke tests")
    parser.add_argument("--pass", dest="pass_", choices=PASSES, default="fwd", help="what is timed (default: fwd)")
    parser.add_argument(
        "--backends",
        help="comma list (default: every one available): flashcute-<kernel>, fa4, sdpa-cudnn, sdpa-flash, "
        "sdpa-efficient, flex, sdpa-math. A name that cannot run is reported on each row",
    )
    parser.add_argument("--out", type=Path, help="where results.json, results.md, plots go (default: out/bench/<time>)")
    parser.add_argument("--compare", type=Path, metavar="OLD.json", help="also print the change against a saved run")
    parser.add_argument("--warmup", type=float, metavar="MS", help="warm-up per row, ms (default: 25; --quick: 5)")
    parser.add_argument("--repeats", type=float, metavar="MS", help="timing per row, ms (default: 100; --quick: 20)")
    parser.add_argument(
        "--rounds",
        type=parse_size,
        default=1,
        help="time the backends of a shape this many times, in turn (each round in another order, every backend "
        "after every other), and keep each one's median (default: 1)",
    )
    parser.add_argument("--no-check", action="store_true", help="skip the correctness check against float64")


def grid_spec(args: argparse.Namespace) -> GridSpec:
    overrides = {
        "dtypes": args.dtype,
        "headdims": args.headdim,
        "causals": args.causal,
        "seqlens": args.seqlen,
        "batch": args.batch,
        "nheads": args.nheads,
    }
    base = QUICK if args.quick else FULL
    return dataclasses.replace(base, **{name: value for name, value in overrides.items() if value is not None})


def settings(args: argparse.Namespace) -> Settings:
    default = Settings()
    warmup, repeats = QUICK_TIMING_MS if args.quick else (default.warmup_ms, default.rep_ms)
    return Settings(
        pass_=args.pass_,
        warmup_ms=args.warmup if args.warmup is not None else warmup,
        rep_ms=args.repeats if args.repeats is not None else repeats,
        check=not args.no_check,
        rounds=args.rounds,
    )


def progress(rows: Iterator[Row], total: int) -> Iterator[Row]:
    """A tqdm bar over the sweep (when tqdm is installed); wrong and failed rows are also printed as they come."""
    try:
        from tqdm import tqdm
    except ImportError:
        yield from rows
        return
    with tqdm(total=total, unit="row", dynamic_ncols=True) as bar:
        for row in rows:
            bar.set_postfix_str(f"{row.backend} {row.shape.label()}", refresh=False)
            if row.status in ("wrong", "failed"):
                bar.write(f"{row.backend} {row.shape.label()}: {row.status}: {row.reason}")
            bar.update()
            yield row


def run(args: argparse.Namespace) -> int:
    """The sweep; 0 when any row was timed, 1 when none could be, 2 without a GPU or with an unreadable --compare."""
    if not torch.cuda.is_available():
        print(NO_GPU.format(torch.__version__), file=sys.stderr)
        return 2
    try:
        old = Results.load(args.compare) if args.compare else None
    except (OSError, ValueError, KeyError) as exc:
        print(f"flashcute bench: cannot read --compare {args.compare}: {exc}", file=sys.stderr)
        return 2
    spec, config = grid_spec(args), settings(args)
    shapes = make_grid(spec)
    backends, skipped = select_backends(args.backends)
    out_dir = args.out or Path("out/bench") / datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    extra = {"pass": config.pass_, "settings": dataclasses.asdict(config), "grid": dataclasses.asdict(spec)}
    results = Results(meta.collect({**extra, "skipped_backends": skipped}))
    results.host_overhead_us = host_overheads(backends, shapes[0], config.pass_)
    for row in progress(sweep(shapes, backends, config), total=len(shapes) * len(backends)):
        results.rows.append(row)
        results.save(out_dir / "results.json")  # after every row: an interrupted run keeps what it measured
    report = render(results) + (compare(old, results) if old else "")
    print(report)
    (out_dir / "results.md").write_text(report)
    write_plots(results, out_dir)
    print(f"wrote {out_dir}/results.json, results.md and plots", file=sys.stderr)
    return 0 if any(row.ms is not None for row in results.rows) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashcute bench", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
