"""What every kernel family shares about its inputs and targets: dtypes, head-dim buckets, shared memory.

Pure Python (no CuTe DSL import), so configs and heuristics can use it on any machine.
"""

from __future__ import annotations

# Head dims are padded up to one of these buckets; a head dim below its bucket is handled with predicates.
HEAD_DIM_BUCKETS = (32, 64, 96, 128, 192, 256)
DTYPES = ("float16", "bfloat16")
# (q's head dim, v's) where they differ that the compile tests and `warmup --all` build: DeepSeek-style attention's
# and a smaller pair.
VALUE_HEAD_DIMS = ((192, 128), (128, 64))

# Opt-in shared memory per thread block by target; sm_86 and sm_89 parts have the least.
MAX_SMEM_BYTES = {"sm_80": 163 * 1024, "sm_87": 163 * 1024, "sm_90a": 227 * 1024}
DEFAULT_MAX_SMEM_BYTES = 99 * 1024


def smem_limit(arch: str) -> int:
    """Shared memory one thread block may opt into on target ``arch``."""
    return MAX_SMEM_BYTES.get(arch, DEFAULT_MAX_SMEM_BYTES)


def head_dim_bucket(head_dim: int) -> int:
    """The smallest bucket that holds ``head_dim`` (a multiple of 8 up to 256)."""
    for bucket in HEAD_DIM_BUCKETS:
        if head_dim <= bucket:
            return bucket
    raise ValueError(f"head_dim={head_dim} is over the largest supported head dim, {HEAD_DIM_BUCKETS[-1]}")


def dtype_limits(config) -> str | None:
    """None if ``config.dtype`` and ``config.head_dim_padded`` (and v's, value_head_dim) are ones the kernels are
    built for, else why not."""
    if config.dtype not in DTYPES:
        return f"dtype {config.dtype!r} is not one of {DTYPES}"
    if config.head_dim_padded not in HEAD_DIM_BUCKETS:
        return f"head_dim_padded={config.head_dim_padded} is not one of {HEAD_DIM_BUCKETS}"
    value = value_head_dim(config)
    if value not in HEAD_DIM_BUCKETS or value > config.head_dim_padded:
        return f"head_dim_v_padded={value} is not one of {HEAD_DIM_BUCKETS} up to head_dim_padded"
    return None


def value_head_dim(config) -> int:
    """The padded head dim of v and out that ``config`` is built for: its ``head_dim_v_padded``, None (or no such
    field) where it is q's and k's."""
    value = getattr(config, "head_dim_v_padded", None)
    return config.head_dim_padded if value is None else value


def value_fields(head_dim: int, head_dim_v: int | None) -> dict:
    """A config's v head-dim fields (head_dim_v_padded, exact_head_dim_v): none where v's head dim is q's (or not
    given)."""
    if head_dim_v is None or head_dim_v == head_dim:
        return {}
    bucket_v = head_dim_bucket(head_dim_v)
    return {"head_dim_v_padded": bucket_v, "exact_head_dim_v": head_dim_v == bucket_v}


def exact_value_head_dim(config) -> bool:
    """Whether v's head dim equals value_head_dim(config), so that its loads and O's stores need no predicates."""
    return config.exact_head_dim if getattr(config, "head_dim_v_padded", None) is None else config.exact_head_dim_v


def masks(window_left: int, window_right: int) -> tuple[bool, bool]:
    """(mask_right, mask_left) of a kernel for a window: keys right of the diagonal are masked (causal, or a window
    with window_right >= 0), keys further left than window_left are masked (sliding window)."""
    return window_right >= 0, window_left >= 0


MASK_NAMES = {(False, False): "nomask", (True, False): "right", (False, True): "left", (True, True): "both"}


def head_dim_label(config) -> str:
    """A config's head dim in a variant label: "d128", or "d128pad" for a head dim padded up to 128; "d192v128"
    where v's head dim is another (its own "pad" likewise)."""
    label = f"d{config.head_dim_padded}{'' if config.exact_head_dim else 'pad'}"
    if getattr(config, "head_dim_v_padded", None) is not None:
        label += f"v{config.head_dim_v_padded}{'' if config.exact_head_dim_v else 'pad'}"
    return label


