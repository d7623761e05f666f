"""Configs of the sm80 family (mma.sync kernels) and the heuristics that pick them.

A config holds every compile-time choice of one kernel and nothing that changes per call; it is the compile-cache
key. Each heuristic choice carries its reason in one line; the measurements behind it are in docs/tuning-sm80.md,
under the section named beside it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from flashcute.kernels.common.limits import (
    attention_label,
    head_dim_bucket,
    masks,
    smem_limit,
    value_fields,
    value_head_dim,
)


@dataclass(frozen=True)
class FwdConfig:
    """The sm80 forward kernel (kernels/sm80/fwd.py).

    dtype:            "float16" or "bfloat16"
    head_dim_padded:  the head-dim bucket the kernel is built for
    exact_head_dim:   True when head_dim == head_dim_padded, so no head-dim predicates are needed
    block_m, block_n: rows of Q per thread block, rows of K/V per main-loop step
    num_warps:        warps per thread block, stacked along M (each owns block_m / num_warps rows)
    num_stages:       shared-memory buffers for K and for V: 1 as in the seed, 2 to load one tile further ahead
    mask_right:       keys right of the diagonal are masked (causal, or a window with window_right >= 0)
    mask_left:        keys further left than window_left are masked (sliding window)
    lazy_rescale:     a row keeps its running max until it grows by more than softmax.RESCALE_THRESHOLD, unmasked
                      steps skip the row max, and U is rescaled only in warps where a row's max moved
    packed:           the batch is packed variable-length sequences (kernels/common/seqlen.py)
    softcap:          the scores are capped, softcap * tanh(score / softcap) (kernels/common/softcap.py)
    sink:             every row's denominator takes its head's learnable sink (softmax.finalize)
    alibi:            the scores take the ALiBi bias -slope * |i + offset - j| (kernels/common/alibi.py)
    head_dim_v_padded: v's (and out's) head-dim bucket where it is not q's and k's (at most theirs); None: theirs
    exact_head_dim_v: v's head dim equals head_dim_v_padded (with head_dim_v_padded only)
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
    lazy_rescale: bool = False
    packed: bool = False
    softcap: bool = False
    sink: bool = False
    alibi: bool = False
    head_dim_v_padded: int | None = None
    exact_head_dim_v: bool = True

    @property
    def num_threads(self) -> int:
        return self.num_warps * 32

    @property
    def label(self) -> str:
        """ "bfloat16-d128-128x64w4s1-lazy8-right": dtype, head dim ("d128pad" padded), tile, warps, stages."""
        lazy = "-lazy8" if self.lazy_rescale else ""
        tiles = f"{self.block_m}x{self.block_n}w{self.num_warps}s{self.num_stages}{lazy}"
        return attention_label(self, "", tiles)

    def smem_bytes(self) -> int:
        """A Q tile and num_stages K and V tiles, 2 bytes an element (O leaves through Q's bytes)."""
        stages = self.num_stages * self.block_n
        return 2 * (self.head_dim_padded * (self.block_m + stages) + value_head_dim(self) * stages)


def _forward_tiles(bucket: int, masked: bool) -> tuple[tuple[int, int, int, int], ...]:
    """(block_m, block_n, num_warps, num_stages) choices for a bucket, best first (docs/tuning-sm80.md, Forward
    tiles): the heuristic takes the first that fits the target's shared memory."""
    if bucket == 32:
        return ((128, 128, 4, 1),)  # not swept: D=64's shape within the register budget
    if bucket == 64:
        return ((128, 128, 4, 2),)  # ahead at 8 of 8 points (+0.6 % to +5.2 %) although it spills
    if bucket == 96:
        return ((128, 64, 4, 1),)  # ahead at 6 of 8 points
    if bucket == 128:
        # without a mask one stage (the kept-max step needs fewer registers); under one two stages
        return ((128, 64, 4, 2),) if masked else ((128, 64, 4, 1),)
    if bucket == 192:
        return ((128, 64, 8, 1),)  # 8 warps: acc_O of 192 columns a row
    # 128x128 where shared memory holds it (sm_90: 192 KB), ahead at 8 of 8 points; else 64-row K/V tiles
    return ((128, 128, 8, 1), (128, 64, 8, 1))


