"""Opcode mix of the HGMMA step loops in k.sass files. args: sass files (the other scripts import ``loops``)"""

import collections
import re
import sys


def loops(path, mma="HGMMA", most=700):
    """The backward-branch loops of an nvdisasm listing that hold ``mma`` and fewer than ``most`` instructions."""
    with open(path) as f:
        lines = f.read().splitlines()
    labels = {}
    for i, line in enumerate(lines):
        m = re.match(r"^\.(L_x_\d+):", line.strip())
        if m:
            labels[m.group(1)] = i
    out = []
    for i, line in enumerate(lines):
        m = re.search(r"BRA `\(\.(L_x_\d+)\)", line)
        if m and labels.get(m.group(1), 1e9) < i:
            body = [x for x in lines[labels[m.group(1)] : i + 1] if re.match(r"\s*/\*[0-9a-f]+\*/", x)]
            if any(mma in x for x in body) and len(body) < most:
                out.append(body)
    return out


def ops(body):
    c = collections.Counter()
    for x in body:
        m = re.search(r"\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)(\.[A-Z0-9_.]+)?", x)
        if m:
            c[m.group(2)] += 1
    return c


if __name__ == "__main__":
    res = [(p, loops(p)) for p in sys.argv[1:]]
    for p, ls in res:
        print(p, [len(b) for b in ls])
    cs = [ops(ls[0]) for p, ls in res]
    keys = sorted(set().union(*cs), key=lambda k: -max(c[k] for c in cs))
    for k in keys:
        vals = [c[k] for c in cs]
        if len(set(vals)) > 1 or "-a" in sys.argv[0]:
            print(f"{k:12s}", *vals)
