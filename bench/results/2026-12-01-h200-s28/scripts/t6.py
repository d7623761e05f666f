"""#6 table (flashcute-sm90 / fa4) from a flashcute bench log."""

import sys
from pathlib import Path

sys.path.insert(0, "bench/results/2026-12-01-h200-s22/scripts")
from tables import read_rows

met = 0
rows = read_rows(Path(sys.argv[1]).read_text())
for dtype, d, mask, v in rows:
    r = float(v["flashcute-sm90"]) / float(v["fa4"])
    met += r >= 1.0
    print(f"| {dtype} | {d} | {mask} | {v['L']} | {float(v['flashcute-sm90']):.0f} | {float(v['fa4']):.0f} | {r:.3f} |")
print(f"met {met} of {len(rows)}")
