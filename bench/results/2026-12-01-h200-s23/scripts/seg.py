"""The Hopper forward's step loop (nvdisasm text, the first loop with 16 HGMMA): its opcode counts between the
wgmma waits, or with --seq its MMAs, barriers and waits in order with the counts between them."""

import collections
import re
import sys


def loops(lines):
    """(start, end) line spans of the backward branches."""
    labels = {}
    for i, line in enumerate(lines):
        m = re.match(r"^\.(L_x_\d+):", line.strip())
        if m:
            labels[m.group(1)] = i
    spans = []
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s+(?:`\()?\.?(L_x_\d+)", line)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            spans.append((labels[m.group(1)], i))
    return spans


def step_body(path):
    with open(path) as f:
        lines = f.read().splitlines()
    spans = [s for s in loops(lines) if sum("HGMMA" in line for line in lines[s[0] : s[1]]) == 16]
    start, end = min(spans)
    body = [re.sub(r"/\*.*?\*/", "", line).strip().rstrip(";").strip() for line in lines[start : end + 1]]
    return [b for b in body if b and not b.startswith(".")]


def base_opcode(instruction):
    words = instruction.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def seg(path):
    body = step_body(path)
    print(path, "loop instructions", len(body))
    cur = collections.Counter()
    for b in body:
        if "DEPBAR" in b:
            print(f"   {dict(cur.most_common(9))}\n  -- {b}")
            cur = collections.Counter()
        cur[base_opcode(b)] += 1
    print(f"   {dict(cur.most_common(9))}")


def keyseq(path, pat=r"HGMMA|BAR|SYNCS|WARPGROUP|BRA"):
    run = collections.Counter()
    for i, b in enumerate(step_body(path)):
        if re.search(pat, b):
            if run:
                print("      ", dict(run.most_common(6)))
            run = collections.Counter()
            print(f"  {i:4d} {b[:90]}")
        else:
            run[base_opcode(b)] += 1
    if run:
        print("      ", dict(run.most_common(6)))


if __name__ == "__main__":
    (keyseq if "--seq" in sys.argv else seg)(sys.argv[1])
