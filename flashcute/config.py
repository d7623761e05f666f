"""Kernel configurations: one frozen dataclass per kernel family and the one heuristic that picks it.

A config holds every compile-time choice of a kernel and nothing that changes per call, so it is the compile-cache
key (see compile_cache.py): two calls with the same config never compile twice.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

# Head dims are padded up to one of these buckets; a head dim below its bucket is handled with predicates.
HEAD_DIM_BUCKETS = (32, 64, 96, 128, 192, 256)
DTYPES = ("float16", "bfloat16")

# Opt-in shared memory per thread block by target; sm_86 and sm_89 parts have the least.
MAX_SMEM_BYTES = {"sm_80": 163 * 1024, "sm_87": 163 * 1024, "sm_90a": 227 * 1024}
DEFAULT_MAX_SMEM_BYTES = 99 * 1024


def head_dim_bucket(head_dim: int) -> int:
    """The smallest bucket that holds ``head_dim`` (a multiple of 8 up to 256)."""
    for bucket in HEAD_DIM_BUCKETS:
        if head_dim <= bucket:
            return bucket
    raise ValueError(f"head_dim={head_dim} is over the largest supported head dim, {HEAD_DIM_BUCKETS[-1]}")


@dataclass(frozen=True)
class FwdConfig:
    """Static configuration of the sm80 forward kernel (one compiled kernel per distinct value).

    dtype:            "float16" or "bfloat16"
    head_dim_padded:  the head-dim bucket the kernel is built for
    exact_head_dim:   True when head_dim == head_dim_padded, so no head-dim predicates are needed
    block_m, block_n: rows of Q per thread block, rows of K/V per main-loop step
    num_warps:        warps per thread block
    num_stages:       shared-memory buffers for K and for V: 1 as in the seed, 2 to load one tile further ahead
    mask_right:       keys right of the diagonal are masked (causal, or a window with window_right >= 0)
    mask_left:        keys further left than window_left are masked (sliding window)
    warps_n:          warps side by side along N: 1 stacks all warps along M (each owns block_m / num_warps rows
                      and whole rows of S and O); 2 lets a pair of warps share rows, each taking half of S's
                      columns and half of O's head dim (half the K and V bytes a warp reads from shared memory;
                      the pair trades row maxima and P through shared memory: SPLIT_ROWS_NOTE)
    rescale_threshold: None rescales U at every K/V tile; t >= 0 keeps a row's running max until it grows by more
                      than t (exp2 units) and skips U's rescale in warps where no row's max moved (softmax.py,
                      lazy rescaling)
    """

    dtype: str
    head_dim_padded: int
    exact_head_dim: bool
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    mask_right: bool
    mask_left: bool
    warps_n: int = 1
    rescale_threshold: float | None = None

    @property
    def num_threads(self) -> int:
        return self.num_warps * 32

    @property
    def warps_m(self) -> int:
        return self.num_warps // self.warps_n

    def smem_bytes(self) -> int:
        """Shared memory of one thread block: a Q tile + num_stages K and V tiles, 2 bytes an element; with
        warps_n > 1 also P (block_m x block_n, 16-bit) and the pairs' row statistics (warps_n x block_m fp32)."""
        shared_rows = 2 * self.block_m * self.block_n + 4 * self.warps_n * self.block_m if self.warps_n > 1 else 0
        return 2 * self.head_dim_padded * (self.block_m + 2 * self.num_stages * self.block_n) + shared_rows


