"""Compile a few sm80 forward variants for sm_80 and sm_90a on the CPU; print registers and spills of each."""

import os
import shutil
import time
from pathlib import Path

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
from flashcute.config import fwd_config
from flashcute.kernels.build import compile_fwd
from flashcute.kernels.sass import inspect_cubin
from flashcute.kernels.sm80.fwd import FlashAttentionForwardSm80

CASES = [
    (96, "bfloat16", {"window_left": 100, "window_right": 0}, (64, 64, 4, 2, 2)),
    (200, "float16", {"causal": True}, None),
    (256, "float16", {}, None),
    (32, "bfloat16", {"causal": True}, (128, 64, 8, 1, 2)),
]
for d, dtype, masks, tiles in CASES:
    config = fwd_config(d, dtype, tiles=tiles, **masks)
    for arch in ("sm_80", "sm_90a"):
        why = FlashAttentionForwardSm80.can_implement(config, arch)
        if why:
            print(config, arch, why)
            continue
        start, dump = time.time(), Path("/tmp/cc")
        shutil.rmtree(dump, ignore_errors=True)
        compile_fwd(config, arch, dump)
        report = inspect_cubin(next(dump.glob("*.cubin")))
        took = time.time() - start
        print(d, dtype, masks, config.warps_n, arch, f"{took:.1f}s regs={report.registers} spills={report.spills}")
