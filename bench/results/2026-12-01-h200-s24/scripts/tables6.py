import re, sys
for path in sys.argv[1:]:
    text = open(path).read()
    rows = {}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        m = re.match(r"(\w+) · D=(\d+) · (\S+)", section.splitlines()[0])
        if not m: continue
        table = [l for l in section.splitlines() if l.startswith("|")]
        cols = [c.strip() for c in table[0].strip("|").split("|")]
        for line in table[2:]:
            if "geomean" in line: continue
            v = dict(zip(cols, [c.strip() for c in line.strip("|").split("|")]))
            rows[(m.group(1), m.group(2), m.group(3), v["L"])] = float(v["flashcute-sm90"]) / float(v["fa4"])
    print(path, "met", sum(r >= 1 for r in rows.values()), "of", len(rows))
    globals().setdefault("allrows", []).append(rows)
for k in allrows[0]:
    print(*k, *(f"{r[k]:.3f}" for r in allrows))
