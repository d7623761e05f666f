"""What every sm80 kernel needs of its config: the checks its ``can_implement`` shares with the others."""

from flashcute.kernels.common.limits import dtype_limits, rows_per_copy, smem_limit, value_head_dim


def common_limits(config, num_threads: int, smem_bytes: int, arch: str) -> str | None:
    """None if dtype, head-dim bucket, tiles and shared memory suit the shared copy and MMA machinery, else why.

    block_m and block_n must be whole passes of the gmem tiled copy.
    """
    reason = dtype_limits(config)
    if reason is not None:
        return reason
    if config.block_n % 16 != 0:
        return f"block_n={config.block_n} is not a multiple of 16"
    rows = max(rows_per_copy(head_dim, num_threads) for head_dim in (config.head_dim_padded, value_head_dim(config)))
    if config.block_m % rows != 0 or config.block_n % rows != 0:
        return f"block_m and block_n must be multiples of {rows} rows (one pass of the tiled copy)"
    if smem_bytes > smem_limit(arch):
        return f"needs {smem_bytes} bytes of shared memory, over {arch}'s {smem_limit(arch)}"
    return None
