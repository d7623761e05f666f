"""Energy a forward call: sustained launch loops of each backend while nvidia-smi samples power and SM clock.

    python -P scripts/power_loop.py [--backends flashcute-sm90,fa4] [--headdim 128] [--seqlen 16384]
        [--causal no[,yes]] [--dtype fp16[,bf16]] [--seconds 3] [--repeats 2] [--out OUT.json]

Why: at long sequences the H200 runs these kernels at its 700 W limit (nvidia-smi's throttle reason 0x4, software
power cap, in every sample), so a kernel that needs fewer cycles a tile but the same energy runs at a lower clock
and gains nothing (docs/perf-notes.md, stop 18). What decides there is the energy a call: the median power over a
loop times the median call time, printed as joules per PFLOP beside TFLOP/s and the SM clock. Each backend runs a
loop of --seconds (its first fifth dropped as the ramp), backends in turn, --repeats times, each repeat in
bench.runner.round_order's order. B = 16384 / L, H = 2048 / D, as in the benchmark grid.
"""

import argparse
import json
import statistics
import subprocess
import time
from functools import partial
from pathlib import Path


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


def sustained_loop(call, seconds: float) -> tuple[list[dict], list[float]]:
    """Call ``call`` back to back for ``seconds`` while nvidia-smi samples every 25 ms; (samples, ms a call)."""
    import torch

    smi = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={query_fields()}", "--format=csv,noheader,nounits", "-lms", "25"],
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


def measure_point(backends: list, shape, seconds: float, repeats: int) -> list[dict]:
    """Every backend's sustained loop on one shape, backends in turn, ``repeats`` times; a row per loop."""
    import torch

    from flashcute.bench.runner import round_order

    q, k, v = (
        torch.randn(shape.batch, shape.seqlen, shape.nheads, shape.headdim, device="cuda", dtype=shape.torch_dtype)
        for _ in "qkv"
    )
    calls = {}
    for backend in backends:
        with backend.context():
            call = partial(backend.build(shape), q, k, v)
            call()  # compile and warm up outside the loop
        calls[backend.name] = (backend, call)
    rows = []
    for repeat in range(repeats):
        for name, (backend, call) in round_order(list(calls.items()), repeat):
            with backend.context():
                samples, call_ms = sustained_loop(call, seconds)
            row = {"backend": name, "dtype": shape.dtype, "headdim": shape.headdim, "causal": shape.causal}
            rows.append({**row, "seqlen": shape.seqlen, **summarize(samples, call_ms, shape.flops("fwd"))})
            mask = "causal" if shape.causal else "nc"
            print(
                f"{name:16} {shape.dtype} D{shape.headdim:<3} {mask:6} {shape.seqlen:>6}: {rows[-1]['tflops']:6.1f} "
                f"TFLOP/s  {rows[-1]['watts']:5.0f} W  {rows[-1]['mhz']:5.0f} MHz  "
                f"{rows[-1]['joules_per_pflop']:.3f} J/PFLOP  reasons {' '.join(rows[-1]['reasons'])}",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="flashcute-sm90,fa4")
    parser.add_argument("--headdim", default="128")
    parser.add_argument("--seqlen", default="16384")
    parser.add_argument("--causal", default="no", help="which masks, comma-separated: no, yes or no,yes")
    parser.add_argument("--dtype", default="fp16", help="which dtypes, comma-separated: bf16, fp16 or bf16,fp16")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from flashcute.bench.backends import select_backends
    from flashcute.bench.grid import DTYPES, Shape

    dtypes, masks = args.dtype.split(","), args.causal.split(",")
    if unknown := [d for d in dtypes if d not in DTYPES] + [m for m in masks if m not in ("no", "yes")]:
        parser.error(f"--dtype takes {', '.join(DTYPES)} and --causal no, yes (comma-separated); got {unknown}")

    backends, _ = select_backends(args.backends)
    for backend in backends:
        if reason := backend.available():
            print(f"skipped {backend.name}: {reason}")
    backends = [backend for backend in backends if backend.available() is None]
    rows = []
    for dtype in dtypes:
        for d in map(int, args.headdim.split(",")):
            for causal in (m == "yes" for m in masks):
                for seqlen in map(int, args.seqlen.split(",")):
                    shape = Shape(dtype, d, causal, seqlen, 16384 // seqlen, 2048 // d)
                    rows += measure_point(backends, shape, args.seconds, args.repeats)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
