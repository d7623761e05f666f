import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from flashcute.config import sm90_fwd_config
from flashcute.kernels.sass import inspect_variants


def main():
    specs = sys.argv[1:]  # d:causal:dtype:json
    cfgs = []
    for s in specs:
        d, c, dt, js = s.split(":", 3)
        cfg = sm90_fwd_config(int(d), dt, causal=c == "1")
        cfgs.append(dataclasses.replace(cfg, **json.loads(js)))
    with tempfile.TemporaryDirectory() as tmp:
        reps = inspect_variants([(c, "sm_90a") for c in cfgs], Path(tmp), 2)
    for s, r in zip(specs, reps, strict=True):
        print(
            s,
            "FAIL " + str(r)[:300]
            if isinstance(r, Exception)
            else (r.registers, r.stack_bytes, r.spills, r.count("HGMMA"), r.instructions, round(r.seconds, 1)),
        )


if __name__ == "__main__":
    main()
