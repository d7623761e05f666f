"""sm80 fwd: compile variants for sm_90a; print each backward-branch loop's size and opcode mix.
args: d:causal:dtype[:json]"""

import collections
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
from pathlib import Path

from flashcute.config import fwd_config
from flashcute.kernels.build import compile_fwd
from flashcute.kernels.sass import inspect_cubin, tool

for spec in sys.argv[1:]:
    parts = spec.split(":", 3)
    d, causal, dt = int(parts[0]), parts[1] == "1", parts[2]
    cfg = fwd_config(d, dt, causal=causal)
    if len(parts) > 3:
        cfg = dataclasses.replace(cfg, **json.loads(parts[3]))
    dump = Path(f"/tmp/l80-{abs(hash(spec))}")
    shutil.rmtree(dump, ignore_errors=True)
    compile_fwd(cfg, "sm_90a", dump)
    cub = next(dump.glob("*.cubin"))
    r = inspect_cubin(cub)
    s = subprocess.run([str(tool("nvdisasm")), "-c", str(cub)], capture_output=True, text=True).stdout
    lines = s.splitlines()
    labels = {}
    for i, line in enumerate(lines):
        m = re.match(r"^\.(L_x_\d+):", line.strip())
        if m:
            labels[m.group(1)] = i
    print(f"== {spec} regs={r.registers} spills={r.spills} instrs={r.instructions}")
    for i, line in enumerate(lines):
        m = re.search(r"BRA `\(\.(L_x_\d+)\)", line)
        if m and labels.get(m.group(1), 1e9) < i:
            body = lines[labels[m.group(1)] : i + 1]
            ops = collections.Counter()
            for b in body:
                mm = re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?", b)
                if mm:
                    ops[mm.group(1)] += 1
            n = sum(ops.values())
            if n < 100:
                continue
            top = " ".join(f"{k}{v}" for k, v in ops.most_common(18))
            print(f"  loop {n}: {top}")