# Tile choices per head-dim bucket: (block_m, block_n, num_warps, num_stages[, warps_n]).
# Measured on one H200 (bf16, B = 16384 / L, H = 2048 / D, TFLOP/s at L = 4k / 16k, non-causal | causal) at commit
# 30111a9 with the sweep that is now scripts/tune.py:
#   D=64:  (128,64,4,1) 336/333 | 301/325   (128,64,4,2) 320/326 | 294/312   (128,128,4,1) 326/337 | 296/323
#          (128,128,8,1) 284/294 | 257/281  -> (128,64,4,1)
#   D=128: (128,64,4,1) 374/372 | 325/347   (128,64,4,2) 367/373 | 326/351   (128,32,4,1) 341/348 | 310/328
#          (128,64,8,1) 297/301 | 286/307   (64,64,4,1)  301/302 | 293/315   (128,128,8,1) 336/329 | 305/333
#          -> (128,64,4,1) then: 2 stages won only at 16k and by 1%
#   D=128 again with alternating rounds (scripts/tune.py --rounds 3, working tree after eaf89c6; bf16 non-causal |
#   causal, then fp16 non-causal | causal, 4k/16k each): (128,64,4,1) 368/382 | 327/357, 360/372 | 319/344
#          (128,64,4,2) 376/379 | 337/361, 378/383 | 337/364   (128,48,4,1) 360/375 | 329/354, 366/370 | 322/350
#          -> (128,64,4,2): ahead at 7 of 8
#          points (+1-6 %); a third thread block never fits beside two anyway (4 warps x 255 registers each)
#   D=256: (128,64,8,1) 340/342 | 294/351   (64,64,4,1)  323/318 | 297/313   (64,64,4,2) 296/300 | 279/294
#          (64,32,4,1)  300/302 | 275/302  -> (128,64,8,1)
#   D=128 and D=256 with every other round reversed (scripts/tune.py --kernel sm80 --headdim 256,128 --rounds 4 at
#   1341014; before it the first candidate, timed right after flash-attn-4, read 3-10 % low), bf16 then fp16,
#   non-causal 4k/16k | causal 4k/16k:
#     D=128 (128,64,4,1) 376/378 | 336/361, 369/376 | 329/356   (128,64,4,2) 375/388 | 331/365, 379/393 | 338/363
#           -> (128,64,4,2) stays (ahead at 6 of 8)
#     D=256 (128,64,8,1) 336/346 | 292/348, 331/342 | 287/339   (128,64,8,2) 340/347 | 292/350, 343/350 | 297/345
#           -> (128,64,8,1) stays: two stages gain 0-1 % (bf16) and 2-4 % (fp16) but need 192 KB of shared memory,
#           over sm_80's 163 KB, and in one process against main they did not show (branch sm80-order)
#   D=256 with split rows (warps_n=2, a pair of warps sharing each row band: SPLIT_ROWS_NOTE), scripts/tune.py
#   --kernel sm80 --headdim 256 --rounds 4 on one H200 (working tree on 80fc677), bf16 then fp16:
#     (128,64,8,1)   339/344 | 295/351, 336/341 | 293/339   (128,64,8,1,2) 327/333 | 292/343, 337/341 | 293/336
#     (128,64,8,2,2) 349/358 | 292/347, 346/350 | 304/352   (64,64,4,1,2)  313/321 | 302/329, 318/325 | 291/315
#     -> (128,64,8,2,2) where the target's shared memory holds it (209 KB: sm_90), else (128,64,8,1)
#   In one process against (128,64,8,1) (scripts/ab_inprocess.py --kernel sm80 --rounds 5, 60de4f3 against 80fc677),
#   new/old at 4k/16k: bf16 1.040/1.023 | causal 0.986/0.987, fp16 1.056/1.031 | causal 1.048/1.041; bf16 under a
#   right-side mask spills (KNOWN_SPILLS in tests/test_compile.py) and kept (128,64,8,1) until stop 23's re-timing
#   below replaced both on sm_90 by (128,128,8,1).
# SPLIT_ROWS_NOTE: at D=256 every warp of the (128,64,8,1) tile reads all of K and V through ldmatrix for its 16
# rows; ncu (bf16, 4k, non-causal) put shared memory at 80 % of its peak (tensor pipe 53 %, SDPA flash's kernel 77 %).
# Pairs of warps that split S's columns and O's head dim read half as much K and V each (P and the row maxima go
# through shared memory): 65 % of the peak, tensor pipe 55 %. The pair are neighbouring warps, on different
# schedulers: with the pair on one scheduler (warps w and w + 4) the one-stage split read 0.94-1.00 of (128,64,8,1)
# at D=256 and 0.92-0.97 at D=192 in one process. At D=128 (4 warps of 32 rows, 2 thread blocks an SM) 8 split
# warps read 268-279 against 357-380 TFLOP/s; at D=192 two split stages were even with (128,64,8,1) (bf16, 4k/16k:
# 328/338 | 288/338 against 329/339 | 292/342), so D=192 keeps it. Results: bench/results/2026-12-01-h200-s20.
#   D=64 again with the balanced round order (scripts/tune.py --kernel sm80 --headdim 64 --rounds 4, with (128,64,8,2,2)
#   and (64,64,4,1) added, on a9204d6's kernels; fp16 then bf16, non-causal 4k/16k | causal 4k/16k;
#   bench/results/2026-12-01-h200-s23/lease5): (128,64,4,1) 328/331 | 295/314, 335/336 | 309/327
#     (128,64,4,2) 326/331 | 302/323, 325/330 | 302/319   (128,128,4,1) 321/334 | 290/315, 326/336 | 307/328
#     (128,128,4,2) 332/339 | 306/330, 337/342 | 315/329   (128,128,8,1) 291/301 | 269/297, 291/302 | 269/300
#     (128,64,8,2,2) 214/218 | 201/221, 198/203 | 188/206   (64,64,4,1) 288/293 | 270/285, 290/298 | 273/291
#     -> (128,128,4,2): ahead at 8 of 8 (+0.6 % to +5.2 %), although it spills (KNOWN_SPILLS)
#   D=256 and D=96 again with the balanced round order (scripts/tune.py --kernel sm80 --rounds 4, other candidates,
#   on a9204d6's kernels; fp16 then bf16, non-causal 4k/16k | causal 4k/16k; bench/results/2026-12-01-h200-s23/lease7):
#     D=256 (128,64,8,2,2) 348/352 | 303/347, 348/355 | 294/349   (128,64,8,1) 338/343 | 296/343, 339/349 | 298/352
#           (128,128,8,1) 352/365 | 314/361, 358/370 | 311/366   (128,96,8,1,2) 340/355 | 294/340, 354/365 | 305/353
#           (128,32,8,2,2) 260/266 | 226/267, 278/285 | 245/289
#           -> (128,128,8,1) where the target's shared memory holds it (192 KB: sm_90), ahead at 8 of 8 points
#           (+1.0 % to +4.3 %) although it spills (KNOWN_SPILLS); sm_80 keeps (128,64,8,1)
#     D=96  (128,64,4,1) 341/346 | 317/332, 345/347 | 328/345   (128,64,4,2) 339/343 | 311/324, 357/362 | 317/341
#           (128,32,4,1) 315/320 | 299/314, 311/304 | 297/316   (128,32,4,2) 323/330 | 299/314, 308/310 | 285/307
#           (128,128,4,2) 257/265 | 244/260, 259/271 | 243/268   -> (128,64,4,1) stays (ahead at 6 of 8)
#   D=128 again once its steps skipped the row max on unmasked tiles (softmax.update_against_kept_max; scripts/tune.py
#   --kernel sm80 --headdim 128 --rounds 3 on 31a6f3b, bench/results/2026-12-01-h200-s26/lease1, TFLOP/s relative to
#   SDPA flash timed in turn, bf16 then fp16, non-causal 4k/16k | causal 4k/16k):
#     (128,64,4,1) 1.180/1.179 | 1.143/1.177, 1.173/1.175 | 1.130/1.173
#     (128,64,4,2) 1.159/1.161 | 1.152/1.180, 1.153/1.154 | 1.163/1.162
#     (128,48,4,1) 1.153/1.141 | 1.119/1.169, 1.147/1.122 | 1.141/1.155   (128,32,4,1) 1.108-1.134
#     (128,128,8,2) 0.878-0.968 (17 spill instructions), (64,64,4,2) 0.898-0.978 (none), 8-warp and split tiles
#     0.813-0.999
#     -> without a mask (128,64,4,1) (ahead at 4 of 4, +1.6 % to +1.8 %; the kept-max step needs fewer registers
#     than the step the two stages were chosen for), under a mask (128,64,4,2) stays (_SM80_TILES_UNMASKED)
# D=32 was not swept yet; it takes its neighbours' shapes within the register and shared-memory
# budgets (acc_O holds block_m * D / threads fp32 values a thread, acc_S block_m * block_n / threads).
# A bucket lists its choices best first; the heuristic takes the first that fits the target's shared memory.
_SM80_TILES: dict[int, tuple[tuple[int, ...], ...]] = {
    32: ((128, 128, 4, 1),),
    64: ((128, 128, 4, 2),),
    96: ((128, 64, 4, 1),),
    128: ((128, 64, 4, 2),),
    192: ((128, 64, 8, 1),),
    256: ((128, 128, 8, 1), (128, 64, 8, 1)),
}
_SM80_TILES_UNMASKED: dict[int, tuple[tuple[int, ...], ...]] = {128: ((128, 64, 4, 1),)}
"""Choices that replace a bucket's _SM80_TILES when the kernel has no mask (the note above)."""


