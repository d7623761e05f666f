"""`flashcute power`: the energy of a forward call, from sustained launch loops of each backend while nvidia-smi
samples power and SM clock.

Why: at long sequences the H200 runs these kernels at its 700 W limit (nvidia-smi's throttle reason 0x4, software
power cap, in every sample), so a kernel that needs fewer cycles a tile but as much energy runs at a lower clock
and gains nothing. What decides there is the energy a call: the median power over a loop times the median call
time, printed as joules per PFLOP beside TFLOP/s and the SM clock. Each backend runs a loop of --seconds (its first
fifth dropped as the ramp), backends in turn, --repeats times, each repeat in bench.runner.round_order's order.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from flashcute.bench.command import add_grid_arguments, grid_from_flags, no_gpu
from flashcute.bench.grid import FULL, Shape, make_grid

GRID = dataclasses.replace(FULL, dtypes=("fp16",), headdims=(128,), causals=(False,), seqlens=(16384,))
SAMPLE_MS = 25


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description, parser.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--backends", default="flashcute-sm90,fa4", help="comma list, as in flashcute bench (default: %(default)s)"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each loop (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=2, help="loops of each backend, in turn (default: %(default)s)")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON")
    add_grid_arguments(parser, GRID)


def query_fields() -> str:
    """nvidia-smi's names for (power, SM clock, throttle reasons), newest spelling where this driver has it."""
    known = subprocess.run(["nvidia-smi", "--help-query-gpu"], capture_output=True, text=True).stdout
    power = "power.draw.instant" if "power.draw.instant" in known else "power.draw"
    reasons = (
        "clocks_event_reasons.active" if "clocks_event_reasons.active" in known else "clocks_throttle_reasons.active"
    )
    return f"timestamp,{power},clocks.sm,{reasons}"


def parse_samples(text: str) -> list[dict]:
    """nvidia-smi --format=csv,noheader,nounits lines of query_fields() as dicts; lines with a value that is not a
    number (N/A) are dropped."""
    samples = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            samples.append({"watts": float(parts[1]), "mhz": float(parts[2]), "reasons": int(parts[3], 16)})
        except ValueError:
            continue
    return samples


def summarize(samples: list[dict], call_ms: list[float], flop: float) -> dict:
    """Medians of a loop, its first fifth of samples and calls dropped: W, MHz, ms a call, TFLOP/s, J/PFLOP, and
    every throttle-reason bit mask seen."""
    samples, call_ms = samples[len(samples) // 5 :], call_ms[len(call_ms) // 5 :]
    watts = statistics.median(s["watts"] for s in samples)
    ms = statistics.median(call_ms)
    return {
        "watts": watts,
        "mhz": statistics.median(s["mhz"] for s in samples),
        "ms": ms,
        "tflops": flop / ms / 1e9,
        "joules_per_pflop": watts * ms / 1e3 / (flop / 1e15),
        "reasons": sorted({hex(s["reasons"]) for s in samples}),
        "samples": len(samples),
    }


def sustained_loop(call: Callable[[], object], seconds: float) -> tuple[list[dict], list[float]]:
    """Call ``call`` back to back for ``seconds`` while nvidia-smi samples every SAMPLE_MS; (samples, ms a call)."""
    import torch

    smi = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={query_fields()}", "--format=csv,noheader,nounits", "-lms", str(SAMPLE_MS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    events = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        stop.record()
        events.append((start, stop))
        if len(events) % 16 == 0:  # keep the queue short, so the loop ends when the GPU's work does
            stop.synchronize()
    torch.cuda.synchronize()
    smi.terminate()
    text, _ = smi.communicate()
    return parse_samples(text), [a.elapsed_time(b) for a, b in events]


def measure_point(backends: list, shape: Shape, seconds: float, repeats: int) -> list[dict]:
    """Every backend's sustained loop on one shape, backends in turn, ``repeats`` times; a row per loop."""
    from flashcute.bench.inputs import make_inputs
    from flashcute.bench.runner import round_order

    inputs = make_inputs(shape, with_grad=False)
    calls = {}
    for backend in backends:
        with backend.context():
            call = partial(backend.build(shape), inputs.q, inputs.k, inputs.v)
            call()  # compile and warm up outside the loop
        calls[backend.name] = (backend, call)
    rows = []
    for repeat in range(repeats):
        for name, (backend, call) in round_order(list(calls.items()), repeat):
            with backend.context():
                samples, call_ms = sustained_loop(call, seconds)
            row = {"backend": name, **dataclasses.asdict(shape), **summarize(samples, call_ms, shape.flops("fwd"))}
            rows.append(row)
            print(
                f"{name:16} {shape.label()}: {row['tflops']:6.1f} TFLOP/s  {row['watts']:5.0f} W  "
                f"{row['mhz']:5.0f} MHz  {row['joules_per_pflop']:.3f} J/PFLOP  reasons {' '.join(row['reasons'])}",
                flush=True,
            )
    return rows


def run(args: argparse.Namespace) -> int:
    """The loops of every point; 2 without a GPU."""
    if no_gpu("power"):
        return 2
    from flashcute.bench.backends import select_backends

    backends, _ = select_backends(args.backends)
    for backend in backends:
        if reason := backend.available():
            print(f"skipped {backend.name}: {reason}")
    backends = [backend for backend in backends if backend.available() is None]
    rows = [
        row
        for shape in make_grid(grid_from_flags(args, GRID))
        for row in measure_point(backends, shape, args.seconds, args.repeats)
    ]
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if rows else 1
