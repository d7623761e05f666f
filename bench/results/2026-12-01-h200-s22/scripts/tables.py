"""The #3 and #6 tables (markdown rows, ratios to three places) from a `flashcute bench` log."""

import re
import sys
from pathlib import Path

SM80_TARGET = {64: 1.1, 128: 1.15, 256: 1.1}


def read_rows(text: str) -> list[tuple[str, int, str, dict[str, str]]]:
    rows = []
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        match = re.match(r"(\w+) · D=(\d+) · (\S+)", section.splitlines()[0])
        if not match:
            continue
        dtype, d, mask = match.groups()
        table = [line for line in section.splitlines() if line.startswith("|")]
        columns = [c.strip() for c in table[0].strip("|").split("|")]
        for line in table[2:]:
            if "geomean" not in line:
                cells = [c.strip() for c in line.strip("|").split("|")]
                rows.append((dtype, int(d), mask, dict(zip(columns, cells, strict=True))))
    return rows


def main() -> None:
    rows = read_rows(Path(sys.argv[1]).read_text())
    met = [0, 0]
    print("#3: flashcute-sm80 / sdpa-flash")
    for dtype, d, mask, v in rows:
        if v["L"] != "1k":
            ratio = float(v["flashcute-sm80"]) / float(v["sdpa-flash"])
            ok = ratio >= SM80_TARGET[d]
            met[0] += ok
            cells = [dtype, d, mask, v["L"], f"{float(v['flashcute-sm80']):.0f}", f"{float(v['sdpa-flash']):.0f}"]
            cells += [f"{ratio:.3f}", f"{SM80_TARGET[d]} {'met' if ok else 'not met'}"]
            print("| " + " | ".join(map(str, cells)) + " |")
    print(f"met {met[0]}\n#6: flashcute-sm90 / fa4")
    for dtype, d, mask, v in rows:
        ratio = float(v["flashcute-sm90"]) / float(v["fa4"])
        met[1] += ratio >= 1.0
        cells = [dtype, d, mask, v["L"], f"{float(v['flashcute-sm90']):.0f}", f"{float(v['fa4']):.0f}", f"{ratio:.3f}"]
        print("| " + " | ".join(map(str, cells)) + " |")
    print(f"met {met[1]}")


if __name__ == "__main__":
    main()
