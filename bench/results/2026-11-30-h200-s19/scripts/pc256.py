"""Pre-compile the sm80 forward D=256 configs (both dtypes and masks) of package PKG (flashcute or flashcute_base)."""

import importlib
import sys
from concurrent.futures import ProcessPoolExecutor

pkg = sys.argv[1]
config = importlib.import_module(f"{pkg}.config")
variants = importlib.import_module(f"{pkg}.kernels.variants")
if __name__ == "__main__":
    configs = [config.fwd_config(256, dt, causal=c) for dt in ("bfloat16", "float16") for c in (False, True)]
    with ProcessPoolExecutor(4) as pool:
        print(pkg, list(pool.map(variants._compile_one, configs, ["sm_90a"] * len(configs))))
