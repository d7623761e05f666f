"""Every compiled variant of the kernels, and a parallel pre-compiler that fills the on-disk cache.

    python -m flashcute.kernels.variants --arch sm_90a --jobs 16

compiles each variant the heuristics pick (and the alternative tiles the GPU tests run) once, one process per
variant, so that later processes load kernels instead of compiling.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import time
from concurrent.futures import ProcessPoolExecutor

from flashcute.kernels import registry


def alternative_tile_config(family: str, fields: dict, window_left: int, window_right: int):
    """The heuristic's head-dim-96 bf16 forward config of ``family`` under a mask, with ``fields`` replaced."""
    configs = registry.family(family).variants(
        registry.family(family).ARCHS[-1], ("bfloat16",), (96,), ((window_left, window_right),), True
    )["fwd"]
    return dataclasses.replace(configs[0], **fields)


def alternative_tile_variants(family: str) -> list:
    return [
        alternative_tile_config(family, fields, left, right)
        for fields in registry.family(family).ALTERNATIVE_TILES
        for left, right in registry.MASK_VARIANTS[:3]
    ]


def all_variants(arch: str, exact_only: bool = False, only: list[str] | None = None) -> list:
    """The heuristics' configs on ``arch`` (the groups of registry.variants named in ``only``, default all) and
    the alternative tiles of each family built for ``arch``."""
    groups = registry.variants(arch, exact_only)
    configs = [c for name, group in groups.items() if only is None or name in only for c in group]
    for name in registry.FAMILIES:
        if arch in registry.family(name).ARCHS and (only is None or f"{name}-fwd" in only):
            configs += alternative_tile_variants(name)
    return list(dict.fromkeys(configs))


def _compile_one(config, arch: str) -> float:
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    from flashcute import compile_cache

    start = time.perf_counter()
    compile_cache.get_compiled(arch, config, lambda: registry.compile_any(config, arch))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="sm_90a", help="target, e.g. sm_80 or sm_90a")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--exact-only", action="store_true", help="skip the padded-head-dim variants")
    parser.add_argument(
        "--only",
        choices=sorted(registry.variants("sm_90a", exact_only=True, buckets=(64,))),
        action="append",
        help="these kernel groups (repeatable; default: all that the target runs)",
    )
    args = parser.parse_args(argv)
    configs = all_variants(args.arch, args.exact_only, args.only)
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        seconds = list(pool.map(_compile_one, configs, itertools.repeat(args.arch)))
    print(
        f"{len(configs)} variants for {args.arch} in {time.perf_counter() - start:.0f} s "
        f"(per variant: max {max(seconds):.1f} s, mean {sum(seconds) / len(seconds):.1f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
