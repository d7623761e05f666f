"""Compile Hopper forward variants for sm_90a (argv: D:causal:dtype[:json of sm90_fwd_config overrides]); print
registers, spills and instructions and write the SASS to $CC90/<variant>/k.sass."""

import json
import os
import sys
from pathlib import Path

from flashcute.config import sm90_fwd_config
from flashcute.kernels.sass import _run, compile_and_inspect, variant_label

for spec in sys.argv[1:]:
    d, causal, dtype, *extra = spec.split(":", 3)
    kw = json.loads(extra[0]) if extra else {}
    for key in ("tiles", "step_order"):
        if key in kw:
            kw[key] = tuple(kw[key])
    tag = kw.pop("tag", "")
    cfg = sm90_fwd_config(int(d), dtype, causal == "1", **kw)
    dump = Path(os.environ.get("CC90", "/tmp/cc90")) / (variant_label(cfg) + tag)
    rep = compile_and_inspect(cfg, "sm_90a", dump)
    (cubin,) = dump.glob("*.cubin")
    (dump / "k.sass").write_text(_run("nvdisasm", "-c", str(cubin)))
    print(spec, dump.name, "regs", rep.registers, "spills", rep.spills, "instr", rep.instructions, flush=True)
