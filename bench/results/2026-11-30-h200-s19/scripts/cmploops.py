import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopmix import loops

pfx = sys.stdin.read().split()
for dt in ("float16", "bfloat16"):
    for d in (64, 128, 192, 256):
        for c in (0, 1):
            row = []
            for p in pfx:
                f = f"/tmp/{p}-{dt}-{d}-{c}/k.sass"
                try:
                    ls = loops(f)
                    with open(f) as listing:
                        tot = sum(1 for x in listing if re.match(r"\s*/\*[0-9a-f]+\*/", x))
                    row.append(
                        f"{[len(b) for b in ls][:4]} r2ur={[sum('R2UR' in x for x in b) for b in ls][:4]} tot={tot}"
                    )
                except Exception:
                    row.append("ERR")
            print(dt, d, c, " | ".join(row))
