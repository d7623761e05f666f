"""Summarise an ncu source-page CSV (SASS): stall samples by reason and by opcode over the whole kernel."""

import collections
import csv
import sys


def load(path):
    """(header, rows as dicts) of `ncu -i R --page source --csv --print-source sass`."""
    with open(path) as f:
        rows = list(csv.reader(f))
    hdr_i = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr = rows[hdr_i]
    return hdr, [dict(zip(hdr, r, strict=True)) for r in rows[hdr_i + 1 :] if len(r) == len(hdr)]


def num(x):
    try:
        return float(x)
    except ValueError:
        return 0.0


def opcode(source):
    words = source.strip().split() or ["?"]
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def summary(path):
    hdr, rows = load(path)
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    tot, byop, byop_n = collections.Counter(), collections.Counter(), collections.Counter()
    inst = 0.0
    for d in rows:
        op = opcode(d["Source"])
        byop[op] += num(d["Warp Stall Sampling (All Samples)"])
        byop_n[op] += num(d["Instructions Executed"])
        inst += num(d["Instructions Executed"])
        for r in reasons:
            tot[r] += num(d[r])
    all_s = sum(tot.values())
    print(f"== {path}: samples {all_s:.0f}, warp instructions executed {inst / 1e6:.2f} M")
    print("  reasons:", ", ".join(f"{k[6:]} {v / all_s * 100:.1f}%" for k, v in tot.most_common(10)))
    by_op = (f"{k} {v / all_s * 100:.1f}%/{byop_n[k] / 1e6:.2f}" for k, v in byop.most_common(14))
    print("  by opcode (samples %, instr M):", ", ".join(by_op))


if __name__ == "__main__":
    for p in sys.argv[1:]:
        summary(p)
