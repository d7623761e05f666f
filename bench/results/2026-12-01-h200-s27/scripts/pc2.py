import itertools
from concurrent.futures import ProcessPoolExecutor

from flashcute.config import fwd_config, sm90_fwd_config
from flashcute.kernels.variants import _compile_one

cs = []
for dt, (d, c) in itertools.product(
    ("bfloat16", "float16"), [(64, 0), (64, 1), (256, 0), (256, 1), (128, 1), (192, 1), (200, 1), (200, 0)]
):
    cs += [
        (fwd_config(d, dt, causal=bool(c), arch="sm_90a"), "sm_90a"),
        (sm90_fwd_config(d, dt, causal=bool(c)), "sm_90a"),
        (sm90_fwd_config(d, dt, causal=bool(c), exp_in_place=True), "sm_90a"),
    ]
cs = list(dict.fromkeys(cs))
with ProcessPoolExecutor(16) as pool:
    list(pool.map(_compile_one, [c for c, _ in cs], [a for _, a in cs]))
print(len(cs), "compiled")
