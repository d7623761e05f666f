"""Print scripts/tune.py's JSON lines (a file of them, argv[1]) one line a point, with the largest error."""

import json
import sys

KEYS = ("dtype", "headdim", "causal", "seqlen")
with open(sys.argv[1]) as lines:
    rows = [json.loads(line) for line in lines if line.startswith("{")]
for row in rows:
    errors = max(v for k, v in row.items() if k.startswith("error"))
    timings = " ".join(f"{k}={v}" for k, v in row.items() if not k.startswith("error") and k not in KEYS)
    mask = "causal" if row["causal"] else "nc"
    print(row["dtype"][:4], row["headdim"], mask, row["seqlen"], f"maxerr={errors:.1e}", timings)
