"""What every sm80-path kernel needs of its config: the checks its ``can_implement`` shares with the others."""

from flashcute.config import DTYPES, HEAD_DIM_BUCKETS

# Opt-in shared memory per thread block by target; sm_86 and sm_89 parts have the least.
MAX_SMEM_BYTES = {"sm_80": 163 * 1024, "sm_87": 163 * 1024, "sm_90a": 227 * 1024}
DEFAULT_MAX_SMEM_BYTES = 99 * 1024


def common_limits(config, num_threads: int, smem_bytes: int, arch: str) -> str | None:
    """None if dtype, head-dim bucket, tiles and shared memory suit the shared copy and MMA machinery, else why.

    The gmem <-> smem tiled copy moves 16-byte vectors, a (8, 64) or (8, 32) swizzle atom's row per
    64 / 8 or 32 / 8 threads, so block_m and block_n must be whole passes of it.
    """
    if config.dtype not in DTYPES:
        return f"dtype {config.dtype!r} is not one of {DTYPES}"
    if config.head_dim_padded not in HEAD_DIM_BUCKETS:
        return f"head_dim_padded={config.head_dim_padded} is not one of {HEAD_DIM_BUCKETS}"
    if config.block_n % 16 != 0:
        return f"block_n={config.block_n} is not a multiple of 16"
    rows_per_copy = num_threads // (64 // 8 if config.head_dim_padded % 64 == 0 else 32 // 8)
    if config.block_m % rows_per_copy != 0 or config.block_n % rows_per_copy != 0:
        return f"block_m and block_n must be multiples of {rows_per_copy} rows (one pass of the tiled copy)"
    smem_limit = MAX_SMEM_BYTES.get(arch, DEFAULT_MAX_SMEM_BYTES)
    if smem_bytes > smem_limit:
        return f"needs {smem_bytes} bytes of shared memory, over {arch}'s {smem_limit}"
    return None
