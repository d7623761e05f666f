"""Fill FLASHCUTE_CACHE_DIR on the CPU machine (CUTE_DSL_ARCH=sm_90a) with the bench's kernels (sm80 and sm90
forward at D 64/128/256, both masks and dtypes) and the experiments' configs."""

import os
import sys
from concurrent.futures import ProcessPoolExecutor

from flashcute.config import fwd_config, sm90_fwd_config
from flashcute.kernels.variants import _compile_one

DT = ("bfloat16", "float16")


def experiment_configs():
    out = []
    for dt in DT:
        out.append(sm90_fwd_config(256, dt, causal=False, exp_in_place=True))
        out.append(sm90_fwd_config(192, dt, causal=True))
        out.append(sm90_fwd_config(192, dt, causal=True, exp_in_place=True))
    return out


def bench_configs():
    out = []
    for dt in DT:
        for d in (64, 128, 256):
            for c in (False, True):
                out.append(sm90_fwd_config(d, dt, causal=c))
                out.append(fwd_config(d, dt, causal=c, arch="sm_90a"))
    return out


if __name__ == "__main__":
    which = sys.argv[2] if len(sys.argv) > 2 else "all"
    pick = {"bench": bench_configs, "exp": experiment_configs}
    cs = pick.get(which, lambda: bench_configs() + experiment_configs())()
    cs = list(dict.fromkeys(cs))
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    with ProcessPoolExecutor(int(sys.argv[1])) as pool:
        secs = list(pool.map(_compile_one, cs, ["sm_90a"] * len(cs)))
    print(len(cs), "configs", [round(s, 1) for s in secs])
