import dataclasses
import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
from pathlib import Path

from flashcute.config import sm90_fwd_config
from flashcute.kernels.build import compile_fwd
from flashcute.kernels.sass import tool

d, c, dt, js, out = sys.argv[1:6]
cfg = dataclasses.replace(sm90_fwd_config(int(d), dt, causal=c == "1"), **json.loads(js))
dump = Path(f"/tmp/sassof-{os.getpid()}")
shutil.rmtree(dump, ignore_errors=True)
compile_fwd(cfg, "sm_90a", dump)
sass = subprocess.run(
    [str(tool("nvdisasm")), "-c", str(next(dump.glob("*.cubin")))], capture_output=True, text=True
).stdout
Path(out).write_text(sass)