# LAZY_RESCALE_NOTE: lazy rescaling (FwdConfig.rescale_threshold, softmax.py): a row's running max moves only when
# it grows by more than 8 in exp2's units (each E at most 256, far inside fp16 and bf16; FlashAttention-4's threshold
# on Blackwell), and a warp skips U's rescale when none of its rows moved. In one process against main (branch
# lazy-rescale, 4fda899, every kernel lazy; scripts/ab_inprocess.py --rounds 5, TFLOP/s new/base; bench/results/
# 2026-12-01-h200-s24, lease1 and lease2), non-causal 4k/16k | causal 4k/16k:
#   sm80 bf16 D=128 1.013/1.012 | 1.036/1.014   fp16 D=128 0.948/0.939 | 0.996/0.973
#        D=64 and D=256, both dtypes: 0.977-1.033, geometric mean 0.997
#   Hopper forward (then Sm90FwdConfig had the same knob), every head dim, dtype and mask at 1k/4k/16k:
#        0.870-1.027, geometric mean 0.972 (the vote and the branch cost more than the 64 multiplies a step save)
# and D=128 tiles x eager/lazy on their own (.../scripts/tune_lazy.py --rounds 4, lease3; TFLOP/s, e eager, l lazy):
#   bf16 (128,64,4,2) e 365/363 | 333/341  l 377/377 | 335/356   (128,64,4,1) e 371/375 | 335/356  l 368/374 | 336/349
#   fp16 (128,64,4,2) e 368/370 | 338/356  l 359/361 | 330/350   (128,64,4,1) e 366/372 | 328/350  l 360/366 | 323/343
#   ((128,48,4,2) lazy: 359-373, causal 316-338); again with the row max in one or two chains (lease7, branch
#   sm80-max-chains; two chains within 1 % either way): bf16 lazy/eager 1.021/1.022 | 1.028/1.020, fp16 0.934/0.951 |
#   1.000/0.986
# so at first only the sm80 bf16 D=128 kernel rescaled lazily. Then the unmasked steps stopped computing the row max
# (softmax.update_against_kept_max: E against the kept max first, the sums checked after, the full update only in a
# warp where one passes 2^8; free step 1199 SASS instructions with both paths against 991, the common path about 730,
# 1 STL / 1 LDL against 9 / 9). In one process against main 17f9f65 (branch sm80-kept-max, lazy at D=128 and D=256 in
# both dtypes; lease8), new/base at non-causal 4k/16k | causal 4k/16k:
#   bf16 D=128 1.038/1.059 | 1.011/1.029 (against the lazy kernel with the max)   fp16 D=128 1.024/1.019 | 0.997/1.035
#   (against eager)   D=256 0.922-0.958 (bf16 and fp16)
# so the sm80 D=128 kernels rescale lazily in both dtypes, on their (128,64,4,2) tile; sm80 D=256 rescales at every
# step. The Hopper forward's unmasked steps then skipped the row max the same way (update_against_kept_max after the
# wait for the previous P V, E straight into P; the D=128 free step's common path about 320 SASS instructions against
# 444). In one process against main c63f97b (branch sm90-kept-max, every head dim lazy; scripts/ab_inprocess.py
# --kernel sm90 --rounds 4; bench/results/2026-12-01-h200-s25, lease2 and lease3), new/base at 1k/4k/16k, bf16 | fp16:
#   D=64   1.089/1.087/1.120 | 1.147/1.147/1.137   causal 1.000/1.027/1.097 | 1.011/1.011/1.105
#   D=96   1.070/1.107/1.142 | 1.093/1.070/1.113   causal 1.039/1.028/1.106 | 1.025/0.979/1.059
#   D=128  1.079/1.069/1.113 | 1.053/1.044/1.119   causal 1.050/1.003/1.026 | 1.045/1.054/1.058
#   D=192  0.993/0.959/1.014 | 1.024/0.996/1.052   causal 0.983/0.977/1.011 | 0.993/0.974/1.006
#   D=256  1.020/0.976/1.032 | 1.014/0.999/1.041   causal 0.994/0.950/0.990 | 1.002/0.977/1.017
# (D=192 and D=256, whose U is rescaled during the next Q K^T, with that rescale skipped in the kept-max steps) and
#   D=32   1.111/1.168/1.182 | 1.135/1.192/1.209   causal 1.028/1.077/1.103 | 1.067/1.086/1.102   (lease4)
# so the Hopper forward rescales lazily at every head dim but under a mask at D >= 192. Under a mask, with K/V tiles
# shorter than the Q tile, the first tile walked (on the diagonal) shows no key to many rows (48-112 of 128 at D=256),
# which then failed the kept-max check at the first unmasked tile; softmax.update_against_kept_max can let them keep
# m = 0 there instead (Sm90FwdConfig.empty_rows_keep_zero). In one process against main 43f622c (branch
# sm90-empty-rows with that rule and kept max under a mask at every head dim; scripts/ab_inprocess.py --kernel sm90
# --causal yes --rounds 4; bench/results/2026-12-01-h200-s26, lease1), new/base at 1k/4k/16k, bf16 | fp16:
#   D=64 (192x128, lazy in both) 1.031/1.029/1.007 | 1.040/0.991/1.004
#   D=192 (lazy against eager) 0.971/1.018/1.004 | 0.997/0.989/0.994   D=256 1.023/1.015/0.993 | 1.011/0.976/1.001
#   D=128 (128x128, no such rows; only the check's instructions) 1.001/0.993/1.005 | 0.983/0.979/0.979
# so the rule is on where block_m > block_n (D=64), and D >= 192 under a mask stayed eager (until the kept-max step
# with E in place of S: EXP_IN_PLACE_NOTE).
LAZY_RESCALE_THRESHOLD = 8.0
_SM80_LAZY_RESCALE = frozenset({("bfloat16", 128), ("float16", 128)})


def _sm80_rescale_threshold(dtype: str, bucket: int) -> float | None:
    """FwdConfig.rescale_threshold for the sm80 forward: LAZY_RESCALE_NOTE."""
    return LAZY_RESCALE_THRESHOLD if (dtype, bucket) in _SM80_LAZY_RESCALE else None


def _sm90_rescale_threshold(bucket: int, masked: bool, exp_in_place: bool) -> float | None:
    """Sm90FwdConfig.rescale_threshold for the Hopper forward: LAZY_RESCALE_NOTE, EXP_IN_PLACE_NOTE."""
    return None if masked and bucket >= 192 and not exp_in_place else LAZY_RESCALE_THRESHOLD


