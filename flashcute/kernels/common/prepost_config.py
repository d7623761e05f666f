"""Configs of the kernels every family runs around its own: the backward's preprocess and postprocess, and split-KV
attention's combine; and the heuristics that pick them."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from flashcute.kernels.common.limits import head_dim_bucket, head_dim_label, rows_per_copy

VECTOR = 8
"""Values of a 16-bit dtype in one 16-byte load or store."""


@dataclass(frozen=True)
class BwdPreConfig:
    """The backward's preprocess (kernels/common/bwd_pre.py): D = rowsum(dO * O) for block_m rows of one (batch,
    head) per thread block of num_warps warps, and, with clear_dq_accum, the same rows of the fp32 dQ accumulator
    zeroed for the dK/dV kernel's atomics; with lse_log2, LSE * log2(e) as a tiled backward reads it (the Hopper
    family's: rows padded to whole Q tiles, +inf where there is no key); with dlse, D less the gradient of the
    returned LSE; with sink, each row's share of the learnable sinks' gradient."""

    dtype: str
    head_dim_padded: int
    exact_head_dim: bool
    block_m: int
    num_warps: int
    clear_dq_accum: bool
    lse_log2: bool = False
    dlse: bool = False
    sink: bool = False

    @property
    def label(self) -> str:
        """ "bwdpre-bfloat16-d128-32w4-zerodq" ("-lse2" with lse_log2, "-dlse" with dlse, "-sink" with sink)."""
        zero = "-zerodq" if self.clear_dq_accum else ""
        lse = "-lse2" if self.lse_log2 else ""
        ends = f"{'-dlse' if self.dlse else ''}{'-sink' if self.sink else ''}"
        return f"bwdpre-{self.dtype}-{head_dim_label(self)}-{self.block_m}w{self.num_warps}{zero}{lse}{ends}"


@dataclass(frozen=True)
class BwdPostConfig:
    """The backward's postprocess (kernels/common/bwd_post.py): dQ = dQaccum * softmax_scale cast to dtype,
    block_m rows of one (batch, head) per thread block of num_warps warps."""

    dtype: str
    head_dim_padded: int
    exact_head_dim: bool
    block_m: int
    num_warps: int

    @property
    def label(self) -> str:
        """ "bwdpost-bfloat16-d128-32w4"."""
        return f"bwdpost-{self.dtype}-{head_dim_label(self)}-{self.block_m}w{self.num_warps}"


def _rows(bucket: int) -> int:
    """Rows per thread block of 4 warps: two passes of the tiled copy, so each thread holds two rows' share. The
    preprocess ran 8-15 % faster so at D = 32, 64 and 128 than with 8 passes (its rows' sums, statistics and
    stores come one row after another in a thread); the postprocess reads the same at any row count
    (docs/tuning-sm80.md, Preprocess and postprocess rows)."""
    return 2 * rows_per_copy(bucket, 4 * 32)


@functools.cache
def bwd_pre_config(
    head_dim: int,
    dtype: str,
    clear_dq_accum: bool = True,
    lse_log2: bool = False,
    dlse: bool = False,
    sink: bool = False,
) -> BwdPreConfig:
    """The heuristic for the backward's preprocess (clear_dq_accum off for the deterministic backward, whose dQ
    kernel needs no accumulator; lse_log2 for a backward that reads the LSE that way; dlse where a loss used the
    returned LSE; sink with learnable sinks)."""
    bucket = head_dim_bucket(head_dim)
    return BwdPreConfig(
        dtype=dtype,
        head_dim_padded=bucket,
        exact_head_dim=head_dim == bucket,
        block_m=_rows(bucket),
        num_warps=4,
        clear_dq_accum=clear_dq_accum,
        lse_log2=lse_log2,
        dlse=dlse,
        sink=sink,
    )


@functools.cache
def bwd_post_config(head_dim: int, dtype: str) -> BwdPostConfig:
    """The heuristic for the backward's postprocess."""
    bucket = head_dim_bucket(head_dim)
    return BwdPostConfig(
        dtype=dtype, head_dim_padded=bucket, exact_head_dim=head_dim == bucket, block_m=_rows(bucket), num_warps=4
    )


@dataclass(frozen=True)
class CombineConfig:
    """Split-KV attention's combine (kernels/common/combine.py): O and LSE from the splits' partial O_s and LSE_s,
    one 16-byte vector of a row per thread, thread blocks of num_warps warps; with ``sink``, each row's head's
    learnable sink joins the sum as one more split with O_s = 0."""

    dtype: str
    head_dim_padded: int
    exact_head_dim: bool
    num_warps: int
    sink: bool = False

    @property
    def label(self) -> str:
        """ "combine-bfloat16-d128-w4" ("-sink" with sinks)."""
        return f"combine-{self.dtype}-{head_dim_label(self)}-w{self.num_warps}{'-sink' if self.sink else ''}"


@functools.cache
def combine_config(head_dim: int, dtype: str, sink: bool = False) -> CombineConfig:
    """The heuristic for split-KV attention's combine (``sink``: with learnable sinks)."""
    bucket = head_dim_bucket(head_dim)
    # 4 warps: 8 rows a block at D=128; a few thousand rows a call, so the launch, not the kernel, is the cost
    exact = head_dim == bucket
    return CombineConfig(dtype=dtype, head_dim_padded=bucket, exact_head_dim=exact, num_warps=4, sink=sink)


@dataclass(frozen=True)
class AppendConfig:
    """A decoding step's writes before its attention (kernels/common/append.py): with ``keys``, the new keys and
    values into a cache whose slots are cache rows by batch (``batch_index``: picked by cache_batch_idx) or pages
    (``pages``: block_table's); with ``counts``, the split-KV chunks' key counts; with ``tail`` (and counts, a cache
    by batch), the counts leave out each sequence's last keys, which several query rows see under a mask, and the
    launch writes where those keys lie and how many they are (splitkv.Tail). Head dims are sizes of the launch, not
    of the build."""

    dtype: str
    keys: bool
    pages: bool = False
    batch_index: bool = False
    counts: bool = False
    tail: bool = False

    @property
    def label(self) -> str:
        """ "append-bfloat16-pages-counts" ("-rows" with batch_index; "append-bfloat16-counts" without keys; "-tail"
        with tail)."""
        slots = ("-pages" if self.pages else "") + ("-rows" if self.batch_index else "")
        counts = ("-counts" if self.counts else "") + ("-tail" if self.tail else "")
        return f"append-{self.dtype}{'-keys' if self.keys else ''}{slots}{counts}"


@functools.cache
def append_config(
    dtype: str, keys: bool, pages: bool = False, batch_index: bool = False, counts: bool = False, tail: bool = False
):
    """The config of a decoding step's writes (nothing to choose: a thread a 16-byte vector, as the launch needs)."""
    return AppendConfig(dtype=dtype, keys=keys, pages=pages, batch_index=batch_index, counts=counts, tail=tail)


@dataclass(frozen=True)
class ZeroRowsConfig:
    """A packed backward's dK and dV rows that no sequence covers, zeroed (kernels/common/zero_rows.py). Widths and
    lengths are sizes of the launch, not of the build."""

    dtype: str

    @property
    def label(self) -> str:
        """ "zerorows-bfloat16"."""
        return f"zerorows-{self.dtype}"


@functools.cache
def zero_rows_config(dtype: str) -> ZeroRowsConfig:
    """The config of the zeroing (nothing to choose: a lane a row, then a 16-byte vector, as the launch needs)."""
    return ZeroRowsConfig(dtype=dtype)
