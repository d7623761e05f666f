"""Warp-stall samples of the hot step loop, from `ncu --import R.ncu-rep --page source --csv --print-source sass`
(gzipped as WHO-sass.csv.gz): the loop around the most sampled `WARPGROUP.DEPBAR.LE gsb0, 0x1`, its barrier,
wait, TMA-barrier and HGMMA instructions one a line, the runs of other instructions between them summed.
Usage: python seg.py ours fa4 smx (percentages of all the kernel's samples)."""

import csv
import gzip
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
KEY = re.compile(r"BAR\.|DEPBAR|SYNCS|WARPGROUP\.ARRIVE|BRA|HGMMA|EXIT")


def load(path: str) -> list[dict]:
    with gzip.open(path, "rt") as f:
        rows = list(csv.reader(f))
    header = rows[1]
    return [dict(zip(header, r, strict=True)) for r in rows[2:] if len(r) == len(header)]


def samples(row: dict) -> int:
    return int(row[SAMPLES] or 0)


def step_range(data: list[dict]) -> tuple[int, int]:
    """From a dozen instructions before the step's turn barrier to the loop's backward branch."""
    wait_s = max(
        (i for i, d in enumerate(data) if "DEPBAR.LE gsb0, 0x1" in d["Source"]), key=lambda i: samples(data[i])
    )
    lo = max(i for i in range(wait_s) if "BAR.SYNC" in data[i]["Source"]) - 12
    top = int(data[lo + 12]["Address"], 16)
    hi = wait_s + 1
    while True:
        target = re.search(r"BRA (0x[0-9a-f]+)", data[hi]["Source"])
        if target and int(target.group(1), 16) <= top:
            return lo, hi
        hi += 1


def show(who: str) -> None:
    data = load(f"{who}-sass.csv.gz")
    total = sum(samples(d) for d in data)
    lo, hi = step_range(data)
    print(f"== {who}: total samples {total}; step lines {lo}..{hi} ({hi - lo + 1} instructions)")
    run_samples = run_length = in_step = 0
    for d in data[lo : hi + 1]:
        s = samples(d)
        in_step += s
        src = re.sub(r"\s+", " ", d["Source"].strip())
        if KEY.search(" ".join(src.split(" ")[:2])):
            if run_length:
                print(f"      {run_length:4} instrs {run_samples / total * 100:6.2f}%")
            run_samples = run_length = 0
            print(f"   {s / total * 100:6.2f}%  {src[:90]}")
        else:
            run_samples += s
            run_length += 1
    if run_length:
        print(f"      {run_length:4} instrs {run_samples / total * 100:6.2f}%")
    print(f"   step total {in_step / total * 100:.1f}% of samples")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        show(name)
