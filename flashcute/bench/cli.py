"""`flashcute bench` (also `python -m flashcute.bench`): flags, the sweep under a progress bar, the outputs."""

import argparse
import dataclasses
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from flashcute.bench import meta
from flashcute.bench.backends import select_backends
from flashcute.bench.command import (
    add_grid_arguments,
    add_timing_arguments,
    comma_list,
    grid_from_flags,
    no_gpu,
    parse_size,
)
from flashcute.bench.flops import PASSES
from flashcute.bench.graphs import decode_graph
from flashcute.bench.grid import (
    DECODE,
    DECODE_QUICK,
    FULL,
    QUICK,
    VARLEN,
    VARLEN_QUICK,
    DecodePoint,
    DecodeSpec,
    GridSpec,
    VarlenSpec,
    make_grid,
    seqlen_label,
)
from flashcute.bench.host import first_calls, host_overheads
from flashcute.bench.plot import write_plots
from flashcute.bench.report import compare, render
from flashcute.bench.results import Results, Row
from flashcute.bench.runner import Settings, sweep

QUICK_TIMING_MS = (5.0, 20.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    grid = add_grid_arguments(parser, FULL, "grid (default: design.md's; each flag narrows or overrides it)")
    grid.add_argument("--quick", action="store_true", help="a tiny grid and short timing, for smoke tests")
    grid.add_argument(
        "--softcap",
        type=comma_list(float),
        help="comma list of caps (0: none) crossed with the grid, scores capped to softcap * tanh(score / softcap) "
        "(default: 0); backends that cannot cap report so",
    )
    grid.add_argument(
        "--sink",
        action="store_true",
        help="cross the grid with and without a learnable sink (one logit per query head in every row's softmax "
        "denominator, flash-attn-4's learnable_sink); backends that take none report so",
    )
    grid.add_argument(
        "--alibi",
        action="store_true",
        help="cross the grid with and without the ALiBi bias (geometric slopes 2^(-8 (h+1) / nheads)); backends "
        "that cannot bias the scores report so",
    )
    grid.add_argument(
        "--headdim-v",
        type=comma_list(parse_size, unique=False),
        help="v's head dim (DeepSeek-style: --headdim 192 --headdim-v 128), one for every --headdim or a comma list "
        "paired with --headdim in order (--headdim 192,192 --headdim-v 128,192: both; default: v as wide as q "
        "and k). FLOPs count 2 B H Lq Lk (D + Dv) a "
        "forward; backends that take v of one head dim only report so",
    )
    case = grid.add_mutually_exclusive_group()
    case.add_argument("--varlen", action="store_true", help=_varlen_help())
    case.add_argument("--decode", action="store_true", help=_decode_help())
    parser.add_argument("--pass", dest="pass_", choices=PASSES, default="fwd", help="what is timed (default: fwd)")
    parser.add_argument(
        "--backends",
        help="comma list (default: every one available): flashcute-<kernel>, fa4, sdpa-cudnn, sdpa-flash, "
        "sdpa-efficient, flex, sdpa-math, with --decode flashcute-<kernel>-func, and named only: "
        "flashcute-<kernel>-deterministic (deterministic=True). A name that cannot run is reported on each row",
    )
    parser.add_argument("--out", type=Path, help="where results.json, results.md, plots go (default: out/bench/<time>)")
    parser.add_argument("--compare", type=Path, metavar="OLD.json", help="also print the change against a saved run")
    parser.add_argument("--warmup", type=float, metavar="MS", help="warm-up per row, ms (default: 25; --quick: 5)")
    parser.add_argument("--repeats", type=float, metavar="MS", help="timing per row, ms (default: 100; --quick: 20)")
    add_timing_arguments(parser, rounds=1)


def _varlen_help() -> str:
    def case(spec: VarlenSpec) -> str:
        dense = f"{spec.dense_batch} x {seqlen_label(spec.tokens // spec.dense_batch)}"
        lengths = f"{spec.min_len}..{spec.max_len} tokens (a seeded draw)"
        return f"{spec.tokens:,} tokens in sequences of {lengths} beside {dense}"

    return (
        "time the packed variable-length case instead of the grid: per dtype (default: "
        f"{','.join(VARLEN.dtypes)}), head dim (default: {','.join(map(str, VARLEN.headdims))}) and mask, "
        f"{case(VARLEN)}, {VARLEN.nheads} heads: one flash_attn_varlen_func call against the dense call of as many "
        f"tokens (--quick: {case(VARLEN_QUICK)}, {VARLEN_QUICK.nheads} heads). --seqlen and --batch do not apply"
    )


def _decode_help() -> str:
    def point(p: DecodePoint) -> str:
        page = f" page {p.page_size}" if p.page_size else ""
        return f"Lq={p.seqlen_q} Lk={seqlen_label(p.seqlen_k)} B={p.batch}{page}{' causal' if p.causal else ''}"

    def case(spec: DecodeSpec) -> str:
        return f"{spec.nheads} query heads over {spec.nheads_k} K/V heads: {'; '.join(map(point, spec.points))}"

    return (
        "time decoding instead of the grid: a few new query rows per sequence against a long K/V cache "
        "(flash_attn_with_kvcache; a paged cache through a block table of randomly permuted pages), in TB/s of K "
        f"and V read, per dtype (default: {','.join(DECODE.dtypes)}) and head dim (default: "
        f"{','.join(map(str, DECODE.headdims))}); --causal keeps the shapes of that mask. {case(DECODE)}. --quick: "
        f"{case(DECODE_QUICK)}. Also times one decode step (append and attend) in a CUDA graph against the "
        "attention alone. --seqlen, --batch and --nheads do not apply; forward only"
    )


def grid_spec(args: argparse.Namespace) -> GridSpec | VarlenSpec | DecodeSpec:
    if args.varlen:
        return grid_from_flags(args, VARLEN_QUICK if args.quick else VARLEN)
    if args.decode:
        return grid_from_flags(args, DECODE_QUICK if args.quick else DECODE)
    spec = grid_from_flags(args, QUICK if args.quick else FULL)
    variants = {
        "softcaps": args.softcap,
        "sinks": (False, True) if args.sink else None,
        "alibis": (False, True) if args.alibi else None,
        "headdims_v": args.headdim_v,
    }
    return dataclasses.replace(spec, **{name: value for name, value in variants.items() if value})


def grid_meta(spec: GridSpec | VarlenSpec | DecodeSpec) -> dict:
    """The spec as results.json records it: a dense grid's headdims_v only where v's head dim was given."""
    fields = dataclasses.asdict(spec)
    if "headdims_v" in fields and not fields["headdims_v"]:
        del fields["headdims_v"]
    return fields


def refusal(args: argparse.Namespace) -> str | None:
    """Why the flags cannot run together, or None."""
    if args.varlen and (args.seqlen or args.batch):
        return "--varlen sets its own lengths and batch; drop --seqlen and --batch"
    if args.decode and (args.seqlen or args.batch or args.nheads):
        return "--decode sets its own shapes; drop --seqlen, --batch and --nheads"
    given = {"--softcap": args.softcap, "--sink": args.sink, "--alibi": args.alibi, "--headdim-v": args.headdim_v}
    variants = [flag for flag, value in given.items() if value]
    if (args.varlen or args.decode) and variants:
        if len(variants) == 1:
            return f"{variants[0]} applies to the dense grid; drop --varlen or --decode"
        return f"{', '.join(variants[:-1])} and {variants[-1]} apply to the dense grid; drop --varlen or --decode"
    if args.headdim_v and len(args.headdim_v) not in (1, len(headdims := grid_spec(args).headdims)):
        counts = f"--headdim-v gives {len(args.headdim_v)} head dims for {len(headdims)} of --headdim"
        return f"{counts} ({','.join(map(str, headdims))}); give one, or one per --headdim"
    if args.decode and args.pass_ != "fwd":
        return "--decode times inference (flash_attn_with_kvcache has no backward); drop --pass"
    return None


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
    """The sweep; 0 when any row was timed, 1 when none could be, 2 without a GPU, with an unreadable --compare or
    with --varlen or --decode and a flag it does not take."""
    if why := refusal(args):
        print(f"flashcute bench: {why}", file=sys.stderr)
        return 2
    if no_gpu("bench"):
        return 2
    try:
        old = Results.load(args.compare) if args.compare else None
    except (OSError, ValueError, KeyError) as exc:
        print(f"flashcute bench: cannot read --compare {args.compare}: {exc}", file=sys.stderr)
        return 2
    spec, config = grid_spec(args), settings(args)
    shapes = make_grid(spec)
    backends, skipped = select_backends(args.backends, decode=args.decode)
    out_dir = args.out or Path("out/bench") / datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    extra = {"pass": config.pass_, "settings": dataclasses.asdict(config), "grid": grid_meta(spec)}
    results = Results(meta.collect({**extra, "skipped_backends": skipped}))
    if not (args.varlen or args.decode):  # tiny dense calls: the default grid's run gives these figures
        results.host_overhead_us = host_overheads(backends, shapes[0])
        if not args.quick:  # a fresh process per backend and cache state: about a minute
            results.first_call_s = first_calls(backends, shapes[0])
    for row in progress(sweep(shapes, backends, config), total=len(shapes) * len(backends)):
        results.rows.append(row)
        results.save(out_dir / "results.json")  # after every row: an interrupted run keeps what it measured
    if args.decode:  # after the sweep: a capture that goes wrong cannot cost the rows measured
        results.decode_graph = decode_graph(backends, shapes, config)
        results.save(out_dir / "results.json")
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