def mask_label(config) -> str:
    """A config's mask in a variant label: nomask, right (causal-like), left, both (sliding window)."""
    return MASK_NAMES[config.mask_right, config.mask_left]


def attention_label(config, prefix: str, tiles: str) -> str:
    """The label of an attention kernel's config: "<prefix>-<dtype>-<head dim>-<tiles>-<mask>" (no prefix: no dash),
    "-softcap" appended for a kernel that caps the scores, "-sink" for one with learnable sinks, "-alibi" for one with
    ALiBi biases, "-packed" for one of packed variable-length batches, "-paged<rows>" for one that reads K and V from
    pages of a cache."""
    softcap = "-softcap" if config.softcap else ""
    sink = "-sink" if getattr(config, "sink", False) else ""  # a forward's field only
    alibi = "-alibi" if config.alibi else ""
    packed = "-packed" if config.packed else ""
    paged = f"-paged{config.page_rows}" if getattr(config, "page_rows", 0) else ""  # a Hopper forward's field only
    head = f"{prefix + '-' if prefix else ''}{config.dtype}-{head_dim_label(config)}"
    return f"{head}-{tiles}-{mask_label(config)}{softcap}{sink}{alibi}{packed}{paged}"


def rows_per_copy(head_dim_padded: int, num_threads: int) -> int:
    """Rows of a (rows, head_dim) tile that one pass of the 16-bit gmem tiled copy (kernels/common/copy.py)
    covers: it moves 16-byte vectors, a (8, 64) or (8, 32) swizzle atom's row per 64 / 8 or 32 / 8 threads."""
    return num_threads // (64 // 8 if head_dim_padded % 64 == 0 else 32 // 8)


def streaming_limits(config, num_threads: int) -> str | None:
    """None if dtype, head-dim bucket and block_m suit a kernel that streams (block_m, head_dim) tiles through
    registers with the gmem tiled copy (the backward's preprocess and postprocess), else why. block_m must be whole
    passes of the 16-bit copy; the fp32 copies beside it cover as many or half as many rows a pass."""
    reason = dtype_limits(config)
    if reason is not None:
        return reason
    if num_threads % 32 != 0 or num_threads > 1024:
        return f"{num_threads} threads is not a whole number of warps up to 1024"
    rows = rows_per_copy(config.head_dim_padded, num_threads)
    if config.block_m % rows != 0:
        return f"block_m={config.block_m} is not a multiple of {rows} rows (one pass of the tiled copy)"
    return None


def in_sample(kind: str, config) -> bool:
    """Whether the compile tests, ``flashcute check`` and ``warmup --all`` build this variant of registry.variants'
    group ``kind``: all of a plain group; of the packed variable-length, softcap, sink, ALiBi, v head dim ("value")
    and paged-cache groups every bucket and mask, the dtypes taken in turn. Packing changes only where a tile's rows
    are (kernels/common/seqlen.py), softcap and ALiBi one step each on the scores (kernels/common/softcap.py,
    alibi.py), a sink the epilogue's statistics (softmax.finalize), v's head dim the V and O tiles' width and pages
    the producer's loads, not the tiling, so a sample covers each without doubling the variant matrix."""
    return not kind.endswith(("-packed", "-softcap", "-sink", "-alibi", "-value", "-paged")) or dtype_in_turn(config)


def dtype_in_turn(config) -> bool:
    """Whether ``config`` has the dtype that a sample of every bucket and mask takes for its (bucket, mask) pair: the
    dtypes in turn, so that each bucket and each mask is built in both."""
    pair = HEAD_DIM_BUCKETS.index(config.head_dim_padded) + list(MASK_NAMES).index(
        (config.mask_right, config.mask_left)
    )
    return DTYPES.index(config.dtype) == pair % len(DTYPES)
