"""Backends timed side by side in one process, shape after shape, and the ratios between them: the loop that
`flashcute compare` and `flashcute tune` share.

Separate processes read the same kernel apart by several per cent (the GPU's clock and power state differ from one
run to the next); timed in turn in one process, every backend sees the same conditions. bench.runner.sweep does
the work: each backend checked against the float64 spec on its group's first shape, then timed settings.rounds
times, each round in another order (round_order: every backend right after every other equally often), and the
median kept.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

from flashcute.bench import meta
from flashcute.bench.backends import Backend
from flashcute.bench.grid import Shape
from flashcute.bench.report import speedup
from flashcute.bench.results import Results, Row
from flashcute.bench.runner import Settings, sweep

Pair = tuple[str, str]
"""(mine, other): the backends whose TFLOP/s ratio mine / other is reported."""


def time_side_by_side(
    shapes: list[Shape], backends: list[Backend], settings: Settings, pairs: list[Pair], out: Path, extra: dict
) -> int:
    """Print a line per shape (each backend's TFLOP/s, each pair's ratio) and, last, each ratio's min, median and
    max over the shapes; write the rows, ``extra`` in the metadata and that summary to ``out`` after every shape.
    0 when any row was timed, else 1."""
    results = Results(meta.collect({**extra, "settings": dataclasses.asdict(settings)}))
    ratios: dict[Pair, list[float]] = {pair: [] for pair in pairs}
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = iter(sweep(shapes, backends, settings))
    for point in zip(*[rows] * len(backends), strict=True):  # sweep yields a shape's rows together, in order
        results.rows += point
        by_name = {row.backend: row for row in point}
        point_ratios = {pair: speedup(by_name[pair[0]], by_name[pair[1]]) for pair in pairs}
        for pair, ratio in point_ratios.items():
            if ratio is not None:
                ratios[pair].append(ratio)
        print(point_lines(point, point_ratios), flush=True)
        out.write_text(json.dumps({**results.to_dict(), "summary": summary(ratios)}, indent=1) + "\n")
    for name, spread in summary(ratios).items():
        if spread["points"]:
            print(
                f"{name} over {spread['points']} points: min {spread['min']:.3f}  median {spread['median']:.3f}  "
                f"max {spread['max']:.3f}"
            )
        else:
            print(f"{name}: measured at no point")
    print(f"wrote {out}")
    return 0 if any(row.ms is not None for row in results.rows) else 1


def point_lines(rows: tuple[Row, ...], ratios: dict[Pair, float | None]) -> str:
    """The shape, each backend's TFLOP/s (or its status; with several rounds, in brackets their spread, Row.spread)
    and each ratio on one line; below it why a row has no time or failed the check."""
    timings = "  ".join(
        f"{row.backend} {row.tflops:.1f}{'' if row.spread is None else f' ({row.spread:.0%})'}"
        if row.status == "ok"
        else f"{row.backend} {row.status}"
        for row in rows
    )
    shown = "  ".join(f"{mine}/{other} {'-' if r is None else f'{r:.3f}'}" for (mine, other), r in ratios.items())
    notes = [f"  {row.backend} {row.status}: {row.reason}" for row in rows if row.reason]
    return "\n".join([f"{rows[0].shape.label()} | {timings} | {shown}", *notes])


def summary(ratios: dict[Pair, list[float]]) -> dict[str, dict]:
    """Each pair's "mine/other": over how many points its ratio was measured, and the min, median and max."""
    return {
        f"{mine}/{other}": {
            "points": len(values),
            **({"min": min(values), "median": statistics.median(values), "max": max(values)} if values else {}),
        }
        for (mine, other), values in ratios.items()
    }
