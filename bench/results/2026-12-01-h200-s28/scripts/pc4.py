"""Fill FLASHCUTE_CACHE_DIR (CPU machine, CUTE_DSL_ARCH=sm_90a) with lease 4's kernels: the Hopper forward at D=64
and D=128 (heuristic and exp_in_place, both masks) and both forwards at head dim 160 (the 192 bucket, padded)."""

import os
from concurrent.futures import ProcessPoolExecutor

from flashcute.config import fwd_config, sm90_fwd_config
from flashcute.kernels.variants import _compile_one

DT = ("bfloat16", "float16")

if __name__ == "__main__":
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    cs = [
        sm90_fwd_config(d, dt, causal=c, exp_in_place=p)
        for d in (64, 128)
        for dt in DT
        for c in (False, True)
        for p in (None, True)
    ]
    cs += [sm90_fwd_config(160, dt, window_right=0 if c else -1) for dt in DT for c in (False, True)]
    cs += [fwd_config(160, dt, window_right=0 if c else -1, arch="sm_90a") for dt in DT for c in (False, True)]
    cs = list(dict.fromkeys(cs))
    with ProcessPoolExecutor(2) as pool:
        print(len(cs), [round(s, 1) for s in pool.map(_compile_one, cs, ["sm_90a"] * len(cs))])
