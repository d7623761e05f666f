"""Compile one Hopper backward variant for sm_90a here (no GPU); print registers, spills, instructions and keep
its SASS (nvdisasm -c -g) under /tmp/ccbwd.  python ccbwd.py HEAD_DIM CAUSAL(0/1) DTYPE"""

import sys
from pathlib import Path

from flashcute.config import sm90_bwd_config
from flashcute.kernels.sass import _run, compile_and_inspect, variant_label

d, causal, dtype = sys.argv[1:4]
config = sm90_bwd_config(int(d), dtype, window_right=0 if causal == "1" else -1)
dump = Path("/tmp/ccbwd") / variant_label(config)
report = compile_and_inspect(config, "sm_90a", dump)
(cubin,) = dump.glob("*.cubin")
(dump / "k.sass").write_text(_run("nvdisasm", "-c", "-g", str(cubin)))
print(dump, "regs", report.registers, "spills", report.spills, "instr", report.instructions)
