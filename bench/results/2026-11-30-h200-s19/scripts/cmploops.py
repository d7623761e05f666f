import sys, re
sys.argv = ['x']
exec(open('/work/main/.scratch/s19/loopmix.py').read().split('res = ')[0])
pfx = sys.stdin.read().split()
import itertools
for dt in ("float16", "bfloat16"):
    for d in (64, 128, 192, 256):
        for c in (0, 1):
            row = []
            for p in pfx:
                f = f"/tmp/{p}-{dt}-{d}-{c}/k.sass"
                try:
                    ls = loops(f)
                    tot = sum(1 for x in open(f) if re.match(r"\s*/\*[0-9a-f]+\*/", x))
                    row.append(f"{[len(b) for b in ls][:4]} r2ur={[sum('R2UR' in x for x in b) for b in ls][:4]} tot={tot}")
                except Exception as e:
                    row.append("ERR")
            print(dt, d, c, " | ".join(row))
