"""Fill FLASHCUTE_CACHE_DIR (CPU machine, CUTE_DSL_ARCH=sm_90a) with lease 3's kernels: the Hopper forward at D=256
under a causal mask and the sm80 forward at D=128 under one, both dtypes."""

import os
from concurrent.futures import ProcessPoolExecutor

from flashcute.config import fwd_config, sm90_fwd_config
from flashcute.kernels.variants import _compile_one

if __name__ == "__main__":
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    cs = [sm90_fwd_config(256, dt, causal=True) for dt in ("bfloat16", "float16")]
    cs += [fwd_config(128, dt, causal=True, arch="sm_90a") for dt in ("bfloat16", "float16")]
    with ProcessPoolExecutor(2) as pool:
        print(list(pool.map(_compile_one, cs, ["sm_90a"] * len(cs))))
