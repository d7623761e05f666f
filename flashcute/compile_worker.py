"""A background build: the kernels of the configs that compile_cache.build_in_background pickles to its standard
input, built into the disk cache (``python -m flashcute.compile_worker``, the cache folder in FLASHCUTE_CACHE_DIR).

It runs without torch: TVM-FFI imports torch where it can, which would cost this process seconds before its first
build, and building a kernel needs none of it (the kernels take symbolic tensors; registry.compile_any).
"""

from __future__ import annotations

import functools
import os
import pickle
import sys


def main() -> None:
    sys.modules["torch"] = None  # `import torch` raises ImportError here: TVM-FFI then goes without it
    arch, configs = pickle.load(sys.stdin.buffer)
    os.environ["CUTE_DSL_ARCH"] = arch  # (CuTe DSL makes a callable kernel only for the target this names)
    from flashcute import compile_cache
    from flashcute.kernels import registry

    for config in configs:
        compile_cache.get_compiled(arch, config, functools.partial(registry.compile_any, config, arch))


if __name__ == "__main__":
    main()
