"""What every sm80-path kernel needs of its config: the checks its ``can_implement`` shares with the others."""

from flashcute.config import DEFAULT_MAX_SMEM_BYTES, DTYPES, HEAD_DIM_BUCKETS, MAX_SMEM_BYTES


def _rows_per_copy(head_dim_padded: int, num_threads: int) -> int:
    """Rows of a (rows, head_dim) tile that one pass of the 16-bit gmem tiled copy covers: it moves 16-byte
    vectors, a (8, 64) or (8, 32) swizzle atom's row per 64 / 8 or 32 / 8 threads."""
    return num_threads // (64 // 8 if head_dim_padded % 64 == 0 else 32 // 8)


def _dtype_limits(config) -> str | None:
    if config.dtype not in DTYPES:
        return f"dtype {config.dtype!r} is not one of {DTYPES}"
    if config.head_dim_padded not in HEAD_DIM_BUCKETS:
        return f"head_dim_padded={config.head_dim_padded} is not one of {HEAD_DIM_BUCKETS}"
    return None


def common_limits(config, num_threads: int, smem_bytes: int, arch: str) -> str | None:
    """None if dtype, head-dim bucket, tiles and shared memory suit the shared copy and MMA machinery, else why.

    block_m and block_n must be whole passes of the gmem tiled copy.
    """
    reason = _dtype_limits(config)
    if reason is not None:
        return reason
    if config.block_n % 16 != 0:
        return f"block_n={config.block_n} is not a multiple of 16"
    rows_per_copy = _rows_per_copy(config.head_dim_padded, num_threads)
    if config.block_m % rows_per_copy != 0 or config.block_n % rows_per_copy != 0:
        return f"block_m and block_n must be multiples of {rows_per_copy} rows (one pass of the tiled copy)"
    smem_limit = MAX_SMEM_BYTES.get(arch, DEFAULT_MAX_SMEM_BYTES)
    if smem_bytes > smem_limit:
        return f"needs {smem_bytes} bytes of shared memory, over {arch}'s {smem_limit}"
    return None


def streaming_limits(config, num_threads: int) -> str | None:
    """None if dtype, head-dim bucket and block_m suit a kernel that streams (block_m, head_dim) tiles through
    registers with the gmem tiled copy (the backward's preprocess and postprocess), else why. block_m must be whole
    passes of the 16-bit copy; the fp32 copies beside it cover as many or half as many rows a pass."""
    reason = _dtype_limits(config)
    if reason is not None:
        return reason
    if num_threads % 32 != 0 or num_threads > 1024:
        return f"{num_threads} threads is not a whole number of warps up to 1024"
    rows_per_copy = _rows_per_copy(config.head_dim_padded, num_threads)
    if config.block_m % rows_per_copy != 0:
        return f"block_m={config.block_m} is not a multiple of {rows_per_copy} rows (one pass of the tiled copy)"
    return None
