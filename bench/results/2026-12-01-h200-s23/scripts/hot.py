"""The instructions of an ncu source-page CSV with the most stall samples, in address order, with their top reasons."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from src import load, num

path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30
hdr, rows = load(path)
reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
all_s = sum(num(d["Warp Stall Sampling (All Samples)"]) for d in rows)
base = int(rows[0]["Address"], 16)
idx = sorted(range(len(rows)), key=lambda i: -num(rows[i]["Warp Stall Sampling (All Samples)"]))[:top]
for i in sorted(idx):
    d = rows[i]
    s = num(d["Warp Stall Sampling (All Samples)"])
    rs = sorted(((num(d[r]), r[6:]) for r in reasons), reverse=True)[:3]
    why = " ".join(f"{r}:{v / s * 100:.0f}" for v, r in rs if v)
    executed = num(d["Instructions Executed"]) / 1e6
    where = f"{int(d['Address'], 16) - base:6x} {s / all_s * 100:5.2f}% ex {executed:6.2f}M"
    print(f"{where}  {d['Source'].strip()[:70]:70s} {why}")
