"""Kernel variants compiled for sm_80 and sm_90a on the CPU, and their SASS read back.

By default one representative variant per kernel family, kernel kind and head-dim bucket is built (dtype, mask,
target and exact or padded head dim drawn in turn, so every value of each appears); FLASHCUTE_COMPILE_ALL=1 builds
the whole matrix (every bucket and mask of every kernel kind, the dtypes sampled as full_matrix says, padded head
dims at bucket 128, the alternative tiles), as CI does.

The SASS must hold the seed's instructions: tensor-core MMAs (HMMA.16816.F32, .BF16 for bf16), cp.async loads
(LDGSTS), ldmatrix reads (LDSM; LDSM.16.MT88 for the transposed V reads of P·V) and exp2 (MUFU.EX2); the backward
also the fp32 reductions that add dQ (RED on sm_80, REDG.E.ADD.F32x2 pairs on sm_90a). The Hopper forward kernel
(sm_90a only) must hold warpgroup MMAs (HGMMA), TMA loads and stores (UTMALDG, UTMASTG), mbarrier operations (SYNCS)
and the register hand-over between warpgroups (USETMAXREG), and no mma.sync or cp.async. The backward's
preprocess and postprocess stream through registers: 128-bit global loads (LDG.E.128) and, where they write a
tile (the zeroed dQaccum, dQ), 128-bit stores (STG.E.128); no MMA, no shared memory. Nothing may spill
registers to local memory (STL/LDL) but the variants named in KNOWN_SPILLS, with the reason (and in
KNOWN_SPILLS_BY_TOOLKIT for the ptxas of the DSL's CUDA flavor in use: CUDA 13 in CI, as on the H200 host).
The compiled kernel cache must also carry a kernel from one process to the next.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from functools import partial

import pytest

from flashcute import compile_cache
from flashcute.kernels import registry
from flashcute.kernels.common.limits import DTYPES, HEAD_DIM_BUCKETS, MASK_NAMES, dtype_in_turn, in_sample
from flashcute.kernels.common.prepost_config import (
    AppendConfig,
    BwdPostConfig,
    BwdPreConfig,
    CombineConfig,
    ZeroRowsConfig,
    bwd_post_config,
)
from flashcute.kernels.sass import SassReport, _target_arch, dsl_toolkit, inspect_variants, machine_code, step_loops
from flashcute.kernels.sm80.config import BwdConfig, bwd_config, fwd_config
from flashcute.kernels.sm90.config import Sm90BwdConfig, Sm90FwdConfig, sm90_bwd_config, sm90_fwd_config
from flashcute.kernels.variants import alternative_tile_variants

pytestmark = pytest.mark.compile

ARCHS = ("sm_80", "sm_90a")
PADDED_BUCKET = 128  # padded head dims (head-dim predicates) are compiled for this bucket only, to save time


# How the whole matrix samples each group of registry.variants (full_matrix): every variant of the Hopper family's
# kernels, the dtypes in turn for the mma.sync family's forward and dK/dV kernels on their first target, and one
# variant a bucket for the rest (the deterministic backward's kernels, packed batches, softcap, sinks, ALiBi, a
# later target).
THIN = ("sm80-bwd-deterministic", "sm80-dq", "sm90-bwd-deterministic")


def full_matrix() -> list[tuple[object, str]]:
    """Every (config, target) of a sample of the heuristics' picks (exact at every bucket, padded at PADDED_BUCKET;
    THIN says which groups take which sample), the alternative tiles with E in place of S, and E in place of S at
    D=256 without a mask. Every bucket and mask of every kernel kind is built; the sample keeps the matrix within
    CI's time (869 variants took 49 minutes of a 2-core CI machine, 686 took 38)."""
    variants = []
    for arch in ARCHS:
        exact = registry.variants(arch, exact_only=True)
        padded = registry.variants(arch, buckets=(PADDED_BUCKET,))
        for name in exact:
            family = name.split("-")[0]
            later = family in registry.FAMILIES and arch != registry.family(family).ARCHS[0]
            if later or name.endswith(("-softcap", "-sink", "-alibi", "-packed", "-paged")) or name.startswith(THIN):
                sampled = one_per_bucket
            elif family == "sm80":
                sampled = dtype_in_turn
            elif name == "prepost":
                sampled = prepost_sample
            else:
                sampled = partial(in_sample, name)
            variants += [(c, arch) for c in (*exact[name], *padded[name]) if sampled(c)]
    in_place = [c for c in alternative_tile_variants("sm90") if c.exp_in_place]
    in_place += [dataclasses.replace(sm90_fwd_config(256, dtype), exp_in_place=True) for dtype in DTYPES]
    variants += [(c, "sm_90a") for c in in_place]
    return list(dict.fromkeys(variants))


def prepost_sample(config) -> bool:
    """Whether the matrix builds this shared kernel: all of them, but of the preprocesses with the LSE's gradient or
    the sinks' one dtype a bucket, in turn (each is one subtraction or one exp2 a row beside the plain preprocess)."""
    if not (isinstance(config, BwdPreConfig) and (config.dlse or config.sink)):
        return True
    return DTYPES.index(config.dtype) == HEAD_DIM_BUCKETS.index(config.head_dim_padded) % len(DTYPES)


def one_per_bucket(config) -> bool:
    """Whether the matrix builds this variant of a thinly sampled group: one a head-dim bucket (exact and padded),
    the masks and dtypes taken in turn. A family's variants on its later target (their source is the one built for
    every dtype and mask on its first target; only ptxas's schedule differs), and the softcap, sink and ALiBi groups
    (the cap and the bias are one step each on the scores, the sink one term of the epilogue's statistics, the same
    at every tile)."""
    i = HEAD_DIM_BUCKETS.index(config.head_dim_padded)
    mask = list(MASK_NAMES).index((config.mask_right, config.mask_left))
    return mask == i % len(MASK_NAMES) and DTYPES.index(config.dtype) == i % len(DTYPES)


# Kinds that came after the draws below were first taken: they draw last, so that every other kind keeps the
# variants whose spills are listed below.
APPENDED_KINDS = {("sm90", "bwd-deterministic"), ("sm90", "fwd-paged")}


