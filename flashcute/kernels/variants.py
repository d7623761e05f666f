"""Every compiled variant of the kernels, and a parallel pre-compiler that fills the on-disk cache.

    python -m flashcute.kernels.variants --arch sm_90a --jobs 16

compiles each variant once (one process per variant) so that later processes load kernels instead of compiling.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import time
from concurrent.futures import ProcessPoolExecutor

from flashcute.config import (
    DTYPES,
    HEAD_DIM_BUCKETS,
    BwdConfig,
    BwdPostConfig,
    BwdPreConfig,
    DQConfig,
    FwdConfig,
    Sm90BwdConfig,
    Sm90FwdConfig,
    bwd_config,
    bwd_post_config,
    bwd_pre_config,
    dq_config,
    fwd_config,
    sm90_bwd_config,
    sm90_bwd_supports,
    sm90_fwd_config,
)

# (window_left, window_right) pairs that reach each mask variant: none, causal, sliding window, left-only window
MASK_VARIANTS = ((-1, -1), (-1, 0), (8, 8), (8, -1))


def _variants(make_config, exact_only: bool, buckets: tuple[int, ...] = HEAD_DIM_BUCKETS) -> list:
    configs = []
    for dtype, bucket, (left, right) in itertools.product(DTYPES, buckets, MASK_VARIANTS):
        head_dims = (bucket,) if exact_only else (bucket, bucket - 8)
        configs += [make_config(d, dtype, window_left=left, window_right=right) for d in head_dims]
    return configs


def fwd_variants(exact_only: bool = False, arch: str = "sm_80") -> list[FwdConfig]:
    """The heuristic's config for every dtype x head-dim bucket x mask variant (x exact/padded head dim) on target
    ``arch`` (its shared memory can change the pick)."""
    return _variants(functools.partial(fwd_config, arch=arch), exact_only)


def sm90_fwd_variants(exact_only: bool = False) -> list[Sm90FwdConfig]:
    """The Hopper forward kernel's configs, as fwd_variants (built for sm_90a only)."""
    return _variants(sm90_fwd_config, exact_only)


def sm90_bwd_variants(exact_only: bool = False) -> list[Sm90BwdConfig]:
    """The Hopper backward kernel's configs, per dtype x its head-dim buckets x mask variant (x exact/padded)."""
    return _variants(sm90_bwd_config, exact_only, tuple(b for b in HEAD_DIM_BUCKETS if sm90_bwd_supports(b)))


# Tile choices besides the heuristics' that the GPU tests run (tests/test_fwd.py), at head dim 96, bf16: sm80
# (block_m, block_n, num_warps, num_stages[, warps_n]), sm90 (block_m, block_n, num_stages).
ALTERNATIVE_TILES = {
    "sm80": [(128, 64, 4, 2), (64, 64, 4, 1), (128, 64, 8, 2), (128, 128, 8, 1), (128, 64, 8, 1, 2), (64, 64, 4, 2, 2)],
    "sm90": [
        (64, 128, 2),
        (192, 128, 2),
        (128, 64, 3),
        (128, 176, 2),
        (128, 112, 1),
        (128, 80, 2, "no turns"),
        (128, 96, 2, "fixed order"),
        (128, 80, 2, "in place"),
    ],
}
"""Tile configs besides the heuristic's picks that the tests build at head dim 96: sm80 (block_m, block_n,
num_warps, num_stages[, warps_n]), sm90 (block_m, block_n, num_stages[, "no turns": config.take_turns off;
"fixed order": config.claim_tiles off, the snake order of a persistent grid or, under a mask with long walks, a block
a tile; "in place": config.exp_in_place on])."""


def alternative_tile_config(kernel: str, tiles: tuple, window_left: int, window_right: int):
    """The test's config for one of ALTERNATIVE_TILES[kernel] under a mask."""
    masks = {"window_left": window_left, "window_right": window_right}
    if kernel == "sm90":
        return sm90_fwd_config(
            96,
            "bfloat16",
            **masks,
            tiles=tiles[:3],
            take_turns="no turns" not in tiles,
            claim_tiles="fixed order" not in tiles,
            exp_in_place=True if "in place" in tiles else None,
        )
    return fwd_config(96, "bfloat16", **masks, tiles=tiles)


def alternative_tile_variants(kernel: str) -> list[FwdConfig | Sm90FwdConfig]:
    return [
        alternative_tile_config(kernel, tiles, left, right)
        for tiles in ALTERNATIVE_TILES[kernel]
        for left, right in MASK_VARIANTS[:3]
    ]


def bwd_prepost_variants(exact_only: bool = False) -> list[BwdPreConfig | BwdPostConfig]:
    """The backward's preprocess (zeroing dQaccum or not) and postprocess, per dtype x head-dim bucket (x
    exact/padded head dim); they have no mask."""
    configs = []
    for dtype, bucket in itertools.product(DTYPES, HEAD_DIM_BUCKETS):
        for d in (bucket,) if exact_only else (bucket, bucket - 8):
            configs += [bwd_pre_config(d, dtype), bwd_pre_config(d, dtype, clear_dq_accum=False)]
            configs.append(bwd_post_config(d, dtype))
    return configs


def bwd_variants(exact_only: bool = False) -> list[BwdConfig | DQConfig | BwdPreConfig | BwdPostConfig]:
    """Every backward kernel the heuristics pick, per dtype x head-dim bucket x mask variant (x exact/padded):
    the dK/dV kernel with dQ atomics, the same without them, and the deterministic dQ kernel; then the
    preprocess and postprocess around them."""
    return [
        *_variants(bwd_config, exact_only),
        *_variants(functools.partial(bwd_config, deterministic=True), exact_only),
        *_variants(dq_config, exact_only),
        *bwd_prepost_variants(exact_only),
    ]


# Kernel families for --only: what a GPU test of one kernel needs (the backward's tests also run the
# preprocess and postprocess).
FAMILIES = {
    "sm80-fwd": lambda exact_only, arch: [*fwd_variants(exact_only, arch), *alternative_tile_variants("sm80")],
    "sm80-bwd": lambda exact_only, arch: bwd_variants(exact_only),
    "sm90-fwd": lambda exact_only, arch: [*sm90_fwd_variants(exact_only), *alternative_tile_variants("sm90")],
    "sm90-bwd": lambda exact_only, arch: [*sm90_bwd_variants(exact_only), *bwd_prepost_variants(exact_only)],
}


def _compile_one(
    config: FwdConfig | Sm90FwdConfig | BwdConfig | Sm90BwdConfig | DQConfig | BwdPreConfig | BwdPostConfig,
    arch: str,
) -> float:
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    from flashcute import compile_cache
    from flashcute.kernels.build import compile_kernel

    start = time.perf_counter()
    compile_cache.get_compiled(arch, config, lambda: compile_kernel(config, arch))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="sm_90a", help="target, e.g. sm_80 or sm_90a")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--exact-only", action="store_true", help="skip the padded-head-dim variants")
    parser.add_argument(
        "--only",
        choices=sorted(FAMILIES),
        action="append",
        help="these kernel families (repeatable; default: all that the target runs)",
    )
    args = parser.parse_args(argv)
    families = args.only or [f for f in FAMILIES if args.arch == "sm_90a" or not f.startswith("sm90")]
    configs = [config for family in families for config in FAMILIES[family](args.exact_only, args.arch)]
    configs = list(dict.fromkeys(configs))
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
