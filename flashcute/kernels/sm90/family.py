"""The Hopper family's launch contract (sm_90: TMA, wgmma, warp specialization).

What its kernels need of the tensors beyond the shared validation: layouts a TMA tensor map can describe
(tma_addressable), a tile counter for the persistent forward (one per stream, left zeroed by the kernel), and for
the backward LSE * log2(e) and D padded to whole Q tiles, which it bulk-copies a tile at a time, and in the
deterministic mode a zeroed counter per Q tile. The backward covers every head dim where v's is q's:
supports_backward says so, and the registry's next family takes the rest.
"""

from __future__ import annotations

import itertools
import math

import torch

from flashcute.kernels.common import prepost
from flashcute.kernels.common.limits import VALUE_HEAD_DIMS, head_dim_bucket
from flashcute.kernels.launch import DENSE, compiled, dtype_name, num_sms, run_on_device
from flashcute.kernels.sm90.build import compile
from flashcute.kernels.sm90.config import (
    SHORT_QUERY_ROWS,
    Sm90BwdConfig,
    Sm90FwdConfig,
    sm90_bwd_config,
    sm90_fwd_config,
)

NAME = "sm90"
ARCHS = ("sm_90a",)
# The backend its benchmarks and comparisons time beside it: flash-attn-4, the other CuTe DSL kernel for Hopper.
REFERENCE = "fa4"
# Forward tiles besides the heuristic's that the GPU tests run (head dim 96, bf16): the fields they replace.
ALTERNATIVE_TILES = ({"block_m": 64}, {"block_m": 192}, {"block_n": 176}, {"block_n": 80, "exp_in_place": True})


def runs_on(capability: tuple[int, int]) -> bool:
    return capability[0] == 9


def variants(arch: str, dtypes, buckets, masks, exact_only: bool) -> dict[str, list]:
    """The heuristics' configs by kernel kind, per dtype x head-dim bucket x (window_left, window_right) (x exact
    and padded head dim; packed batches, capped scores and the deterministic backward at the exact head dims only,
    each orthogonal to padding); the backward at the head dims it covers."""
    found = {"fwd": [], "bwd": [], "fwd-packed": [], "bwd-packed": [], "fwd-softcap": [], "bwd-softcap": []}
    found |= {"fwd-sink": [], "fwd-alibi": [], "bwd-alibi": [], "fwd-value": [], "bwd-deterministic": []}
    found["fwd-paged"] = []
    if arch not in ARCHS:
        return found
    for dtype, bucket, window in itertools.product(dtypes, buckets, masks):
        for head_dim in (bucket,) if exact_only else (bucket, bucket - 8):
            found["fwd"].append(sm90_fwd_config(head_dim, dtype, *window))
            found["bwd"].append(sm90_bwd_config(head_dim, dtype, *window))
    for dtype, bucket, window in itertools.product(dtypes, buckets, masks):
        found["bwd-deterministic"].append(sm90_bwd_config(bucket, dtype, *window, deterministic=True))
    for variant in ("packed", "softcap", "alibi"):
        for dtype, bucket, window in itertools.product(dtypes, buckets, masks):
            found[f"fwd-{variant}"].append(sm90_fwd_config(bucket, dtype, *window, **{variant: True}))
            found[f"bwd-{variant}"].append(sm90_bwd_config(bucket, dtype, *window, **{variant: True}))
    for dtype, bucket, window in itertools.product(dtypes, buckets, masks):  # a sink changes the forward alone
        found["fwd-sink"].append(sm90_fwd_config(bucket, dtype, *window, sink=True))
    for dtype, bucket, window, page in itertools.product(dtypes, buckets, masks, (0, *PAGE_SIZES)):
        # each with the tiles for short queries where they differ (forward_launcher: decoding's split-KV walks)
        config = sm90_fwd_config(bucket, dtype, *window, packed=True, page_size=page)
        short = sm90_fwd_config(bucket, dtype, *window, packed=True, page_size=page, short_queries=True)
        kind = "fwd-paged" if page else "fwd-packed"
        if page:  # (the packed configs without pages are listed with the other packed kinds above)
            found[kind].append(config)
        if short != config:
            found[kind].append(short)
    found["fwd-paged"] = list(dict.fromkeys(found["fwd-paged"]))  # pages of several sizes read in the same boxes
    for dtype, (head_dim, head_dim_v), window in itertools.product(dtypes, VALUE_HEAD_DIMS, masks):
        if head_dim in buckets:  # v's head dim apart from q's: the pairs models use
            found["fwd-value"].append(sm90_fwd_config(head_dim, dtype, *window, head_dim_v=head_dim_v))
    return found