@functools.cache
def fwd_config(
    head_dim: int,
    dtype: str,
    window_left: int = -1,
    window_right: int = -1,
    arch: str = "sm_80",
    packed: bool = False,
    softcap: bool = False,
    sink: bool = False,
    alibi: bool = False,
    head_dim_v: int | None = None,
) -> FwdConfig:
    """The heuristic for the sm80 forward kernel on target ``arch`` (window_right = 0 is causal; ``packed``: for
    packed variable-length batches, ``softcap``: for capped scores, ``sink``: with learnable sinks, ``alibi``: with
    ALiBi biases, each with the same tiles; ``head_dim_v``: v's head dim where it is not q's, at most q's bucket:
    q's tiles, which then hold smaller V tiles and O)."""
    bucket = head_dim_bucket(head_dim)
    mask_right, mask_left = masks(window_left, window_right)
    for block_m, block_n, num_warps, num_stages in _forward_tiles(bucket, mask_right or mask_left):
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
            # only D=128 gains from it, in both dtypes (docs/tuning-sm80.md, Lazy rescaling)
            lazy_rescale=bucket == 128,
            packed=packed,
            softcap=softcap,
            sink=sink,
            alibi=alibi,
            **value_fields(head_dim, head_dim_v),
        )
        if config.smem_bytes() <= smem_limit(arch):
            break
    return config


