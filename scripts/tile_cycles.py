"""Tile cycles of the Hopper forward: the SM clock cycles each tile takes (Sm90FwdConfig.trace_tiles), for the
heuristic's config and for variants of it, in one table.

    python scripts/tile_cycles.py [--headdim 64,128,256] [--seqlen 16384] [--causal no,yes]
        [--dtype bfloat16,float16] [--variant NAME=JSON ...] [--out OUT.json]

A variant is a name and Sm90FwdConfig fields to replace in the heuristic's config, as JSON: for example
``--variant base={} --variant sums4='{"sum_chains": 4}'`` (the first is the reference of the ratios). Each variant
runs in its own process, which compiles its kernels while the others do, then takes a lock to launch them alone on
the GPU. B = 16384 / L, H = 2048 / D, as in the benchmark grid.

Why tile cycles: a kernel's time at the 700 W cap moves with the clock (a kernel that does its work in fewer cycles
draws more power and runs at a lower clock), and readings of one kernel spread by 2-3 % from run to run; the median
cycles of a launch's tiles (2048 of them at D=128) repeat to about 0.1 %, so the order of a step's work, which moves
it by 1-3 %, can be told apart (config.STEP_ORDER_NOTE). TFLOP/s still decide: confirm with scripts/ab_inprocess.py.
"""

import argparse
import dataclasses
import fcntl
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from flashcute import compile_cache
from flashcute.config import sm90_fwd_config
from flashcute.interface import _num_sms, device_arch
from flashcute.kernels.build import compile_fwd
from flashcute.kernels.common.trace import RECORD_WORDS, counter_words


def wrapped(later: torch.Tensor, earlier: torch.Tensor) -> torch.Tensor:
    """later - earlier for 32-bit counters that may have wrapped between the two readings."""
    return (later - earlier) % (1 << 32)


def summarize(records: torch.Tensor) -> dict:
    """Statistics of a launch's (tiles, RECORD_WORDS) int64 records (kernels/common/trace.py's layout)."""
    assert bool((records[:, 5] == 1).all()), "a tile left no record"
    cycles = wrapped(records[:, 2], records[:, 1]).double()
    nanoseconds = wrapped(records[:, 4], records[:, 3]).double()
    first = records[:, 3].min()
    span = wrapped(records[:, 4], first).max().item()
    return {
        "tiles": len(records),
        "cycles_median": cycles.median().item(),
        "cycles_p10": cycles.quantile(0.1).item(),
        "cycles_p90": cycles.quantile(0.9).item(),
        "clock_mhz": (cycles / nanoseconds * 1000).median().item(),
        "span_us": span / 1000,
    }


def time_variant(overrides: dict, shapes: list[tuple[int, int, bool, str]], lock_path: str) -> list[dict]:
    """Compile every shape's kernel with ``overrides``, then, holding the lock, launch each and summarize."""
    runs = []
    for d, seqlen, causal, dtype in shapes:
        config = sm90_fwd_config(d, dtype, causal=causal)
        config = dataclasses.replace(config, **{**overrides, "claim_tiles": True, "trace_tiles": True})
        batch, heads = 16384 // seqlen, 2048 // d
        q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=getattr(torch, dtype)) for _ in "qkv")
        out, lse = torch.empty_like(q), torch.empty(batch, heads, seqlen, device="cuda")
        num_tiles = -(-seqlen // config.block_m) * heads * batch
        counter = torch.zeros(counter_words(num_tiles), dtype=torch.int32, device="cuda")
        arch = device_arch(q.device)
        kernel = compile_cache.get_compiled(arch, config, lambda c=config, a=arch: compile_fwd(c, a))
        grid = config.grid_limit(seqlen, _num_sms(torch.cuda.current_device()))
        args = (q, k, v, out, lse, counter, 1 / math.sqrt(d), 0, -1, 0 if causal else -1, grid)
        runs.append(((d, seqlen, causal, dtype), kernel, args, counter, num_tiles))
    results = []
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for shape, kernel, args, counter, num_tiles in runs:
            launches = []
            for i in range(5):  # two to warm up, three kept
                counter.zero_()
                kernel(*args)
                torch.cuda.synchronize()
                if i >= 2:
                    launches.append(summarize(counter[1:].view(num_tiles, RECORD_WORDS).cpu().long()))
            middle = sorted(launches, key=lambda s: s["cycles_median"])[1]
            spread = max(s["cycles_median"] for s in launches) / min(s["cycles_median"] for s in launches) - 1
            keys = ("headdim", "seqlen", "causal", "dtype")
            results.append(dict(zip(keys, shape, strict=True), **middle, spread=spread))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--headdim", default="64,128,256")
    parser.add_argument("--seqlen", default="16384")
    parser.add_argument("--causal", default="no,yes")
    parser.add_argument("--dtype", default="bfloat16,float16")
    parser.add_argument("--variant", action="append", default=[], help="NAME=JSON of Sm90FwdConfig fields")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", nargs=2, metavar=("OVERRIDES", "LOCK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = [
        (d, seqlen, causal == "yes", dtype)
        for d in map(int, args.headdim.split(","))
        for causal in args.causal.split(",")
        for dtype in args.dtype.split(",")
        for seqlen in map(int, args.seqlen.split(","))
    ]
    if args.worker:
        overrides, lock_path = args.worker
        for result in time_variant(json.loads(overrides), shapes, lock_path):
            print(json.dumps(result), flush=True)
        return

    variants = dict(v.split("=", 1) for v in args.variant) or {"heuristic": "{}"}
    forwarded = [f"--{name}={getattr(args, name)}" for name in ("headdim", "seqlen", "causal", "dtype")]
    lock_path = str(Path(tempfile.gettempdir()) / "flashcute-tile-cycles.lock")
    workers = {
        name: subprocess.Popen(
            [sys.executable, "-P", __file__, *forwarded, "--worker", overrides, lock_path],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name, overrides in variants.items()
    }
    results = {}
    for name, worker in workers.items():
        output, _ = worker.communicate()
        results[name] = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
        if worker.returncode:
            print(f"variant {name} failed (exit {worker.returncode})", file=sys.stderr)
    reference = next(iter(results.values()))
    names = list(results)
    print("tile cycles (median of a launch's tiles), then each variant's ratio to the first:")
    print(f"{'D':>4} {'causal':>6} {'dtype':>9} {'L':>6} {names[0]:>12}" + "".join(f"{n:>12}" for n in names[1:]))
    for i, ref in enumerate(reference):
        cells = "".join(
            f"{results[n][i]['cycles_median'] / ref['cycles_median']:12.4f}" if i < len(results[n]) else f"{'-':>12}"
            for n in names[1:]
        )
        causal = "yes" if ref["causal"] else "no"
        row = f"{ref['headdim']:>4} {causal:>6} {ref['dtype']:>9} {ref['seqlen']:>6} {ref['cycles_median']:>12.0f}"
        print(row + cells)
    spreads = [
        f"{n} {statistics.median(r['clock_mhz'] for r in rows):.0f} MHz, {max(r['spread'] for r in rows):.4f}"
        for n, rows in results.items()
        if rows
    ]
    print("(SM clock, spread of three launches: " + "; ".join(spreads) + ")")
    if args.out:
        args.out.write_text(json.dumps({"variants": variants, "results": results}, indent=1))


if __name__ == "__main__":
    main()
