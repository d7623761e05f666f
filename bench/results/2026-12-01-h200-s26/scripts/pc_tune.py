"""Fill the compile cache with scripts/tune.py's sm80 candidates at one head dim (argv: D), both dtypes and masks."""

import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, "scripts")
from tune import CANDIDATES, make_config

from flashcute.kernels.variants import _compile_one

d = int(sys.argv[1])
configs = [
    make_config("sm80", d, dt, c, cand)
    for cand in CANDIDATES[d]
    for dt in ("bfloat16", "float16")
    for c in (False, True)
]
with ProcessPoolExecutor(int(sys.argv[2])) as pool:
    print(sum(1 for _ in pool.map(_compile_one, configs, ["sm_90a"] * len(configs))), "compiled")