@dataclass(frozen=True)
class BwdConfig:
    """The sm80 backward's dK/dV kernel (kernels/sm80/bwd.py).

    block_m rows of Q per step, block_n rows of K/V per thread block, num_warps warps. The three GEMM shapes of
    a step tile their warps differently: S and dP are (block_m, block_n) with warps_m_sdp warps along M; dK and
    dV are (block_n, head_dim) with warps_n_dkv along N; dQ is (block_m, head_dim) with warps_m_dq along M.
    num_stages shared-memory buffers hold Q, dO, LSE and D: 2 loads the next Q tile's while this one computes,
    1 loads it once every warp is done with the current one.
    accumulate_dq: True, this kernel also adds dQ with fp32 atomics; False (deterministic mode), dQ comes from the
    DQConfig kernel, which walks the K/V tiles of one Q tile in a fixed order.
    packed: the batch is packed variable-length sequences (kernels/common/seqlen.py).
    softcap: the scores are capped, softcap * tanh(score / softcap) (kernels/common/softcap.py).
    alibi: the scores take the ALiBi bias (kernels/common/alibi.py).
    head_dim_v_padded, exact_head_dim_v: v's (and out's, dO's, dV's) head-dim bucket where it is not q's and k's,
    and whether v's head dim equals it, as in FwdConfig.
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
    packed: bool = False
    softcap: bool = False
    alibi: bool = False
    head_dim_v_padded: int | None = None
    exact_head_dim_v: bool = True

    @property
    def label(self) -> str:
        """ "bwd-bfloat16-d128-64x128w8-right" ("bwdnodq-" without the dQ atomics)."""
        prefix = "bwd" if self.accumulate_dq else "bwdnodq"
        tiles = f"{self.block_m}x{self.block_n}w{self.num_warps}"
        return attention_label(self, prefix, tiles)

    def smem_bytes(self) -> int:
        """num_stages Q and dO tiles, K and V tiles (dO and V at v's head dim), P and dS tiles (2 bytes an element),
        num_stages LSE and D rows (4 bytes an element, each array padded to 1 KB like the tiles)."""
        widths = self.head_dim_padded + value_head_dim(self)
        tiles = 2 * ((self.num_stages * self.block_m + self.block_n) * widths + 2 * self.block_m * self.block_n)
        row_stats = 2 * -(-4 * self.num_stages * self.block_m // 1024) * 1024
        return tiles + row_stats


def _backward_tiles(bucket: int) -> tuple[int, int, int, int, int, int, int]:
    """(block_m, block_n, num_warps, warps_m_sdp, warps_n_dkv, warps_m_dq, num_stages): FlashAttention-2's sm80
    shapes, not tuned on the H200 (docs/tuning-sm80.md, Backward tiles)."""
    if bucket == 256:
        return (64, 64, 8, 2, 4, 2, 1)  # two Q/dO stages would need 209 KB, over sm_80's 163
    if bucket == 192:
        return (64, 64, 8, 2, 4, 2, 2)  # 64 K/V rows for the register and shared-memory budget
    # head dims 32 and 96 put 4 of dQ's warps along M, so that the 2 along the head dim tile it by 32
    return (64, 128, 8, 2, 4, 4 if bucket in (32, 96) else 2, 2)


@functools.cache
def bwd_config(
    head_dim: int,
    dtype: str,
    window_left: int = -1,
    window_right: int = -1,
    deterministic: bool = False,
    packed: bool = False,
    softcap: bool = False,
    alibi: bool = False,
    head_dim_v: int | None = None,
) -> BwdConfig:
    """The heuristic for the sm80 dK/dV kernel (window_right = 0 is causal; ``packed``, ``softcap``, ``alibi`` and
    ``head_dim_v`` as in fwd_config: q's tiles, which then hold smaller V and dO tiles)."""
    bucket = head_dim_bucket(head_dim)
    block_m, block_n, num_warps, warps_m_sdp, warps_n_dkv, warps_m_dq, num_stages = _backward_tiles(bucket)
    mask_right, mask_left = masks(window_left, window_right)
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
        mask_right=mask_right,
        mask_left=mask_left,
        accumulate_dq=not deterministic,
        packed=packed,
        softcap=softcap,
        alibi=alibi,
        **value_fields(head_dim, head_dim_v),
    )


@dataclass(frozen=True)
class DQConfig:
    """The deterministic dQ kernel (kernels/sm80/bwd_dq.py): one thread block per (block_m, head_dim) tile of dQ,
    walking its K/V tiles in order, num_warps warps stacked along M (the forward's shape of work); packed,
    softcap, alibi and v's head dim (head_dim_v_padded, exact_head_dim_v) as in BwdConfig."""

    dtype: str
    head_dim_padded: int
    exact_head_dim: bool
    block_m: int
    block_n: int
    num_warps: int
    mask_right: bool
    mask_left: bool
    packed: bool = False
    softcap: bool = False
    alibi: bool = False
    head_dim_v_padded: int | None = None
    exact_head_dim_v: bool = True

    @property
    def label(self) -> str:
        """ "dq-bfloat16-d128-64x64w4-right"."""
        return attention_label(self, "dq", f"{self.block_m}x{self.block_n}w{self.num_warps}")

    def smem_bytes(self) -> int:
        """Q and dO tiles, K and V tiles (dO and V at v's head dim), 2 bytes an element."""
        return 2 * (self.head_dim_padded + value_head_dim(self)) * (self.block_m + self.block_n)


@functools.cache
def dq_config(
    head_dim: int,
    dtype: str,
    window_left: int = -1,
    window_right: int = -1,
    packed: bool = False,
    softcap: bool = False,
    alibi: bool = False,
    head_dim_v: int | None = None,
) -> DQConfig:
    """The heuristic for the deterministic dQ kernel (``head_dim_v`` as in bwd_config)."""
    bucket = head_dim_bucket(head_dim)
    mask_right, mask_left = masks(window_left, window_right)
    return DQConfig(
        dtype=dtype,
        head_dim_padded=bucket,
        exact_head_dim=head_dim == bucket,
        block_m=64,
        # dQ, S and dP accumulate in registers: (block_m * (D + 2 block_n)) / threads fp32 values a thread
        block_n=32 if bucket > 128 else 64,
        num_warps=4,
        mask_right=mask_right,
        mask_left=mask_left,
        packed=packed,
        softcap=softcap,
        alibi=alibi,
        **value_fields(head_dim, head_dim_v),
    )
