"""Compile one sm90 fwd variant, dump PTX+SASS to OUT dir. args: d causal dtype out [nodesc32] [json overrides]"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
from pathlib import Path

import flashcute.kernels.sm90.fwd as F
from flashcute.config import sm90_fwd_config
from flashcute.kernels.build import compile_fwd
from flashcute.kernels.sass import tool

sys.path.insert(0, os.path.dirname(__file__))
import ks  # noqa

d, c, dt, out = sys.argv[1:5]
flags = sys.argv[5] if len(sys.argv) > 5 else ""
js = json.loads(sys.argv[6]) if len(sys.argv) > 6 else {}
if "nodesc32" in flags:
    from flashcute.kernels.common.wgmma import k_steps

    F.FlashAttentionForwardSm90.key_steps = lambda self, tSrK, stage: k_steps(tSrK[None, None, None, stage])
cfg = dataclasses.replace(sm90_fwd_config(int(d), dt, causal=c == "1"), **js)
dump = Path(out)
shutil.rmtree(dump, ignore_errors=True)
compile_fwd(cfg, "sm_90a", dump)
cub = next(dump.glob("*.cubin"))
(dump / "k.sass").write_text(
    subprocess.run([str(tool("nvdisasm")), "-c", str(cub)], capture_output=True, text=True).stdout
)
next(dump.glob("*.ptx")).rename(dump / "k.ptx")
