"""#6's ratios (flashcute-sm90 / fa4) of several `flashcute bench` logs side by side, and how many are >= 1."""

import re
import sys
from pathlib import Path


def ratios(path: str) -> dict[tuple[str, ...], float]:
    rows = {}
    for section in re.split(r"^## ", Path(path).read_text(), flags=re.M)[1:]:
        match = re.match(r"(\w+) · D=(\d+) · (\S+)", section.splitlines()[0])
        if not match:
            continue
        table = [line for line in section.splitlines() if line.startswith("|")]
        columns = [c.strip() for c in table[0].strip("|").split("|")]
        for line in table[2:]:
            if "geomean" in line:
                continue
            values = dict(zip(columns, [c.strip() for c in line.strip("|").split("|")], strict=True))
            rows[(*match.groups(), values["L"])] = float(values["flashcute-sm90"]) / float(values["fa4"])
    return rows


def main() -> None:
    runs = [ratios(path) for path in sys.argv[1:]]
    for path, run in zip(sys.argv[1:], runs, strict=True):
        print(path, "met", sum(r >= 1 for r in run.values()), "of", len(run))
    for key in runs[0]:
        print(*key, *(f"{run[key]:.3f}" for run in runs))


if __name__ == "__main__":
    main()