def tma_addressable(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a TMA tensor map can describe it: a broadcast dim (stride 0, size > 1) is materialized (a copy),
    and a size-1 dim with stride 0 gets the contiguous stride (a view). Other layouts are returned as they are
    (the common case, and the one every launch asks first)."""
    if 0 not in t.stride():
        return t
    if any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape, strict=True)):
        t = t.contiguous()
    if 0 in t.stride():
        strides = [stride or math.prod(t.shape[dim + 1 :]) for dim, stride in enumerate(t.stride())]
        t = t.as_strided(t.shape, strides)
    return t


# The paged-cache arguments (block_table, page_size, seq_rows) of a launch that reads K and V as contiguous rows: the
# compiled forward takes every parameter of its __call__, None where it was built without them.
NO_PAGES = (None,) * 3


def forward_launcher(
    device: torch.device,
    dtype: str,
    head_dim: int,
    window_left: int,
    window_right: int,
    packed: bool = False,
    config: Sm90FwdConfig | None = None,
    grid: int | None = None,
    softcap: bool = False,
    sink: bool = False,
    alibi: bool = False,
    head_dim_v: int | None = None,
    page_size: int = 0,
):
    """``launch(q, k, v, out, lse, softmax_scale, diag_offset, packed_args=DENSE, softcap=0.0, sink=None,
    alibi=None, pages=NO_PAGES)`` for validated inputs of this device, dtype, head dim and window (outputs allocated by
    the caller), with the heuristic's config or ``config``; the persistent grid has one thread block per SM, or
    ``grid`` (tests: fewer blocks, each claiming several tiles). ``packed``, ``softcap``, ``sink``, ``alibi`` and
    ``head_dim_v`` as in the sm80 family's forward_launcher. ``page_size`` (packed only; reads_pages): k and v are
    a cache's pages, (pages * page_size, nheads_k, head_dim) rows, and ``pages`` the launch's (block_table,
    page_size, seq_rows), cu_seqlens_k numbering sequence b's positions from b * seq_rows. With the heuristic's
    config, a packed launch whose max_seqlen_q is at most SHORT_QUERY_ROWS runs the heuristic's tiles for short
    queries where they differ (compiled at the first such launch)."""
    short = None  # with the heuristic's config: (its config, compiled kernel) for launches of short queries
    if config is None:
        scores = {"softcap": softcap, "sink": sink, "alibi": alibi, "head_dim_v": head_dim_v}
        window = (window_left, window_right)
        config = sm90_fwd_config(head_dim, dtype, *window, packed=packed, page_size=page_size, **scores)
        short_config = sm90_fwd_config(
            head_dim, dtype, *window, packed=packed, page_size=page_size, short_queries=True, **scores
        )
        if short_config != config:
            short = [short_config, None]
    kernel = compiled(config, device, compile)
    max_grid = grid or num_sms(device)
    capped = config.softcap

    def launch(
        q,
        k,
        v,
        out,
        lse,
        softmax_scale: float,
        diag_offset: int,
        packed_args: tuple = DENSE,
        softcap: float = 0.0,
        sink: torch.Tensor | None = None,
        alibi: torch.Tensor | None = None,
        pages: tuple = NO_PAGES,
    ) -> None:
        q, k, v = tma_addressable(q), tma_addressable(k), tma_addressable(v)
        counter = tile_counter(device)
        scalars = (softmax_scale, diag_offset, window_left, window_right, max_grid)
        cap = softcap if capped else None  # None: an optional argument the kernel leaves out
        run = kernel
        if short is not None and packed_args[4] <= SHORT_QUERY_ROWS:  # max_seqlen_q: every sequence fits its tile
            run = short[1]
            if run is None:
                run = short[1] = compiled(short[0], device, compile)
        run_on_device(device, run, q, k, v, out, lse, counter, *scalars, *packed_args, cap, sink, alibi, *pages)

    return launch


_tile_counters: dict[tuple[int, int], torch.Tensor] = {}


def tile_counter(device: torch.device) -> torch.Tensor:
    """The forward's tile counter for the current stream: zeroed once and left zeroed by every launch (the kernel
    resets it), so launches on one stream, which run in order, share it. A CUDA graph being captured gets a counter
    of its own, zeroed in the graph, so that graphs replayed on other streams never share one."""
    if torch._C._cuda_isCurrentStreamCapturing():
        return torch.zeros(2, dtype=torch.int32, device=device)
    key = (device.index, torch._C._cuda_getCurrentRawStream(device.index))
    counter = _tile_counters.get(key)
    if counter is None:
        counter = _tile_counters[key] = torch.zeros(2, dtype=torch.int32, device=device)
    return counter


# The page sizes whose forward variants warmup builds: serving engines' (vLLM's default 16 rows) and
# flash_attn's tests' (256)
PAGE_SIZES = (16, 64, 256)


def reads_pages(page_size: int) -> bool:
    """Whether the forward reads K and V from a paged cache where it lies (forward_launcher's page_size): pages of a
    power of two rows, 8 or more, so that a box (page_rows, a whole number of 8-row swizzle atoms) divides both a
    page and the split-KV chunks (multiples of 128 keys), and a chunk never starts inside a box."""
    return page_size >= 8 and page_size & (page_size - 1) == 0


def supports_forward(head_dim: int, head_dim_v: int) -> bool:
    """Whether the forward takes v's head dim beside q's: up to q's bucket (V and O then take no more shared memory
    than at q's)."""
    return head_dim_v <= head_dim_bucket(head_dim)


def supports_backward(head_dim: int, deterministic: bool, packed: bool, head_dim_v: int | None = None) -> bool:
    """Whether the Hopper backward covers the call: every head dim, v's only where it is q's."""
    return head_dim_v in (None, head_dim)


def backward_kernels(
    head_dim: int,
    head_dim_v: int,
    dtype: str,
    window_left: int,
    window_right: int,
    deterministic: bool,
    packed: bool,
    softcap: bool,
    alibi: bool,
) -> list[Sm90BwdConfig]:
    """The configs of the kernels that ``backward`` runs for such a call, but the pre- and postprocess's (which build
    in tenths of a second, where these take seconds); ``softcap``, ``alibi``: whether the call caps, biases the
    scores. (v's head dim is q's here: supports_backward.)"""
    scores = {"softcap": softcap, "alibi": alibi, "deterministic": deterministic}
    return [sm90_bwd_config(head_dim, dtype, window_left, window_right, packed=packed, **scores)]


def backward(
    dout,
    q,
    k,
    v,
    out,
    lse,
    softmax_scale: float,
    diag_offset: int,
    window_left: int,
    window_right: int,
    deterministic: bool,
    packed_args: tuple | None = None,
    softcap: float = 0.0,
    alibi: torch.Tensor | None = None,
    dlse: torch.Tensor | None = None,
    sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(dq, dk, dv, the sinks' gradient rows): the preprocess D = rowsum(dO * O) (less ``dlse``, the LSE's
    gradient where a loss uses it), dQaccum zeroed, LSE * log2(e) (+inf where a row saw no key) and with ``sink``
    ((nheads,) float32 learnable sinks) each row's share of their gradient (prepost.preprocess; None without), D
    and LSE padded to whole Q tiles, which the kernel bulk-copies a tile at a time (D (batch, nheads, rows >=
    seqlen_q), 0 past seqlen_q); the Hopper kernel, which adds dQ by TMA reduce-adds of whole tiles; the
    postprocess scales dQ by softmax_scale and casts it. ``packed_args``: a packed variable-length batch's
    (forward_launcher), the tensors shaped as its launches take them; LSE and D then go in the rows of
    PaddedStatsRows, and the rows of dk and dv outside every sequence, which the kernel does not write, are zeroed
    apart (prepost.zero_rows_outside_sequences). ``softcap`` > 0: the forward capped the scores by it; ``alibi``:
    (batch, nheads) float32 slopes it biased them with; ``deterministic``: dQ is added in a fixed order, counted by
    a zeroed int32 per (batch, head, Q tile) (per PaddedStatsRows tile of a packed batch)."""
    batch, seqlen_q, nheads, head_dim = q.shape
    packed, capped = packed_args is not None, softcap > 0
    window = (window_left, window_right)
    call = (head_dim, head_dim, dtype_name(q), *window, deterministic, packed, capped, alibi is not None)
    (config,) = backward_kernels(*call)
    rows = seqlen_q if packed else -(-seqlen_q // config.block_m) * config.block_m
    delta = q.new_empty((batch, nheads, rows), dtype=torch.float32)
    lse_log2 = torch.empty_like(delta)
    dq_accum = torch.empty_like(q, dtype=torch.float32, memory_format=torch.contiguous_format)
    stats_rows = PaddedStatsRows(packed_args[0], seqlen_q, config.block_m) if packed else None
    counters = None
    if deterministic:  # zeroed before the preprocess, so that the kernel can follow the preprocess directly
        tiles = (stats_rows.rows if packed else rows) // config.block_m
        counters = torch.zeros((batch, nheads, tiles), dtype=torch.int32, device=q.device)
    sink_rows = prepost.preprocess(dout, out, delta, dq_accum, lse, lse_log2, dlse, sink)
    contiguous = torch.contiguous_format
    dq, dk, dv = (torch.empty_like(t, memory_format=contiguous) for t in (q, k, v))
    kernel_delta = delta
    if packed:  # the kernel writes each sequence's rows of dk and dv; the others get their gradient, 0, here
        prepost.zero_rows_outside_sequences(dk[0], dv[0], packed_args[1], packed_args[3])
        lse_log2, kernel_delta = stats_rows.scatter(math.inf, lse_log2), stats_rows.scatter(0.0, delta)
    q, k, v, dout = tma_addressable(q), tma_addressable(k), tma_addressable(v), tma_addressable(dout)
    scalars = (softmax_scale, diag_offset, window_left, window_right)
    tensors = (q, k, v, dout, lse_log2, kernel_delta, dq_accum, dk, dv)
    after = (*(packed_args or DENSE), softcap if capped else None, alibi, counters)
    run_on_device(q.device, compiled(config, q.device, compile), *tensors, *scalars, *after)
    prepost.postprocess(dq_accum, dq, softmax_scale)
    return dq, dk, dv, sink_rows


class PaddedStatsRows:
    """Where a packed batch's rows of LSE and D go for the Hopper backward, which bulk-copies them a whole Q tile
    at a time from 16-byte aligned addresses: sequence b's rows start at (cu_seqlens_q[b] + b * block_m) rounded
    down to a multiple of block_m (the kernel computes the same offset), which leaves each sequence room for its
    last tile's padding. ``scatter`` makes a (1, nheads, rows) tensor of ``values`` (1, nheads, total_q) in those
    rows and ``padding`` elsewhere: a few launches, no host sync. Rows past cu_seqlens_q[-1] (of no sequence) go
    to a spare tile past the last sequence's, which no thread block reads."""

    def __init__(self, cu_seqlens_q: torch.Tensor, total_q: int, block_m: int):
        batch = cu_seqlens_q.shape[0] - 1
        spare = -(-(total_q + batch * block_m) // block_m) * block_m
        self.rows = spare + block_m
        tokens = torch.arange(total_q, dtype=torch.int32, device=cu_seqlens_q.device)
        sequence = torch.searchsorted(cu_seqlens_q[1:], tokens, right=True).clamp_(max=batch - 1)
        starts = cu_seqlens_q[:-1]
        shift = (starts + torch.arange(batch, dtype=torch.int32, device=tokens.device) * block_m) // block_m * block_m
        index = tokens + (shift - starts)[sequence]
        self.index = torch.where(tokens < cu_seqlens_q[-1], index, spare).long()

    def scatter(self, padding: float, values: torch.Tensor) -> torch.Tensor:
        padded = torch.full((*values.shape[:-1], self.rows), padding, dtype=values.dtype, device=values.device)
        return padded.index_copy_(-1, self.index, values)
