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
    num_warps:        warps per thread block, stacked along M (each warp owns block_m / num_warps rows)
    num_stages:       shared-memory buffers for K and for V: 1 as in the seed, 2 to load one tile further ahead
    mask_right:       keys right of the diagonal are masked (causal, or a window with window_right >= 0)
    mask_left:        keys further left than window_left are masked (sliding window)
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

    @property
    def num_threads(self) -> int:
        return self.num_warps * 32

    def smem_bytes(self) -> int:
        """Shared memory of one thread block: a Q tile + num_stages K and V tiles, 2 bytes an element."""
        return 2 * self.head_dim_padded * (self.block_m + 2 * self.num_stages * self.block_n)


# Tile choices per head-dim bucket: (block_m, block_n, num_warps, num_stages).
# Measured on one H200 (bf16, B = 16384 / L, H = 2048 / D, TFLOP/s at L = 4k / 16k, non-causal | causal) at commit
# 30111a9 with the sweep that is now scripts/tune_sm80.py:
#   D=64:  (128,64,4,1) 336/333 | 301/325   (128,64,4,2) 320/326 | 294/312   (128,128,4,1) 326/337 | 296/323
#          (128,128,8,1) 284/294 | 257/281  -> (128,64,4,1)
#   D=128: (128,64,4,1) 374/372 | 325/347   (128,64,4,2) 367/373 | 326/351   (128,32,4,1) 341/348 | 310/328
#          (128,64,8,1) 297/301 | 286/307   (64,64,4,1)  301/302 | 293/315   (128,128,8,1) 336/329 | 305/333
#          -> (128,64,4,1): 2 stages wins only at 16k and by 1%; one stage keeps 64 KB free for a third CTA's worth
#   D=256: (128,64,8,1) 340/342 | 294/351   (64,64,4,1)  323/318 | 297/313   (64,64,4,2) 296/300 | 279/294
#          (64,32,4,1)  300/302 | 275/302  -> (128,64,8,1)
# D=32, 96 and 192 were not swept yet; they take their neighbours' shapes within the register and shared-memory
# budgets (acc_O holds block_m * D / threads fp32 values a thread, acc_S block_m * block_n / threads).
_SM80_TILES: dict[int, tuple[int, int, int, int]] = {
    32: (128, 128, 4, 1),
    64: (128, 64, 4, 1),
    96: (128, 64, 4, 1),
    128: (128, 64, 4, 1),
    192: (128, 64, 8, 1),
    256: (128, 64, 8, 1),
}


@functools.cache
def fwd_config(
    head_dim: int,
    dtype: str,
    causal: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    tiles: tuple[int, int, int, int] | None = None,
) -> FwdConfig:
    """The heuristic: pick the sm80 forward configuration for a problem.

    causal=True is the same as window_right=0. ``tiles`` overrides the (block_m, block_n, num_warps, num_stages) choice;
    the tuning sweep uses it.
    """
    bucket = head_dim_bucket(head_dim)
    block_m, block_n, num_warps, num_stages = tiles if tiles is not None else _SM80_TILES[bucket]
    return FwdConfig(
        dtype=dtype,
        head_dim_padded=bucket,
        exact_head_dim=head_dim == bucket,
        block_m=block_m,
        block_n=block_n,
        num_warps=num_warps,
        num_stages=num_stages,
        mask_right=causal or window_right >= 0,
        mask_left=window_left >= 0,
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