def representative() -> list[tuple[object, str]]:
    """One variant per family kernel kind and head-dim bucket: the i-th draw takes target, dtype and mask in turn,
    and every other kind's bucket-128 variant is its padded head dim."""
    variants = []
    draw = 0
    kinds = [
        (registry.family(name), kind)
        for name in registry.FAMILIES
        for kind in registry.family(name).variants(
            registry.family(name).ARCHS[0], DTYPES, HEAD_DIM_BUCKETS, registry.MASK_VARIANTS, True
        )
    ]
    # the sink and ALiBi kinds, then the v head dim ones, then the kinds named in APPENDED_KINDS, last, so that they
    # take draws of their own rather than shifting the others'
    last = {"sink": 1, "alibi": 1, "value": 2}
    kinds.sort(key=lambda fk: 3 if (fk[0].NAME, fk[1]) in APPENDED_KINDS else last.get(fk[1].rpartition("-")[2], 0))
    for family, kind in kinds:
        # softcap, sinks and ALiBi are one step each, whatever the tiles: their kinds at one bucket
        for bucket in (PADDED_BUCKET,) if kind.endswith(("-softcap", "-sink", "-alibi")) else HEAD_DIM_BUCKETS:
            arch = family.ARCHS[draw % len(family.ARCHS)]
            window = registry.MASK_VARIANTS[draw % len(registry.MASK_VARIANTS)]
            dtype = DTYPES[draw // 2 % 2]
            padded = bucket == PADDED_BUCKET and draw // len(HEAD_DIM_BUCKETS) % 2 == 1  # as in the full matrix
            draw += 1
            configs = family.variants(arch, (dtype,), (bucket,), (window,), False)[kind]  # [exact, padded]
            if configs:  # a kind may not cover every bucket (v's own head dim: the pairs models use)
                variants.append((configs[-1] if padded else configs[0], arch))
    prepost = registry.variants("sm_80", exact_only=True)["prepost"]
    for i, bucket in enumerate(HEAD_DIM_BUCKETS):
        kernels = [c for c in prepost if getattr(c, "head_dim_padded", None) == bucket and c.dtype == DTYPES[i % 2]]
        variants.append((kernels[i % len(kernels)], ARCHS[i % 2]))
    # a decoding step's writes (any head dim): the counts alone, and each kind of cache slot, in turn
    appends = [c for c in prepost if isinstance(c, AppendConfig) and (c.counts or c.batch_index)]
    variants += [(c, ARCHS[i % 2]) for i, c in enumerate(appends) if i % 3 == 0 or not c.keys]
    # a packed backward's rows outside every sequence zeroed, each dtype on one target
    variants += [(c, ARCHS[i % 2]) for i, c in enumerate(c for c in prepost if isinstance(c, ZeroRowsConfig))]
    return list(dict.fromkeys(variants))


ALL_VARIANTS = list(dict.fromkeys(full_matrix() + representative()))  # the default set is part of the whole
ALL_IDS = [f"{arch}-{config.label}" for config, arch in ALL_VARIANTS]
VARIANTS = ALL_VARIANTS if os.environ.get("FLASHCUTE_COMPILE_ALL") == "1" else representative()
IDS = [f"{arch}-{config.label}" for config, arch in VARIANTS]

# Variants that spill registers to local memory, found by compiling them all (`flashcute check --arch sm_80 sm_90a`
# prints the same table) at commit 6ab88b2, with the reason, and re-found after the mask's selects (c12ef6c: 11 fewer
# sm80-path variants spill, 5 others now do). Every 4-warp variant already uses all 255 registers a thread can have;
# how much spills where varies with dtype, mask and target as ptxas schedules differently.
_D32 = (
    "128x128 tile, 4 warps: acc_S alone is 128 fp32 registers a thread (128 x 128 / 128 threads) beside acc_O's 32 "
    "and the Q/K/V fragments: 24-168 bytes of stack. The d32 tile is not swept on the GPU yet (docs/tuning-sm80.md, "
    "Forward tiles)"
)
_D64 = (
    "128x128 tile, 2 stages, 4 warps: acc_S 128 + acc_O 64 fp32 registers a thread beside the fragments need more "
    "than 255: 48-272 bytes of stack on every d64 variant. Kept: it is the fastest tile measured on the H200 "
    "(docs/tuning-sm80.md, Forward tiles: ahead of the spill-free 128x64 one-stage tile at 8 of 8 points, +0.6 % to "
    "+5.2 %; in one process 1.018 over 12 points)"
)
_D96 = (
    "128x64 tile, 4 warps: acc_O 96 + acc_S 64 fp32 registers a thread and the fragments sit at the 255-register "
    "limit: 8-128 bytes of stack on 10 of the 16 variants, on every two-sided window"
)
_D128 = (
    "128x64 tile, 4 warps (1 stage without a mask, 2 under one): acc_O 128 + acc_S 64 fp32 registers a thread and "
    "the Q/K/V fragments need more than 255: 32-224 bytes of stack on every d128 variant. Kept: the fastest tiles "
    "measured on the H200 (docs/tuning-sm80.md, Forward tiles: ahead of 128x48, which spills less, and of 64x64, "
    "which does not spill)"
)
_BWD = (
    "backward dK/dV kernel, 8 warps: dK and dV stay in registers for the whole walk (2 x 64 fp32 a thread at d128) "
    "beside S, dP, dQ and the operand fragments of five GEMMs: 8-72 bytes of stack at d96, d128, d192 and d256 "
    "(set re-found after the Q/dO double buffering and sm_90's paired dQ atomics; the deterministic dQ kernel "
    "spills nowhere)"
)
_SM90_BWD = (
    "Hopper backward, 240 registers a consumer thread: at d64 (S^T and dP^T of 2 x 64 fp32 with 128-row Q tiles) the "
    "softcap derivative's kept t, ALiBi's row terms or both masks leave a few scalars to spill (8-72 bytes of stack, "
    "1-18 spill instructions)"
)
_D256 = (
    "128x128 tile, 8 warps (sm_90a only: 192 KB of shared memory): acc_O 128 + acc_S 64 fp32 registers a thread "
    "beside the fragments need more than 255: 48-152 bytes of stack. Kept: it is the fastest tile measured on the "
    "H200 (docs/tuning-sm80.md, Forward tiles: ahead of the spill-free 128x64 tiles at 8 of 8 points, +1.0 % to "
    "+4.3 %)"
)
_SM90_D256_CLAIMS = (
    "Hopper forward at head dim 256 with claimed tiles (docs/tuning-sm90.md, Claimed tiles and the persistent grid; "
    "the tile order's fast divisors as kernel arguments): U is 128 fp32 registers a consumer thread, and the per-tile "
    "code around the K/V loops (claimed index, first tile, epilogue) and the producer warp's loop spill a few "
    "scalars: 8 bytes of stack, 3-10 spill instructions, none in the K/V step loops"
)
_PACKED_MMA_SYNC = (
    "the mma.sync kernels built for packed variable-length batches, at the dense variants' tiles, which already use "
    "all 255 registers a thread (several spill dense too): the sequence's offsets and lengths (kernels/common/"
    "seqlen.py) and the per-row limits computed from them tip these over, 8-143 spill instructions; their speed is "
    "held by the benchmark (flashcute bench --varlen), not by this table"
)
_SOFTCAP_MMA_SYNC = (
    "the mma.sync kernels with softcap, at the plain variants' tiles, which already use all 255 registers a thread "
    "(most spill plain too): the cap's multiplier beside the scale and, in the backward, each row's LSE kept for the "
    "cap's derivative (kernels/common/softcap.py) tip these over; their speed is the benchmark's to hold"
)
_SINK_MMA_SYNC = (
    "the mma.sync forward with learnable sinks, at the plain variants' tiles, which already use all 255 registers a "
    "thread (most spill plain too): the sink's joint max and the rescale in the epilogue's statistics "
    "(softmax.finalize) add a few live values there: 23-104 spill instructions; their speed is the benchmark's to hold"
)
_ALIBI_MMA_SYNC = (
    "the mma.sync kernels with ALiBi, at the plain variants' tiles, which already use all 255 registers a thread "
    "(most spill plain too): each row's position term and the tile's slope beside the fragments (kernels/common/"
    "alibi.py), and in the backward with softcap the kept t, tip these over: 4-73 spill instructions; their speed "
    "is the benchmark's to hold"
)
_ALIBI_SM90_D256 = (
    "Hopper forward at head dim 256 with ALiBi: U is 128 fp32 registers a consumer thread, and the bias's row terms "
    "and slope beside them leave 24 bytes of stack, 7 STL and 9 LDL, none in the K/V step loops; the plain kernel "
    "keeps 8 bytes (_SM90_D256_CLAIMS)"
)
_PACKED_SM90_WIDE = (
    "Hopper forward at head dims 192 and 256 for packed batches: as _SM90_D256_CLAIMS, with a sequence's offsets and "
    "lengths beside the claimed index in the per-tile code: 5-35 spill instructions outside the K/V step loops"
)

_PAGED_SM90 = (
    "Hopper forward reading a paged cache where it lies, at head dims 192 (fp16, causal) and 256 (where the packed "
    "kernels spill already, _PACKED_SM90_WIDE): the producer warpgroup's 24 registers (setmaxnreg) hold a box's "
    "page lookup beside the TMA coordinates of 3-4 column boxes: 5-37 spill instructions"
)

_VALUE_MMA_SYNC = (
    "the mma.sync forward with v's head dim 64 beside q's 128, at d128's tiles (2 stages under a mask), where every "
    "plain d128 variant spills (_D128): V's and O's own copies, predicates and shared-memory layouts beside Q's and "
    "K's leave 1-11 spill instructions under masks"
)


def _built(names) -> list[str]:
    """Those of ``names`` (variants the heuristics pick, each checked to be one) that the sampled matrix builds."""
    names = list(names)
    unknown = [name for name in names if name not in EVERY_ID]
    assert not unknown, f"spill table entries that name no variant: {unknown}"
    return [name for name in names if name in ALL_IDS]


EVERY_ID = {
    f"{arch}-{config.label}"
    for arch in ARCHS
    for groups in (registry.variants(arch, exact_only=True), registry.variants(arch, buckets=(PADDED_BUCKET,)))
    for configs in groups.values()
    for config in configs
} | set(ALL_IDS)


KNOWN_SPILLS: dict[str, str] = {
    **dict.fromkeys(
        _built(
            [
                "sm_80-bfloat16-d128-128x64w4s2-lazy8-both-softcap",
                "sm_80-bfloat16-d64-128x128w4s2-right-softcap",
                "sm_80-bwd-float16-d192-64x64w8-nomask-softcap",
                "sm_80-bwdnodq-float16-d128-64x128w8-nomask-softcap",
                "sm_80-float16-d32-128x128w4s1-nomask-softcap",
                "sm_80-float16-d96-128x64w4s1-left-softcap",
                "sm_90a-bfloat16-d128-128x64w4s2-lazy8-both-softcap",
                "sm_90a-bfloat16-d256-128x128w8s1-right-softcap",
                "sm_90a-bfloat16-d64-128x128w4s2-right-softcap",
                "sm_90a-bwdnodq-float16-d96-64x128w8-left-softcap",
                "sm_90a-float16-d96-128x64w4s1-left-softcap",
            ]
        ),
        _SOFTCAP_MMA_SYNC,
    ),
    **dict.fromkeys(
        _built(
            [
                "sm_80-bfloat16-d128-128x64w4s2-lazy8-both-sink",
                "sm_80-bfloat16-d64-128x128w4s2-right-sink",
                "sm_90a-bfloat16-d128-128x64w4s2-lazy8-both-sink",
                "sm_90a-bfloat16-d128-128x64w4s2-lazy8-left-sink",
                "sm_90a-bfloat16-d256-128x128w8s1-right-sink",
                "sm_90a-bfloat16-d64-128x128w4s2-right-sink",
                "sm_90a-float16-d96-128x64w4s1-left-sink",
                "sm_90a-float16-d128-128x64w4s2-lazy8-right-sink",
            ]
        ),
        _SINK_MMA_SYNC,
    ),
    **dict.fromkeys(
        _built(
            [
                "sm_80-bfloat16-d128-128x64w4s2-lazy8-both-alibi",
                "sm_80-bfloat16-d64-128x128w4s2-right-alibi",
                "sm_80-bwd-bfloat16-d128-64x128w8-both-alibi",
                "sm_80-bwd-float16-d96-64x128w8-left-alibi",
                "sm_80-bwdnodq-float16-d128-64x128w8-nomask-alibi",
                "sm_80-float16-d32-128x128w4s1-nomask-alibi",
                "sm_90a-bfloat16-d128-128x64w4s2-lazy8-both-alibi",
                "sm_90a-bfloat16-d256-128x128w8s1-right-alibi",
                "sm_90a-bfloat16-d64-128x128w4s2-right-alibi",
                "sm_90a-bwdnodq-float16-d96-64x128w8-left-alibi",
                "sm_90a-bwdnodq-bfloat16-d128-64x128w8-both-alibi",
                "sm_90a-float16-d32-128x128w4s1-nomask-alibi",
                "sm_90a-float16-d96-128x64w4s1-left-alibi",
            ]
        ),
        _ALIBI_MMA_SYNC,
    ),
    **dict.fromkeys(_built(["sm_90a-sm90-bfloat16-d256-128x80s2-early-lazy8e-right-alibi"]), _ALIBI_SM90_D256),
    **dict.fromkeys(
        _built(
            [
                "sm_80-bfloat16-d128-128x64w4s1-lazy8-nomask-packed",
                "sm_80-bfloat16-d128-128x64w4s2-lazy8-left-packed",
                "sm_80-bfloat16-d32-128x128w4s1-both-packed",
                "sm_80-bfloat16-d32-128x128w4s1-right-packed",
                "sm_80-bfloat16-d64-128x128w4s2-left-packed",
                "sm_80-bfloat16-d64-128x128w4s2-nomask-packed",
                "sm_80-bfloat16-d96-128x64w4s1-both-packed",
                "sm_80-bfloat16-d96-128x64w4s1-right-packed",
                "sm_80-bwdnodq-bfloat16-d128-64x128w8-left-packed",
                "sm_80-bwdnodq-bfloat16-d128-64x128w8-nomask-packed",
                "sm_80-float16-d128-128x64w4s2-lazy8-both-packed",
                "sm_80-float16-d128-128x64w4s2-lazy8-right-packed",
                "sm_80-float16-d32-128x128w4s1-left-packed",
                "sm_80-float16-d32-128x128w4s1-nomask-packed",
                "sm_80-float16-d64-128x128w4s2-both-packed",
                "sm_80-float16-d64-128x128w4s2-right-packed",
                "sm_80-float16-d96-128x64w4s1-left-packed",
                "sm_80-float16-d96-128x64w4s1-nomask-packed",
                "sm_80-bfloat16-d64-128x128w4s2-right-packed",
                "sm_80-bfloat16-d128-128x64w4s2-lazy8-both-packed",
                "sm_90a-bfloat16-d64-128x128w4s2-right-packed",
                "sm_90a-bfloat16-d128-128x64w4s2-lazy8-both-packed",
                "sm_90a-bfloat16-d256-128x128w8s1-right-packed",
                "sm_90a-bwd-bfloat16-d128-64x128w8-both-packed",
                "sm_90a-bwdnodq-bfloat16-d128-64x128w8-both-packed",
                "sm_90a-bfloat16-d256-128x128w8s1-left-packed",
                "sm_90a-bfloat16-d64-128x128w4s2-left-packed",
                "sm_90a-bwd-bfloat16-d128-64x128w8-left-packed",
                "sm_90a-bwdnodq-float16-d128-64x128w8-right-packed",
                "sm_90a-float16-d128-128x64w4s2-lazy8-right-packed",
            ]
        ),
        _PACKED_MMA_SYNC,
    ),
    **dict.fromkeys(
        _built(
            [
                "sm_90a-sm90-bfloat16-d192-128x96s2-early-lazy8e-both-packed",
                "sm_90a-sm90-bfloat16-d256-128x80s2-early-lazy8-nomask-packed",
                "sm_90a-sm90-bfloat16-d256-128x80s2-early-lazy8e-right-packed",
                "sm_90a-sm90-bfloat16-d256-128x80s2-early-lazy8e-left-packed",
                "sm_90a-sm90-float16-d256-128x80s2-early-lazy8e-both-packed",
                "sm_90a-sm90-float16-d256-128x80s2-early-lazy8e-right-packed",
            ]
        ),
        _PACKED_SM90_WIDE,
    ),
    **dict.fromkeys(
        _built(
            f"sm_90a-sm90-{dtype}-{tiles}-packed-paged{rows}"
            for dtype in ("bfloat16", "float16")
            for tiles, rows in (
                ("d256-128x80s2-early-lazy8-nomask", 16),
                ("d256-128x80s2-early-lazy8e-right", 16),
                ("d256-128x80s2-early-lazy8e-both", 16),
                ("d256-128x80s2-early-lazy8e-left", 16),
            )
        ),
        _PAGED_SM90,
    ),
    **dict.fromkeys(
        _built(f"sm_90a-sm90-float16-d192-128x96s2-early-lazy8e-right-packed-paged{rows}" for rows in (16, 32)),
        _PAGED_SM90,
    ),
    **dict.fromkeys(
        _built(
            [
                "sm_80-float16-d128v64-128x64w4s2-lazy8-both",
                "sm_90a-bfloat16-d128v64-128x64w4s2-lazy8-both",
                "sm_90a-float16-d128v64-128x64w4s2-lazy8-right",
            ]
        ),
        _VALUE_MMA_SYNC,
    ),
    **dict.fromkeys(
        _built(
            name
            for dtype in ("bfloat16", "float16")
            for mask in ("lazy8-nomask", "lazy8e-nomask", "lazy8e-left", "lazy8e-both", "lazy8e-right")
            for variant in ("", "-softcap", "-sink")
            if (name := f"sm_90a-sm90-{dtype}-d256-128x80s2-early-{mask}{variant}") in EVERY_ID
        ),
        _SM90_D256_CLAIMS,
    ),
    **dict.fromkeys(
        _built(
            f"sm_90a-sm90bwd-{name}"
            for name in (
                "bfloat16-d64-128x128s2-dvlate-dkearly-both",
                "bfloat16-d64-128x128s2-dvlate-dkearly-both-packed",
                "bfloat16-d64-128x128s2-dvlate-dkearly-det-both",
                *(f"{t}-d64-128x128s2-dvlate-dkearly-{mask}-softcap" for t in DTYPES for mask in MASK_NAMES.values()),
                *(f"{t}-d64-128x128s2-dvlate-dkearly-{mask}-alibi" for t in DTYPES for mask in ("right", "left")),
                "float16-d64-128x128s2-dvlate-dkearly-nomask-alibi",
            )
        ),
        _SM90_BWD,
    ),
    **dict.fromkeys(
        _built(
            [
                "sm_80-bwd-bfloat16-d192-64x64w8-both",
                "sm_80-bwd-bfloat16-d256-64x64w8-left",
                "sm_80-bwd-float16-d128-64x128w8-nomask",
                "sm_80-bwd-float16-d256-64x64w8-both",
                "sm_80-bwd-float16-d256-64x64w8-left",
                "sm_80-bwd-float16-d256-64x64w8-nomask",
                "sm_80-bwd-float16-d256-64x64w8-right",
                "sm_80-bwdnodq-bfloat16-d128-64x128w8-both",
                "sm_80-bwdnodq-bfloat16-d128-64x128w8-left",
                "sm_80-bwdnodq-bfloat16-d128-64x128w8-nomask",
                "sm_80-bwdnodq-bfloat16-d128-64x128w8-right",
                "sm_80-bwdnodq-bfloat16-d96-64x128w8-right",
                "sm_80-bwdnodq-float16-d128-64x128w8-both",
                "sm_80-bwdnodq-float16-d128-64x128w8-left",
                "sm_80-bwdnodq-float16-d128-64x128w8-nomask",
                "sm_80-bwdnodq-float16-d128-64x128w8-right",
                "sm_80-bwdnodq-float16-d96-64x128w8-right",
                "sm_90a-bwd-bfloat16-d256-64x64w8-right",
                "sm_90a-bwdnodq-bfloat16-d128-64x128w8-both",
                "sm_90a-bwdnodq-float16-d128-64x128w8-right",
            ]
        ),
        _BWD,
    ),
    # the same kernels at a head dim padded up to 128 (head-dim predicates on every load and store)
    **dict.fromkeys(
        _built(
            [
                "sm_80-bwd-bfloat16-d128pad-64x128w8-both",
                "sm_80-bwd-bfloat16-d128pad-64x128w8-left",
                "sm_80-bwd-float16-d128pad-64x128w8-both",
                "sm_80-bwd-float16-d128pad-64x128w8-nomask",
                "sm_80-bwdnodq-bfloat16-d128pad-64x128w8-both",
                "sm_80-bwdnodq-bfloat16-d128pad-64x128w8-left",
                "sm_80-bwdnodq-bfloat16-d128pad-64x128w8-nomask",
                "sm_80-bwdnodq-bfloat16-d128pad-64x128w8-right",
                "sm_80-bwdnodq-float16-d128pad-64x128w8-both",
                "sm_80-bwdnodq-float16-d128pad-64x128w8-left",
                "sm_80-bwdnodq-float16-d128pad-64x128w8-nomask",
                "sm_80-bwdnodq-float16-d128pad-64x128w8-right",
                "sm_90a-bwdnodq-bfloat16-d128pad-64x128w8-both",
            ]
        ),
        _BWD,
    ),
    **dict.fromkeys(
        _built(
            [
                "sm_80-bfloat16-d32-128x128w4s1-both",
                "sm_80-bfloat16-d32-128x128w4s1-left",
                "sm_80-bfloat16-d32-128x128w4s1-nomask",
                "sm_80-bfloat16-d32-128x128w4s1-right",
                "sm_80-float16-d32-128x128w4s1-both",
                "sm_80-float16-d32-128x128w4s1-right",
            ]
        ),
        _D32,
    ),
    **dict.fromkeys(
        _built(
            f"sm_90a-{dtype}-d256-128x128w8s1-{mask}"
            for dtype in ("bfloat16", "float16")
            for mask in ("nomask", "right", "both", "left")
        ),
        _D256,
    ),
    **dict.fromkeys(
        _built(
            f"{arch}-{dtype}-d64-128x128w4s2-{mask}"
            for arch in ("sm_80", "sm_90a")
            for dtype in ("bfloat16", "float16")
            for mask in ("nomask", "right", "both", "left")
        ),
        _D64,
    ),
    **dict.fromkeys(
        _built(
            [
                "sm_80-bfloat16-d96-128x64w4s1-both",
                "sm_80-bfloat16-d96-128x64w4s1-nomask",
                "sm_80-bfloat16-d96-128x64w4s1-right",
                "sm_80-float16-d96-128x64w4s1-both",
                "sm_80-float16-d96-128x64w4s1-nomask",
                "sm_80-float16-d96-128x64w4s1-right",
                "sm_90a-float16-d96-128x64w4s1-left",
            ]
        ),
        _D96,
    ),
    **dict.fromkeys(
        _built(
            f"{arch}-{dtype}-{d}-128x64w4s{stages}-lazy8-{mask}"
            for arch in ("sm_80", "sm_90a")
            for dtype in ("bfloat16", "float16")
            for d in ("d128", "d128pad")
            for stages, masks in ((1, ("nomask",)), (2, ("left", "both", "right")))
            for mask in masks
        ),
        _D128,
    ),
}


# ptxas comes with the DSL's CUDA flavor (sass.dsl_toolkit), and the two allocate registers a little differently:
# these backward variants spill under one and not the other. CI and the H200 host compile with CUDA 13 (the test
# extra installs nvidia-cutlass-dsl[cu13]); a CUDA 12 driver takes the cu12 flavor.
KNOWN_SPILLS_BY_TOOLKIT: dict[int, dict[str, str]] = {
    12: dict.fromkeys(
        _built(
            [
                "sm_80-bwd-bfloat16-d192-64x64w8-left",
                "sm_80-bwd-bfloat16-d192-64x64w8-right",
            ]
        ),
        _BWD,
    ),
    13: dict.fromkeys(
        _built(
            [
                "sm_80-bwd-bfloat16-d192-64x64w8-nomask",
                "sm_80-bwdnodq-bfloat16-d96-64x128w8-nomask",
                "sm_80-bwdnodq-float16-d96-64x128w8-both",
            ]
        ),
        _BWD,
    ),
}


@pytest.fixture(scope="session")
def reports(request, tmp_path_factory) -> dict[str, SassReport | Exception]:
    """Every variant that a selected test reads compiled once (all of them in a full run; `-k` narrows it), two at
    a time (CI has 2 cores), in fresh worker processes."""
    selected = {item.callspec.id for item in request.session.items if "reports" in getattr(item, "fixturenames", ())}
    ids = [variant_id for variant_id in IDS if variant_id in selected]
    variants = [variant for variant, variant_id in zip(VARIANTS, IDS, strict=True) if variant_id in selected]
    results = inspect_variants(variants, tmp_path_factory.mktemp("sass"), jobs=2)
    return dict(zip(ids, results, strict=True))


def report_of(reports: dict[str, SassReport | Exception], variant_id: str) -> SassReport:
    report = reports[variant_id]
    if isinstance(report, Exception):
        pytest.fail(f"{variant_id} did not compile: {type(report).__name__}: {report}")
    return report


# Plain configs of each kernel that takes v's head dim apart from q's: the Hopper forward with O in Q's shared memory,
# the sm80 forward and the sm80 dK/dV kernel
PLAIN_WIDTHS = [
    (sm90_fwd_config(192, "bfloat16", -1, 0), "sm_90a"),
    (fwd_config(128, "float16", -1, -1, arch="sm_80"), "sm_80"),
    (bwd_config(64, "bfloat16", -1, 0), "sm_80"),
]


@pytest.mark.parametrize(("config", "arch"), PLAIN_WIDTHS, ids=[f"{a}-{c.label}" for c, a in PLAIN_WIDTHS])
def test_v_named_at_q_width_builds_the_plain_kernel(tmp_path, config, arch: str):
    """A config that names v's head dim as q's generates the plain config's machine code: the code that takes v's
    width apart from q's reduces to the plain kernel's where the widths agree."""
    widths = {"head_dim_v_padded": config.head_dim_padded, "exact_head_dim_v": config.exact_head_dim}
    named = dataclasses.replace(config, **widths)
    code = []
    for variant, folder in ((config, tmp_path / "plain"), (named, tmp_path / "named")):
        registry.compile_any(variant, arch, folder)
        (cubin,) = folder.glob("*.cubin")
        code.append(machine_code(cubin))
    assert code[0].count("\n") > 1000 and code[0] == code[1]


@pytest.mark.parametrize(("config", "arch"), VARIANTS, ids=IDS)
def test_sass_holds_the_algorithms_instructions(reports, config, arch: str):
    report = report_of(reports, f"{arch}-{config.label}")
    assert report.arch == arch  # the cubin is really for the target asked for
    if hasattr(config, "softcap"):  # the cap's tanh (MUFU.TANH) in the variants that cap scores, and only there
        assert (report.count("MUFU.TANH") > 0) == config.softcap, report.opcodes
    if isinstance(config, BwdPreConfig | BwdPostConfig):
        # O, dO and dQaccum are read 16 bytes a load (and the LSE with lse_log2 or sinks, dLSE with dlse, 4 bytes a
        # row); dQaccum (zeroed) and dQ written 16 bytes a store; D (and LSE * log2(e), the sinks' rows) 4 bytes; the
        # sinks' probabilities by exp2
        row_loads = report.count("LDG") - report.count("LDG.E.128")
        rows_read = any(getattr(config, name, False) for name in ("lse_log2", "dlse", "sink"))
        assert report.count("LDG.E.128") > 0 and (row_loads > 0) == rows_read, report.opcodes
        assert (report.count("MUFU.EX2") > 0) == getattr(config, "sink", False), report.opcodes
        tile_stores = report.count("STG.E.128")
        assert (tile_stores > 0) == (isinstance(config, BwdPostConfig) or config.clear_dq_accum), report.opcodes
        assert (report.count("STG") > tile_stores) == isinstance(config, BwdPreConfig), report.opcodes
        for opcode in ("HMMA", "LDGSTS", "LDS", "STS"):
            assert report.count(opcode) == 0, f"{opcode} in a kernel that streams through registers"
        return
    if isinstance(config, CombineConfig):
        # the partial O rows read and O written 16 bytes a thread; the LSE rows 4 bytes; exp2 weights, no MMA
        assert report.count("LDG.E.128") > 0 and report.count("LDG.E") > 0, report.opcodes
        assert report.count("STG.E.128") > 0 and report.count("STG.E") > 0 and report.count("MUFU.EX2") > 0
        for opcode in ("HMMA", "LDGSTS", "LDS", "STS"):
            assert report.count(opcode) == 0, f"{opcode} in a kernel that streams through registers"
        return
    if isinstance(config, ZeroRowsConfig):
        # the lengths read 4 bytes, a warp's vote on its rows, and zeros stored 16 bytes a lane; nothing read in bulk
        assert report.count("VOTE.ANY") > 0 and report.count("STG.E.128") > 0, report.opcodes
        assert report.count("LDG.E") > 0 and report.count("LDG.E.128") == 0, report.opcodes
        for opcode in ("HMMA", "LDGSTS", "LDS", "STS", "MUFU.EX2"):
            assert report.count(opcode) == 0, f"{opcode} in a kernel that only zeroes"
        return
    if isinstance(config, AppendConfig):
        # the new keys and values copied 16 bytes a thread, the lengths (and rows, pages) read and the counts
        # written 4 bytes; nothing else
        assert (report.count("LDG.E.128") > 0) == config.keys, report.opcodes
        assert (report.count("STG.E.128") > 0) == config.keys, report.opcodes
        assert (report.count("STG.E") > report.count("STG.E.128")) == config.counts, report.opcodes
        for opcode in ("HMMA", "LDGSTS", "LDS", "STS", "MUFU.EX2"):
            assert report.count(opcode) == 0, f"{opcode} in a kernel that only copies"
        return
    if isinstance(config, (Sm90FwdConfig, Sm90BwdConfig)):
        # each GEMM's wgmmas are issued back to back and waited on once: where ptxas runs out of registers for
        # them it waits after every one (C7512), as the backward's 80-row tiles did with dV's MMA before dS^T
        assert report.count("WARPGROUP.DEPBAR") * 4 <= report.count("HGMMA"), report.opcodes
    if isinstance(config, Sm90FwdConfig):
        for opcode in ("HGMMA", "UTMALDG", "SYNCS", "USETMAXREG", "MUFU.EX2"):
            assert report.count(opcode) > 0, f"no {opcode} in the SASS"
        # O leaves by TMA stores, or in a packed batch by 16-byte stores that stop at the sequence's end
        assert (report.count("UTMASTG") > 0) != config.packed, report.opcodes
        assert (report.count("STG.E.128") > 0) == config.packed, report.opcodes
        for opcode in ("HMMA", "LDGSTS"):
            assert report.count(opcode) == 0, f"{opcode} in the Hopper kernel's SASS"
        # claimed tiles: one atomic add on the counter per tile the producer warp claims
        assert report.count("ATOMG.E.ADD") > 0, report.opcodes
        # taking turns: each consumer warpgroup hands the MMA turn on with a named-barrier arrive
        assert (report.count("BAR.ARV") > 0) == (config.num_mma_warpgroups > 1), report.opcodes
        # P and O go to 16 bits two values an F2FP, none one at a time and packed by a PRMT (layout.store_converted)
        assert report.count("PRMT") == 0, report.opcodes
        return
    if isinstance(config, Sm90BwdConfig):  # TMA tiles, bulk-copied LSE and D rows, dQ by TMA reduce-adds
        for opcode in ("HGMMA", "UTMALDG", "UBLKCP", "UTMAREDG", "SYNCS", "USETMAXREG", "MUFU.EX2"):
            assert report.count(opcode) > 0, f"no {opcode} in the SASS"
        for opcode in ("HMMA", "LDGSTS", "REDG.E.ADD.F32", "RED.E"):
            assert report.count(opcode) == 0, f"{opcode} in the Hopper backward's SASS"
        # dS^T goes to shared memory by stmatrix, four 8 x 8 tiles an instruction, not two values a store
        assert report.count("STSM.16.M88.4") > 0, report.opcodes
        # deterministic: the dQ writer's turn, an acquire load spinning on the Q tile's counter and a release add
        counter_ops = (report.count("LDG.E.STRONG.GPU"), report.count("REDG.E.ADD.S32.STRONG.GPU"))
        assert (min(counter_ops) > 0) == config.deterministic and (max(counter_ops) > 0) == config.deterministic
        return
    mma = "HMMA.16816.F32.BF16" if config.dtype == "bfloat16" else "HMMA.16816.F32"
    assert {op for op in report.opcodes if op.startswith("HMMA")} == {mma}
    for opcode in ("LDGSTS", "LDSM", "LDSM.16.MT88", "MUFU.EX2"):
        assert report.count(opcode) > 0, f"no {opcode} in the SASS"
    reductions = sum(report.count(op) for op in ("RED.E.ADD.F32", "REDG.E.ADD.F32", "REDG.E.ADD.F32x2"))
    if isinstance(config, BwdConfig) and config.accumulate_dq:
        assert reductions > 0, "no fp32 reduction for dQ"
    else:
        assert reductions == 0, "atomics in a kernel that must add in a fixed order"


@pytest.mark.parametrize(("config", "arch"), VARIANTS, ids=IDS)
def test_no_register_spills_but_the_known_ones(reports, config, arch: str):
    variant_id = f"{arch}-{config.label}"
    report = report_of(reports, variant_id)
    found = f"{report.registers} registers, {report.stack_bytes} bytes of stack, {report.count('STL')} STL"
    if variant_id in KNOWN_SPILLS or variant_id in KNOWN_SPILLS_BY_TOOLKIT[dsl_toolkit()]:
        assert report.spills > 0, f"{variant_id} no longer spills ({found}): remove it from KNOWN_SPILLS"
    else:
        assert report.spills == 0 and report.stack_bytes == 0, (
            f"{variant_id} spills: {found}, {report.count('LDL')} LDL"
        )


def test_alibi_costs_the_hopper_forwards_free_steps_one_ffma_a_score(tmp_path):
    """Without a mask the Hopper forward's free run comes in three step loops (TileInfo.visit_runs' sides): on the
    tiles wholly on one side of the diagonal ALiBi's bias takes one FFMA a score (common/alibi.py, the linear form)
    and its FADD/FFMA count exceeds the plain step's by about the scores a thread holds; only the loop of the tiles
    the diagonal crosses takes the exact form's two operations a score."""
    from flashcute.kernels.sass import compile_and_inspect

    plain = sm90_fwd_config(128, "bfloat16", -1, -1)
    reports = [
        compile_and_inspect(c, "sm_90a", tmp_path / str(c.alibi))
        for c in (plain, dataclasses.replace(plain, alibi=True))
    ]

    def adds(ops: dict) -> int:
        return ops.get("FFMA", 0) + ops.get("FADD", 0)

    step = adds(reports[0].loop_opcodes[0])
    scores = 64 * plain.block_n // 128  # a consumer thread's share of its warpgroup's 64 x block_n scores
    extra = sorted(adds(ops) - step for ops in reports[1].loop_opcodes[:3])
    assert extra[0] <= scores + 8 and extra[1] <= scores + 8 and extra[2] >= 2 * scores - 8, extra


def test_lse_ahead_issues_the_lse_loads_before_the_wait_for_s(tmp_path):
    """lse_ahead (D=128 under a causal mask): both step loops issue the Q tile's LSE loads (8 LDS.64 at 64-row
    tiles) before their first wgmma wait, where the loads would otherwise sink to their use after it (as they do in
    the same kernel without it, which issues no shared-memory load before that wait)."""
    from flashcute.kernels.sass import _run, compile_and_inspect, innermost_loops

    ahead = sm90_bwd_config(128, "bfloat16", -1, 0)
    assert ahead.lse_ahead

    def loads_before_the_first_wait(config) -> list[int]:
        compile_and_inspect(config, "sm_90a", tmp_path / config.label)
        (cubin,) = (tmp_path / config.label).glob("*.cubin")
        counts = []
        for body in innermost_loops(_run("nvdisasm", "-c", str(cubin)))[:2]:
            first_wait = next(i for i, line in enumerate(body) if "WARPGROUP.DEPBAR" in line)
            counts.append(sum(" LDS" in line for line in body[:first_wait]))
        return counts

    assert loads_before_the_first_wait(ahead) == [8, 8]
    assert loads_before_the_first_wait(dataclasses.replace(ahead, lse_ahead=False)) == [0, 0]


def test_known_spills_name_compiled_variants():
    assert set(KNOWN_SPILLS) <= set(ALL_IDS)
    for toolkit, names in KNOWN_SPILLS_BY_TOOLKIT.items():
        assert set(names) <= set(ALL_IDS) - set(KNOWN_SPILLS), toolkit


def test_step_loops_are_the_innermost_loops_largest_first():
    listing = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
.L_x_1:
        /*0020*/                   FFMA R3, R3, R4, R5 ;
        /*0030*/                   FFMA R3, R3, R4, R5 ;
        /*0040*/               @P0 BRA `(.L_x_1) ;
        /*0050*/               @P1 BRA `(.L_x_2) ;
        /*0060*/                   FADD R6, R6, R3 ;
        /*0070*/               @P2 BRA `(.L_x_1) ;
.L_x_2:
        /*0080*/               @P3 BRA `(.L_x_0) ;
.L_x_3:
        /*0090*/                   MUFU.EX2 R7, R7 ;
        /*00a0*/               @P4 BRA `(.L_x_3) ;
        /*00b0*/                   EXIT ;
"""
    # .L_x_1 runs to its last branch back (6 instructions, the forward branch to .L_x_2 inside it), .L_x_3 is 2;
    # .L_x_0 holds .L_x_1, so it is not innermost
    assert step_loops(listing) == (6, 2)
    assert step_loops("/*0000*/ EXIT ;") == ()


@pytest.mark.parametrize(
    ("disassembly", "arch"),
    [
        ('\t.target\tsm_90a\n\n\t.elftype\t@"ET_EXEC"\n', "sm_90a"),  # CUDA 13's ELF layout
        ("\t.target\tsm_80\n", "sm_80"),
        ('\t.headerflags\t@"EF_CUDA_64BIT_ADDRESS EF_CUDA_ACCELERATORS EF_CUDA_SM90"\n', "sm_90a"),  # CUDA 12's
        ('\t.headerflags\t@"EF_CUDA_64BIT_ADDRESS EF_CUDA_SM80 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM80)"', "sm_80"),
        ('\t.elftype\t@"ET_EXEC"\n', None),
    ],
)
def test_target_arch_from_either_disassembly_layout(disassembly: str, arch: str | None):
    assert _target_arch(disassembly) == arch


CACHE_SCRIPT = """
import sys
from flashcute import compile_cache
from flashcute.kernels.sm80.config import fwd_config
from flashcute.kernels.sm80.family import compile

config = fwd_config(32, "float16")


def refuse():
    raise AssertionError("compiled although the kernel is in the disk cache")


build = (lambda: compile(config, "sm_80")) if sys.argv[1] == "compile" else refuse
kernel = compile_cache.get_compiled("sm_80", config, build)
print(callable(kernel), type(kernel).__name__)
"""


def test_compile_cache_carries_a_kernel_to_the_next_process(tmp_path):
    """A kernel built in one process is loaded by the next; both hand out the bare TVM-FFI function (CuTe DSL's
    Python wrapper of a kernel compiled in the process is left out of every launch), where a C compiler links the
    entry into a shared library. (CuTe DSL builds a callable kernel only for the target CUTE_DSL_ARCH names, which
    the compiles of this process may have set to another.)"""
    env = {**os.environ, "FLASHCUTE_CACHE_DIR": str(tmp_path), "CUTE_DSL_ARCH": "sm_80"}

    def run(mode: str) -> list[str]:
        result = subprocess.run(
            [sys.executable, "-c", CACHE_SCRIPT, mode], env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    assert run("compile") == ["True", "Function"]
    entries = compile_cache.entries(tmp_path)
    assert len(entries) == 1
    loaded = run("load")  # the build that would raise was never called
    assert loaded[0] == "True"
    if entries[0].suffix == ".so":
        assert loaded[1] == "Function"


def test_a_background_build_hands_its_kernels_to_this_process(tmp_path, monkeypatch):
    """build_in_background builds in a process of its own, which imports no torch (an import of it fails there),
    into the disk cache; get_compiled waits for that process and loads what it wrote, building nothing here. A
    kernel in memory or on disk, or a cache folder this process cannot write to, starts no process."""
    monkeypatch.setenv("FLASHCUTE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_cache, "_memory", {})
    monkeypatch.setattr(compile_cache, "_building", {})
    config = bwd_post_config(64, "bfloat16")

    def refuse(*args, **kwargs):
        raise AssertionError("built here, or a process started, although the kernel is built")

    compile_cache.build_in_background("sm_80", [config])
    assert list(compile_cache._building) == [("sm_80", config)]
    assert callable(compile_cache.get_compiled("sm_80", config, refuse))
    assert not compile_cache._building and len(compile_cache.entries(tmp_path)) == 1
    monkeypatch.setattr(compile_cache.subprocess, "Popen", refuse)
    compile_cache.build_in_background("sm_80", [config])  # in memory
    monkeypatch.setattr(compile_cache, "_memory", {})
    compile_cache.build_in_background("sm_80", [config])  # on disk
    assert not compile_cache._building
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("FLASHCUTE_CACHE_DIR", str(tmp_path / "a-file" / "cache"))  # a folder no one can make
    compile_cache.build_in_background("sm_80", [config])  # (a process could not hand the kernel over)
