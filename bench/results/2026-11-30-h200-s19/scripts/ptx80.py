"""Compile one sm80 fwd variant for sm_90a, dump PTX+SASS to OUT dir. args: d causal dtype out [json]"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
from pathlib import Path

from flashcute.config import fwd_config
from flashcute.kernels.build import compile_fwd
from flashcute.kernels.sass import tool

d, c, dt, out = sys.argv[1:5]
js = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
cfg = dataclasses.replace(fwd_config(int(d), dt, causal=c == "1"), **js)
dump = Path(out)
shutil.rmtree(dump, ignore_errors=True)
compile_fwd(cfg, "sm_90a", dump)
cub = next(dump.glob("*.cubin"))
(dump / "k.sass").write_text(
    subprocess.run([str(tool("nvdisasm")), "-c", str(cub)], capture_output=True, text=True).stdout
)
next(dump.glob("*.ptx")).rename(dump / "k.ptx")
