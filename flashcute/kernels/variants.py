"""Every variant of the kernels: what the heuristics pick and the alternative tiles the GPU tests run
(`flashcute warmup --all` compiles them into the disk cache)."""

from __future__ import annotations

import dataclasses
import os
import time

from flashcute.kernels import registry
from flashcute.kernels.common.limits import in_sample


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
    """The heuristics' configs on ``arch`` (the groups of registry.variants named in ``only``, default all; of the
    packed variable-length and softcap groups a sample, in_sample) and the alternative tiles of each family built for
    ``arch``."""
    groups = registry.variants(arch, exact_only)
    configs = [c for name, group in groups.items() if only is None or name in only for c in group if in_sample(name, c)]
    for name in registry.FAMILIES:
        if arch in registry.family(name).ARCHS and (only is None or f"{name}-fwd" in only):
            configs += alternative_tile_variants(name)
    return list(dict.fromkeys(configs))


def compile_one(config, arch: str) -> float:
    """Compile (or load from the disk cache) the kernel of ``config`` for ``arch``; the seconds it took."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    from flashcute import compile_cache

    start = time.perf_counter()
    compile_cache.get_compiled(arch, config, lambda: registry.compile_any(config, arch))
    return time.perf_counter() - start