# EXP_IN_PLACE_NOTE: Sm90FwdConfig.exp_in_place, the kept-max step with its exponentials ahead of the wait for the
# previous tile's P V (docs/perf-notes.md, stop 26's lead: at D=256 that P V is as long as the Q K^T, and E straight
# into P waits for it; under a mask D=256 had stayed eager since the kept-max step lost there). In one process on one
# H200 against the heuristic's kernels of 8af1eca (bench/results/2026-12-01-h200-s27, lease1, ab.log with 3 rounds and
# ab2.log with 5), new/base at 4k/16k/1k, bf16 | fp16:
#   D=256 causal (lazy + in place against eager)  1.030/1.013/1.026, 1.027/1.033/1.023 | 1.016/1.021/1.015,
#                                                 1.013/1.033/1.021
#   D=256 no mask (in place against E into P)     0.969/1.022/1.006 | 0.973/0.995/1.007
# and against the heuristic's kernels of 6c82ffc (bench/results/2026-12-01-h200-s28, lease1, 5 rounds, flash-attn-4
# timed in turn beside both):
#   D=192 causal (lazy + in place against eager)  1.024/1.004/1.005 | 1.016/0.998/1.036 (flash-attn-4: 1.016-1.077)
#   D=256 no mask, again                          0.997/0.984/1.000 | 1.000/1.000/1.017
# so D=192 and D=256 under a mask take it (lazy rescaling with it), D=256 without a mask keeps E into P, and the other
# head dims, not timed with it, keep their forms.
_SM90_EXP_IN_PLACE: frozenset[tuple[int, bool]] = frozenset({(192, True), (256, True)})


@functools.cache
def fwd_config(
    head_dim: int,
    dtype: str,
    causal: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    tiles: tuple[int, ...] | None = None,
    arch: str = "sm_80",
    rescale_threshold: float | str | None = "auto",
) -> FwdConfig:
    """The heuristic: pick the sm80 forward configuration for a problem on target ``arch``.

    causal=True is the same as window_right=0. ``tiles`` overrides the (block_m, block_n, num_warps, num_stages[,
    warps_n]) choice; the tuning sweep uses it. Without it, the bucket's first choice that fits the target's shared
    memory. ``rescale_threshold`` overrides the choice of LAZY_RESCALE_NOTE ("auto").
    """
    bucket = head_dim_bucket(head_dim)
    mask_right, mask_left = causal or window_right >= 0, window_left >= 0
    smem_limit = MAX_SMEM_BYTES.get(arch, DEFAULT_MAX_SMEM_BYTES)
    choices = _SM80_TILES[bucket] if mask_right or mask_left else _SM80_TILES_UNMASKED.get(bucket, _SM80_TILES[bucket])
    for choice in (tiles,) if tiles is not None else choices:
        block_m, block_n, num_warps, num_stages, *split = choice
        config = FwdConfig(
            dtype=dtype,
            head_dim_padded=bucket,
            exact_head_dim=head_dim == bucket,
            block_m=block_m,
            block_n=block_n,
            num_warps=num_warps,
            num_stages=num_stages,
            mask_right=mask_right,
            mask_left=mask_left,
            warps_n=split[0] if split else 1,
            rescale_threshold=_sm80_rescale_threshold(dtype, bucket)
            if rescale_threshold == "auto"
            else rescale_threshold,
        )
        if tiles is not None or config.smem_bytes() <= smem_limit:
            break
    return config


SM90_MAX_SMEM_BYTES = MAX_SMEM_BYTES["sm_90a"]


@dataclass(frozen=True)
class Sm90FwdConfig:
    """Static configuration of the Hopper forward kernel (kernels/sm90/fwd.py).

    block_m rows of Q per thread block, split into block_m / 64 consumer warpgroups of 64 rows each; block_n rows
    of K/V per main-loop step; num_stages shared-memory buffers each for K and V, filled by TMA.
    rescale_o_early: U *= alpha for tile n is applied at the next step, while that step's Q K^T runs, instead of
    after tile n's P V (worth it where U is large: 128 registers a thread at head dim 256). The other fields mean
    what they mean in FwdConfig.
    """

    dtype: str
    head_dim_padded: int
    exact_head_dim: bool
    block_m: int
    block_n: int
    num_stages: int
    mask_right: bool
    mask_left: bool
    rescale_o_early: bool = False
    claim_tiles: bool = False
    """True: the persistent thread blocks claim tiles from a global counter as they finish one (an atomic add by
    the producer warp, passed to the consumers through shared memory), instead of the fixed snake order; the call
    then takes a zeroed int32 counter. The heuristic claims at every mask: CLAIM_TILES_NOTE."""
    take_turns: bool = True
    """True: the consumer warpgroups take turns issuing their MMAs (a pair of named barriers), so one's softmax
    runs under the other's MMAs. FlashAttention-4 does so up to head dim 128 only; here every head dim does
    (the heuristic's measurement: TAKE_TURNS_NOTE)."""
    sum_chains: int = 4
    """Independent chains for each row's sum in the softmax (its max keeps 4): STEP_ORDER_NOTE."""
    turn_before_k: bool = False
    """True: a step takes its turn before it waits for its K tile, not after: STEP_ORDER_NOTE."""
    pass_turn_after_qk: bool = False
    """True: a step passes the turn once its Q K^T is issued, before its P V, not after: STEP_ORDER_NOTE."""
    k_descriptors: str = "64bit"
    """How a step's K descriptors are computed from the stage index: "64bit", "32bit" or "uniform"
    (wgmma.stage_steps says what each costs in SASS); the heuristic's choice is K_DESCRIPTORS_NOTE's."""
    rescale_threshold: float | None = None
    """None rescales U at every K/V tile; t >= 0: lazy rescaling as in FwdConfig, and the steps of unmasked tiles
    skip the row max (softmax.update_against_kept_max, after the wait for the previous tile's P V)."""
    exp_in_place: bool = False
    """With rescale_threshold: True has the steps of unmasked tiles take E into S's registers while the previous
    tile's P V still runs, P only after it (softmax.exp_against_kept_max / settle_kept_max: a warp whose rows fail
    the check moves their max from E, or from S computed again by FMAs); False takes E straight into P, after
    that P V (update_against_kept_max). EXP_IN_PLACE_NOTE."""
    trace_tiles: bool = False
    """True: every tile's SM, clock cycles and nanoseconds are recorded after the tile counter (a measuring aid:
    kernels/common/trace.py, scripts/tile_cycles.py; needs claim_tiles, whose tensor holds them)."""

    @property
    def empty_rows_keep_zero(self) -> bool:
        """Whether the kept-max steps let a row still at -inf keep m = 0 (softmax.update_against_kept_max): under a
        mask, with K/V tiles shorter than the Q tile, whose first (diagonal) tile shows no key to many rows
        (LAZY_RESCALE_NOTE)."""
        return (self.mask_right or self.mask_left) and self.block_m > self.block_n

    @property
    def num_mma_warpgroups(self) -> int:
        return self.block_m // 64

    @property
    def num_threads(self) -> int:
        """One producer warpgroup (TMA) and the consumer warpgroups (wgmma and softmax)."""
        return 128 * (1 + self.num_mma_warpgroups)

    @property
    def o_aliases_q(self) -> bool:
        """O is staged for its TMA store in Q's shared memory (not its own) when both would not fit."""
        return self._smem_bytes(separate_o=True) > SM90_MAX_SMEM_BYTES

    def smem_bytes(self) -> int:
        """Q, O unless it aliases Q, num_stages K and V tiles (2 bytes an element), and one KB for the mbarriers
        and alignment."""
        return self._smem_bytes(separate_o=not self.o_aliases_q)

    def grid_limit(self, seqlen_k: int, num_sms: int) -> int:
        """The most thread blocks a launch may have: ``num_sms`` (persistent, each block walks several tiles),
        except under a causal mask with long K/V walks without claim_tiles, where every tile gets its own thread
        block and the hardware hands them out as blocks finish (its dynamic balancing beats the static snake order
        there; claimed tiles balance the persistent grid the same way).

        Measured on one H200 (c12ef6c, bf16, B = 16384 / L, H = 2048 / D, TFLOP/s persistent -> one block per
        tile, at L = 1k / 4k / 16k): D=64 192x128 264 -> 237 / 428 -> 424 / 467 -> 506; D=128 417 -> 378 /
        622 -> 614 / 564 -> 671; D=256 128x64 436 -> 426 / 558 -> 633 / 559 -> 684; fp16 alike. Without a mask
        persistent wins at every point (D=128 583 -> 553 / 656 -> 613 / 655 -> 649). The switch is where the
        longest walk passes 32 K/V tiles (D=128: between 4k and 16k; D=256, 64-row K/V tiles: at 4k).
        """
        long_walk = -(-seqlen_k // self.block_n) > 32
        return 1 << 30 if self.mask_right and long_walk and not self.claim_tiles else num_sms

    def _smem_bytes(self, separate_o: bool) -> int:
        rows = self.block_m * (2 if separate_o else 1) + 2 * self.num_stages * self.block_n
        return 2 * self.head_dim_padded * rows + 1024


# (block_m, block_n, num_stages) per head-dim bucket for the Hopper kernel, without a mask | with one. Measured on
# one H200 (bf16, B = 16384 / L, H = 2048 / D, TFLOP/s at L = 1k / 4k / 16k, non-causal | causal) with the sweep
# that is now `scripts/tune.py --kernel sm90`. First the one-tile-per-block kernel, at commit 129ce55:
#   D=64:  (128,128,2) 298/383/416 | 208/351/414   (192,128,2) 308/441/485 | 161/352/458
#          (192,96,2)  307/405/454 | 187/353/422   (128,176,2) 250/353/410 | 134/282/369
#   D=128: (128,128,2) 432/567/583 | 321/515/570   (128,176,2) 342/460/525 | 211/392/487
#          (128,144,2) 378/527/577 | 242/457/546   (128,112,2) 406/525/574 | 275/470/550
#   D=256: (128,80,2)  541/634/656 | 393/589/604   (128,64,2)  528/616/639 | 417/585/613
#          (128,112,1) 371/468/524 | 300/450/503   (128,128,1) 347/387/404 | 286/380/417
# then the persistent kernel, at commit 1805970 ("e": rescale_o_early):
#   D=64:  (192,128,2) 328/466/522 | 170/342/443   (128,128,2) 318/408/437 | 227/376/428
#   D=128: (128,128,2) 499/609/652 | 347/540/562   (128,128,2)e 507/624/608 | 349/531/567
#   D=256: (128,80,2)e 597/687/609 | 409/543/592   (128,80,2)  600/677/653 | 408/553/605
#          (128,64,2)e 615/683/685 | 439/579/605
# then with the mask written through selects (c12ef6c; persistent / one block per tile as grid_limit picks),
# bf16 | fp16, 1k/4k/16k:
#   D=64 causal: (192,128,2) 264/428/506 | 263/413/501   (128,128,2) 285/403/437 | 281/377/409
#     (the 192-row tile spilled under a mask before; at 1k 128x128 is ahead, but one tile for every length is kept)
#   D=256:   (128,64,2)e 627/731/720 | 584/643/624   (128,80,2)e 618/676/684 | 609/668/658
#     causal (128,64,2)e 436/633/684 | 419/568/630   (128,80,2)e 426/603/673 | 427/617/694
#     (bf16 ran best on 64-row K/V tiles then, fp16 on 80-row ones)
# The 80-row tiles' P had been converted to 16 bits one value at a time (layout.store_converted says why: 54 extra
# instructions in a D=256 step, 63 at D=192). Converted in pairs, scripts/tune.py --rounds 3 on one H200 (working
# tree after eaf89c6, bf16 | fp16, 4k/16k, "t": taking turns, "nt": not):
#   D=256:  (128,80)e nt 669/691 | 640/645   (128,80)e t 661/684 | 624/636   (128,64)e t 658/662 | 607/619
#     causal (128,80)e nt 611/679 | 580/645   (128,80)e t 599/672 | 566/651   (128,64)e t 598/655 | 565/608
#   (flash-attn-4 in the same runs: 665/721 | 662/704, causal 616/697 | 595/678)
#   D=192 bf16: (128,96)e t 674/713, causal 595/679   (128,96)e nt 664/694, causal 591/682   (128,112)e t 671/707,
#     causal 595/685   (128,64)e t 638/658, causal 564/622 -> 80-row tiles at D=256 (TAKE_TURNS_NOTE for the turns)
# TAKE_TURNS_NOTE: the consumer warpgroups take turns at every head dim (FlashAttention-4 stops above 128; until stop
# 26 not at 256 without a mask; at D=192 the turns won 3 of 4 points above). At D=256 the sweep above favoured no
# turns at 7 of 8 points (fp16 causal 16k: 645 against 651), but under a causal mask at 1k bf16 without turns fell far
# behind in the three-round benchmark of the same tree (261 TFLOP/s against flash-attn-4's 398; fp16 428 against 442),
# as it had on 64-row tiles in the A/B of 619e4b7 (bench/results/2026-11-30-h200-619e4b7-ab-branches: 0.776): with a
# mask the turns stay (80-row tiles with turns, causal: 599/672 | 566/651 above, no 1k fall seen with turns). Once the
# unmasked steps skipped the row max (LAZY_RESCALE_NOTE) the turns won again at D=256 without a mask: scripts/tune.py
# --kernel sm90 --headdim 256 --seqlen 1024,4096,16384 --rounds 3 on 0ce18a9 (bench/results/2026-12-01-h200-s26,
# lease2), TFLOP/s over flash-attn-4's timed in turn at 1k/4k/16k, bf16 | fp16: no turns 1.006/1.011/1.006 |
# 1.019/0.999/1.043, turns 1.016/1.025/1.023 | 1.003/0.998/1.064 (64-row tiles 0.975-1.043); so every head dim and
# mask takes turns.
# CLAIM_TILES_NOTE: the persistent thread blocks claim their tiles under every mask. Under a causal mask tiles
# differ in length, and claiming balanced them best from the start (08b2513). Without a mask the tiles are equal,
# yet claiming still beat the fixed snake in scripts/tune.py --rounds 3 on one H200 (session of stop 14, working
# tree on bdabbaf, non-causal, TFLOP/s fixed -> claimed at 4k/16k, bf16 | fp16): D=128 622 -> 639 / 645 -> 651 |
# 606 -> 621 / 605 -> 622, and in a second lease 628 -> 627 / 646 -> 655 | 601 -> 603 / 611 -> 623 (1k: 541 -> 548 |
# 510 -> 531); D=64 489 -> 494 / 533 -> 527 | 476 -> 481 / 508 -> 512; D=256 671 -> 684 / 720 -> 716 | 632 -> 644 /
# 673 -> 663. Blocks that run at different speeds (their SMs' distance to the L2 slices, clocks) finish their fixed
# shares at different times; claimed tiles end the walk together. L2-sized head sections cost the non-causal walk
# (D=128 bf16 claimed, 4k/16k: 639 -> 602 / 651 -> 637, a tree with sections in the same lease): it keeps one head.
# STEP_ORDER_NOTE: the order of a step's work (sum_chains, turn_before_k, pass_turn_after_qk). ptxas schedules the
# softmax around the MMA waits differently for each order, and the consumer warpgroups' step is a chain (S lands ->
# softmax -> next turn -> next Q K^T) that the tensor cores wait on, so the order moves the step by a few per cent.
# Measured as each tile's SM cycles (clock stamps at the start and end of every tile, median over the 2048 tiles of
# a launch; bench/results/2026-11-30-h200-s17, "sweep"), all 16 combinations with rescale_o_early, B = 1, L = 16k,
# against (4, False, False), bf16 / fp16, non-causal | causal:
#   D=64   (1, True, False) 0.973 / 0.983 | 1.013 / 1.001   (1, True, True) 0.970 / 0.989 | 1.033 / 0.997
#   D=128  (1, True, True)  0.983 / 0.983 | 0.972 / 0.979   (1, False, False) 0.992 / 1.025 | 1.004 / 0.989
#   D=256 (rescale_o_early) no order below 0.992 at any point -> the default
# flash-attn-4 sums a row in one chain and takes its turn after waiting for K; both only paid together with the
# rest here. Other head dims keep the default (not measured).
# K_DESCRIPTORS_NOTE: how a step computes K's wgmma descriptors for its stage (Sm90FwdConfig.k_descriptors). "uniform"
# against the 64-bit (bf16) / 32-bit (fp16) forms, in one process on one H200 (scripts/ab_inprocess.py run, session of
# stop 19, bench/results/2026-11-30-h200-s19), new/old at 1k/4k/16k, non-causal | causal, three runs (3, 8, 6 rounds):
#   D=256 fp16 1.019/0.990/1.016 | 1.011/1.011/1.009,  1.017/1.022/1.035 | 1.015/1.029/1.034,
#              1.025/1.013/1.052 | 1.014/0.999/1.014
#   D=256 bf16 0.998/1.021/1.011 | 1.007/1.019/1.001,  0.999/1.006/1.016 | (a slow spell)/1.008/0.998,
#              1.007/1.004/0.992 | 1.000/0.993/0.990
#   D=192 fp16 0.999/0.987/1.000 | 1.001/1.003/1.007   bf16 0.988/0.977/0.977 | 0.988/0.990/0.984
#   D=128 fp16 0.982/0.992/0.978 | 0.972/0.995/0.981,  0.974/0.977/1.003 | 1.001/1.012/0.991
#   D=128 bf16 0.992/1.005/1.000 | 0.997/0.996/0.985,  0.996/0.994/1.003 | 0.990/0.995/0.992
# so fp16 takes "uniform" at D=256 (its step: 462 -> 435 SASS instructions) and "32bit" below it (stop 14: D=128
# 468 -> 460), bf16 "64bit" everywhere (D=256: 425 against 426, and even on the GPU) but at D=256 with lazy
# rescaling (LAZY_RESCALE_NOTE: without a mask; under one with EXP_IN_PLACE_NOTE, as timed there), where the 64-bit
# form's descriptors leave the uniform registers
# (free step 641 -> 585 SASS instructions with "uniform": R2UR 44 -> 16, the IMAD/IADD3 that rebuilt them gone); in
# one process against 64-bit (bench/results/2026-12-01-h200-s25, lease5) 1.000/0.980/1.022 at 1k/4k/16k (fp16, the
# same kernels on both sides: 0.997/1.004/1.006), so the smaller step is kept.
_SM90_STEP_ORDER: dict[tuple[int, bool], tuple[int, bool, bool]] = {
    (64, False): (1, True, False),
    (128, False): (1, True, True),
    (128, True): (1, True, True),
}

_SM90_TILES: dict[int, tuple[tuple[int, int, int], tuple[int, int, int]]] = {
    32: ((128, 128, 2), (128, 128, 2)),
    64: ((192, 128, 2), (192, 128, 2)),
    96: ((128, 128, 2), (128, 128, 2)),
    128: ((128, 128, 2), (128, 128, 2)),
    192: ((128, 96, 2), (128, 96, 2)),
    256: ((128, 80, 2), (128, 80, 2)),
}


def _k_descriptors(bucket: int, dtype: str, lazy: bool) -> str:
    """Sm90FwdConfig.k_descriptors for a head-dim bucket and dtype, and whether the kernel rescales lazily:
    K_DESCRIPTORS_NOTE."""
    if bucket == 256 and (dtype == "float16" or lazy):
        return "uniform"
    return "32bit" if dtype == "float16" else "64bit"


@functools.cache
def sm90_fwd_config(
    head_dim: int,
    dtype: str,
    causal: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    tiles: tuple[int, int, int] | None = None,
    rescale_o_early: bool | None = None,
    claim_tiles: bool | None = None,
    take_turns: bool | None = None,
    step_order: tuple[int, bool, bool] | None = None,
    k_descriptors: str | None = None,
    rescale_threshold: float | str | None = "auto",
    exp_in_place: bool | None = None,
) -> Sm90FwdConfig:
    """The heuristic for the Hopper forward kernel; ``tiles`` overrides (block_m, block_n, num_stages),
    ``rescale_o_early`` the choice made above head dim 128 (FlashAttention-4's rule), ``take_turns`` the turns
    the consumer warpgroups take (TAKE_TURNS_NOTE), ``claim_tiles`` the
    claimed tiles (CLAIM_TILES_NOTE), and ``step_order`` (sum_chains, turn_before_k, pass_turn_after_qk)
    the order of a step's work (STEP_ORDER_NOTE), ``k_descriptors`` how K's descriptors are computed
    (K_DESCRIPTORS_NOTE), ``rescale_threshold`` the lazy rescaling of LAZY_RESCALE_NOTE ("auto": its choice),
    ``exp_in_place`` the kept-max steps' form (EXP_IN_PLACE_NOTE)."""
    bucket = head_dim_bucket(head_dim)
    masked = causal or window_left >= 0 or window_right >= 0
    block_m, block_n, num_stages = tiles if tiles is not None else _SM90_TILES[bucket][masked]
    sum_chains, turn_before_k, pass_turn_after_qk = (
        step_order if step_order is not None else _SM90_STEP_ORDER.get((bucket, masked), (4, False, False))
    )
    if exp_in_place is None:
        exp_in_place = (bucket, masked) in _SM90_EXP_IN_PLACE and rescale_threshold is not None
    if rescale_threshold == "auto":
        rescale_threshold = _sm90_rescale_threshold(bucket, masked, exp_in_place)
    return Sm90FwdConfig(
        dtype=dtype,
        head_dim_padded=bucket,
        exact_head_dim=head_dim == bucket,
        block_m=block_m,
        block_n=block_n,
        num_stages=num_stages,
        mask_right=causal or window_right >= 0,
        mask_left=window_left >= 0,
        rescale_o_early=bucket > 128 if rescale_o_early is None else rescale_o_early,
        claim_tiles=True if claim_tiles is None else claim_tiles,
        take_turns=True if take_turns is None else take_turns,
        sum_chains=sum_chains,
        turn_before_k=turn_before_k,
        pass_turn_after_qk=pass_turn_after_qk,
        k_descriptors=k_descriptors or _k_descriptors(bucket, dtype, rescale_threshold is not None),
        rescale_threshold=rescale_threshold,
        exp_in_place=exp_in_place,
    )


@dataclass(frozen=True)
class BwdConfig:
    """Static configuration of the sm80 backward kernel (one compiled kernel per distinct value).

    block_m rows of Q per step, block_n rows of K/V per thread block, num_warps warps. The three GEMM shapes of
    a step tile their warps differently: S and dP are (block_m, block_n) with warps_m_sdp warps along M; dK and
    dV are (block_n, head_dim) with warps_n_dkv along N; dQ is (block_m, head_dim) with warps_m_dq along M.
    num_stages shared-memory buffers hold Q, dO, LSE and D: 2 loads the next Q tile's while this one computes,
    1 loads it once every warp is done with the current one.
    """

    dtype: str
    head_dim_padded: int
    exact_head_dim: bool
    block_m: int
    block_n: int
    num_warps: int
    warps_m_sdp: int
    warps_n_dkv: int
    warps_m_dq: int
    num_stages: int
    mask_right: bool
    mask_left: bool
    accumulate_dq: bool = True
    """True: this kernel also adds dQ with fp32 atomics. False (deterministic mode): dQ comes from the DQConfig
    kernel, which walks the K/V tiles of one Q tile in a fixed order."""

    def smem_bytes(self) -> int:
        """num_stages Q and dO tiles, K and V tiles, P and dS tiles (2 bytes an element), num_stages LSE and D
        rows (4 bytes an element, each array padded to 1 KB like the tiles)."""
        d = self.head_dim_padded
        tiles = 2 * (2 * self.num_stages * self.block_m * d + 2 * self.block_n * d + 2 * self.block_m * self.block_n)
        row_stats = 2 * -(-4 * self.num_stages * self.block_m // 1024) * 1024
        return tiles + row_stats


# (block_m, block_n, num_warps, warps_m_sdp, warps_n_dkv, warps_m_dq, num_stages) per head-dim bucket:
# FlashAttention-2's sm80 shapes (64 x 128 tiles, 8 warps; 64 x 64 past head dim 128 for the register and
# shared-memory budget). Head dims 32 and 96 put 4 of the dQ GEMM's warps along M, so that the 2 along the head
# dim tile it by 32. Two Q/dO stages everywhere but head dim 256, where they would need 209 KB, over sm_80's 163.
# Not yet tuned on the H200.
_SM80_BWD_TILES: dict[int, tuple[int, int, int, int, int, int, int]] = {
    32: (64, 128, 8, 2, 4, 4, 2),
    64: (64, 128, 8, 2, 4, 2, 2),
    96: (64, 128, 8, 2, 4, 4, 2),
    128: (64, 128, 8, 2, 4, 2, 2),
    192: (64, 64, 8, 2, 4, 2, 2),
    256: (64, 64, 8, 2, 4, 2, 1),
}


@functools.cache
def bwd_config(
    head_dim: int, dtype: str, window_left: int = -1, window_right: int = -1, deterministic: bool = False
) -> BwdConfig:
    """The heuristic for the sm80 backward kernel (window_right = 0 is causal)."""
    bucket = head_dim_bucket(head_dim)
    block_m, block_n, num_warps, warps_m_sdp, warps_n_dkv, warps_m_dq, num_stages = _SM80_BWD_TILES[bucket]
    return BwdConfig(
        dtype=dtype,
        head_dim_padded=bucket,
        exact_head_dim=head_dim == bucket,
        block_m=block_m,
        block_n=block_n,
        num_warps=num_warps,
        warps_m_sdp=warps_m_sdp,
        warps_n_dkv=warps_n_dkv,
        warps_m_dq=warps_m_dq,
        num_stages=num_stages,
        mask_right=window_right >= 0,
        mask_left=window_left >= 0,
        accumulate_dq=not deterministic,
    )


@dataclass(frozen=True)
class Sm90BwdConfig:
    """Static configuration of the Hopper backward kernel (kernels/sm90/bwd.py), the default backward on sm_90.

    block_n rows of K/V per thread block, 64 per consumer warpgroup; block_m rows of Q per step, num_stages
    shared-memory buffers of Q, dO, LSE and D (filled by TMA) and of dS. The dQ GEMM of a step is split between
    the two consumer warpgroups along its rows when block_m is 128, along the head dim when block_m is 64.
    """

    dtype: str
    head_dim_padded: int
    exact_head_dim: bool
    block_m: int
    block_n: int
    num_stages: int
    mask_right: bool
    mask_left: bool

    @property
    def num_mma_warpgroups(self) -> int:
        return self.block_n // 64

    @property
    def num_threads(self) -> int:
        """One producer warpgroup (TMA) and the consumer warpgroups (wgmma)."""
        return 128 * (1 + self.num_mma_warpgroups)

    @property
    def dq_split_rows(self) -> bool:
        """The consumer warpgroups split dQ's rows (True) or its head dim (False)."""
        return self.block_m == 64 * self.num_mma_warpgroups

    def smem_bytes(self) -> int:
        """K and V tiles, num_stages Q, dO and dS tiles (2 bytes an element), num_stages LSE and D rows and a dQ
        tile (4 bytes an element), and one KB for the mbarriers and alignment."""
        d, stages = self.head_dim_padded, self.num_stages
        tiles = 2 * (2 * self.block_n * d + stages * (2 * self.block_m * d + self.block_n * self.block_m))
        return tiles + 4 * (2 * stages * self.block_m + self.block_m * d) + 1024


# (block_m, block_n, num_stages) per head-dim bucket for the Hopper backward: FlashAttention-3's H100 shapes for
# head dims 64 and 128 (64 x 128 tiles for 128 keep dV, dK, S and dP of 64 key rows in a warpgroup's 240
# registers; at 64 the Q tile can be 128 rows). Other head dims take the sm80 backward.
_SM90_BWD_TILES: dict[int, tuple[int, int, int]] = {
    64: (128, 128, 2),
    128: (64, 128, 2),
}


def sm90_bwd_supports(head_dim: int) -> bool:
    """Whether the Hopper backward has a configuration for this head dim (else the sm80 backward runs)."""
    return head_dim_bucket(head_dim) in _SM90_BWD_TILES


@functools.cache
def sm90_bwd_config(
    head_dim: int,
    dtype: str,
    window_left: int = -1,
    window_right: int = -1,
    tiles: tuple[int, int, int] | None = None,
) -> Sm90BwdConfig:
    """The heuristic for the Hopper backward kernel (window_right = 0 is causal); ``tiles`` overrides
    (block_m, block_n, num_stages)."""
    bucket = head_dim_bucket(head_dim)
    block_m, block_n, num_stages = tiles if tiles is not None else _SM90_BWD_TILES[bucket]
    return Sm90BwdConfig(
        dtype=dtype,
        head_dim_padded=bucket,
        exact_head_dim=head_dim == bucket,
        block_m=block_m,
        block_n=block_n,
        num_stages=num_stages,
        mask_right=window_right >= 0,
        mask_left=window_left >= 0,
    )


@dataclass(frozen=True)
class DQConfig:
    """Static configuration of the deterministic dQ kernel: one thread block per (block_m, head_dim) tile of dQ,
    walking its K/V tiles in order, num_warps warps stacked along M (the forward's shape of work)."""

    dtype: str
    head_dim_padded: int
    exact_head_dim: bool
    block_m: int
    block_n: int
    num_warps: int
    mask_right: bool
    mask_left: bool

    def smem_bytes(self) -> int:
        """Q and dO tiles, K and V tiles, 2 bytes an element."""
        return 2 * self.head_dim_padded * 2 * (self.block_m + self.block_n)


# (block_m, block_n, num_warps): dQ, S and dP accumulate in registers, (block_m * (D + 2 block_n)) / threads
# fp32 values a thread. Not yet tuned on the H200.
_SM80_DQ_TILES: dict[int, tuple[int, int, int]] = {
    32: (64, 64, 4),
    64: (64, 64, 4),
    96: (64, 64, 4),
    128: (64, 64, 4),
    192: (64, 32, 4),
    256: (64, 32, 4),
}


@functools.cache
def dq_config(head_dim: int, dtype: str, window_left: int = -1, window_right: int = -1) -> DQConfig:
    """The heuristic for the deterministic dQ kernel."""
    bucket = head_dim_bucket(head_dim)
    block_m, block_n, num_warps = _SM80_DQ_TILES[bucket]
    return DQConfig(
        dtype=dtype,
        head_dim_padded=bucket,
        exact_head_dim=head_dim == bucket,
        block_m=block_m,
        block_n=block_n,
        num_warps=num_warps,
        mask_right=window_right >= 0,
        mask_left=window_left >= 0,
    )


@dataclass(frozen=True)
class BwdPreConfig:
    """Static configuration of the backward's preprocess (kernels/sm80/bwd_pre.py): D = rowsum(dO * O) for
    block_m rows of one (batch, head) per thread block of num_warps warps, and, with clear_dq_accum, the same rows
    of the fp32 dQ accumulator zeroed for the dK/dV kernel's atomics."""

    dtype: str
    head_dim_padded: int
    exact_head_dim: bool
    block_m: int
    num_warps: int
    clear_dq_accum: bool


@dataclass(frozen=True)
class BwdPostConfig:
    """Static configuration of the backward's postprocess (kernels/sm80/bwd_post.py): dQ = dQaccum * softmax_scale
    cast to dtype, block_m rows of one (batch, head) per thread block of num_warps warps."""

    dtype: str
    head_dim_padded: int
    exact_head_dim: bool
    block_m: int
    num_warps: int


# Rows per thread block of the preprocess and the postprocess, 4 warps: block_m * head_dim_padded = 8192 elements
# (6144 at 96 and 192, where 8192 is no whole number of the tiled copy's passes), so every thread keeps 8 (6)
# 16-byte loads of each 16-bit input in flight. Memory-bound streams; not yet measured on the H200.
_SM80_BWD_PREPOST_ROWS: dict[int, int] = {32: 256, 64: 128, 96: 64, 128: 64, 192: 32, 256: 32}


@functools.cache
def bwd_pre_config(head_dim: int, dtype: str, clear_dq_accum: bool = True) -> BwdPreConfig:
    """The heuristic for the backward's preprocess (clear_dq_accum off for the deterministic backward, whose dQ
    kernel needs no accumulator)."""
    bucket = head_dim_bucket(head_dim)
    return BwdPreConfig(
        dtype=dtype,
        head_dim_padded=bucket,
        exact_head_dim=head_dim == bucket,
        block_m=_SM80_BWD_PREPOST_ROWS[bucket],
        num_warps=4,
        clear_dq_accum=clear_dq_accum,
    )


@functools.cache
def bwd_post_config(head_dim: int, dtype: str) -> BwdPostConfig:
    """The heuristic for the backward's postprocess."""
    bucket = head_dim_bucket(head_dim)
    return BwdPostConfig(
        dtype=dtype,
        head_dim_padded=bucket,
        exact_head_dim=head_dim == bucket,
        block_m=_SM80_BWD_PREPOST_ROWS[bucket],
        num_warps=4,
    )
