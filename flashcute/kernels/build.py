"""Compiling kernels against symbolic tensors, on a machine with or without a GPU: what every family's compile
functions share.

A family's ``compile(config, arch)`` builds its kernel's fake tensors from a SymbolicProblem and calls
``compile_kernel``, which returns a TVM-FFI function taking torch tensors and Python numbers and launching on the
current CUDA stream. Every size and every stride but the unit stride of the last dim is symbolic, so the one
compiled function serves every shape and layout the validation admits (strides divisible by 8 elements: 16-byte
aligned rows; the fp32 dQ accumulator's by 4).
"""

from __future__ import annotations

import os
from pathlib import Path

# softmax_scale, diag_offset, window_left, window_right: placeholders, as every scalar is a run-time argument
ATTENTION_SCALARS = (1.0, 0, -1, -1)


def fake_rows(dtype, shape: tuple):
    """A tensor of ``shape`` (its last dim the head dim) with symbolic, 16-byte-aligned strides and a unit last
    stride: q, k, v and the like."""
    import cutlass.cute as cute

    align = 128 // dtype.width
    strides = (*(cute.sym_int64(divisibility=align) for _ in shape[:-1]), 1)
    return cute.runtime.make_fake_tensor(dtype, shape, stride=strides, assumed_align=16)


def fake_stats(shape: tuple):
    """A float32 tensor of ``shape`` with symbolic strides and a unit last stride: per-row statistics (LSE, D)."""
    import cutlass
    import cutlass.cute as cute

    strides = (*(cute.sym_int64() for _ in shape[:-1]), 1)
    return cute.runtime.make_fake_tensor(cutlass.Float32, shape, stride=strides, assumed_align=4)


def fake_int32(shape: tuple):
    """An int32 tensor of ``shape`` with symbolic strides and a unit last stride: lengths, indices, page tables."""
    import cutlass
    import cutlass.cute as cute

    strides = (*(cute.sym_int64() for _ in shape[:-1]), 1)
    return cute.runtime.make_fake_tensor(cutlass.Int32, shape, stride=strides, assumed_align=4)


class SymbolicProblem:
    """Symbolic sizes shared by every tensor of one compile, and fake tensors made from them."""

    def __init__(self, config):
        import cutlass.cute as cute

        from flashcute.kernels.common.dtypes import CUTLASS_DTYPES

        self.dtype = CUTLASS_DTYPES[config.dtype]
        self.batch, self.seqlen_q, self.seqlen_k, self.nheads, self.nheads_k = (cute.sym_int() for _ in range(5))
        self.head_dim = config.head_dim_padded if config.exact_head_dim else cute.sym_int(divisibility=8)
        self.head_dim_v = self.head_dim  # v's and out's, where a config has another (head_dim_v_padded)
        if getattr(config, "head_dim_v_padded", None) is not None:
            self.head_dim_v = config.head_dim_v_padded if config.exact_head_dim_v else cute.sym_int(divisibility=8)

    def q_like(self, dtype=None):
        """(batch, seqlen_q, nheads, head_dim): q, out, dout, dq."""
        return fake_rows(dtype or self.dtype, (self.batch, self.seqlen_q, self.nheads, self.head_dim))

    def kv_like(self):
        """(batch, seqlen_k, nheads_k, head_dim): k, v, dk, dv."""
        return fake_rows(self.dtype, (self.batch, self.seqlen_k, self.nheads_k, self.head_dim))

    def v_like(self):
        """(batch, seqlen_k, nheads_k, head_dim_v): v."""
        return fake_rows(self.dtype, (self.batch, self.seqlen_k, self.nheads_k, self.head_dim_v))

    def o_like(self):
        """(batch, seqlen_q, nheads, head_dim_v): out."""
        return fake_rows(self.dtype, (self.batch, self.seqlen_q, self.nheads, self.head_dim_v))

    def row_stats(self):
        """(batch, nheads, seqlen_q) float32 with a unit last stride: LSE, or D = rowsum(dO * O)."""
        return fake_stats((self.batch, self.nheads, self.seqlen_q))

    def tile_counter(self):
        """(2,) int32: a persistent kernel's count of the tiles claimed so far and of the thread blocks done."""
        import cutlass
        import cutlass.cute as cute

        return cute.runtime.make_fake_tensor(cutlass.Int32, (2,), stride=(1,), assumed_align=8)

    def packed_batch(self) -> tuple:
        """A packed variable-length batch's arguments (kernels/common/seqlen.py): cu_seqlens_q and cu_seqlens_k
        (batch + 1,) int32, seqused_q and seqused_k (batch,) int32 (views into a cu_seqlens where the caller gives
        none: 4-byte aligned), and max_seqlen_q, max_seqlen_k."""
        import cutlass
        import cutlass.cute as cute

        def vector():
            return cute.runtime.make_fake_tensor(cutlass.Int32, (cute.sym_int(),), stride=(1,), assumed_align=4)

        return (vector(), vector(), vector(), vector(), cutlass.Int32(0), cutlass.Int32(0))

    def head_vector(self):
        """(nheads,) float32, contiguous: one value per query head (learnable sinks)."""
        import cutlass
        import cutlass.cute as cute

        return cute.runtime.make_fake_tensor(cutlass.Float32, (self.nheads,), stride=(1,), assumed_align=4)

    def alibi_slopes(self):
        """(batch, nheads) float32, rows contiguous: ALiBi slopes per sequence and query head (batch counts a packed
        batch's sequences)."""
        import cutlass
        import cutlass.cute as cute

        shape, stride = (cute.sym_int(), self.nheads), (cute.sym_int64(), 1)
        return cute.runtime.make_fake_tensor(cutlass.Float32, shape, stride=stride, assumed_align=4)

    def padded_row_stats(self):
        """(batch, nheads, seqlen_q rounded up to a Q tile) float32, 16-byte aligned rows: the Hopper backward's
        LSE * log2(e) and D, which it reads a tile at a time with bulk copies."""
        import cutlass
        import cutlass.cute as cute

        shape = (self.batch, self.nheads, cute.sym_int(divisibility=4))
        strides = (cute.sym_int64(divisibility=4), cute.sym_int64(divisibility=4), 1)
        return cute.runtime.make_fake_tensor(cutlass.Float32, shape, stride=strides, assumed_align=16)

    def paged_cache(self) -> tuple:
        """A cache's pages (flash_attn_with_kvcache's block_table): the (batch, pages) int32 table with a unit last
        stride, the rows of a page and the rows a sequence's positions span (its capacity)."""
        import cutlass
        import cutlass.cute as cute

        return fake_int32((cute.sym_int(), cute.sym_int())), cutlass.Int32(0), cutlass.Int32(0)

    def q_tile_counters(self):
        """(batch, nheads, Q tiles) int32 with a unit last stride: an order counter per Q tile (common/semaphore.py)."""
        import cutlass
        import cutlass.cute as cute

        shape = (self.batch, self.nheads, cute.sym_int())
        return cute.runtime.make_fake_tensor(cutlass.Int32, shape, stride=(cute.sym_int64(), cute.sym_int64(), 1))


def optional_arguments(p: SymbolicProblem, config, *last) -> tuple:
    """What an attention kernel built for ``config`` takes behind the stream: a packed batch's arguments
    (packed_batch; None for a dense batch, as launch.DENSE passes them), with ``config.softcap`` the cap, with a
    forward's ``config.sink`` the (nheads,) float32 sinks (a slot the backward kernels do not have), with
    ``config.alibi`` the (batch, nheads) float32 slopes, then ``last``, a kernel's own last arguments where it has
    them (the Hopper backward's Q tile counters, the Hopper forward's pages: paged_cache); None for each left out,
    the trailing ones dropped (the launches pass None there)."""
    import cutlass

    after = [*(p.packed_batch() if config.packed else (None,) * 6), cutlass.Float32(0.0) if config.softcap else None]
    if hasattr(config, "sink"):
        after.append(p.head_vector() if config.sink else None)
    after += [p.alibi_slopes() if config.alibi else None, *last]
    while after and after[-1] is None:
        after.pop()
    return tuple(after)


def compile_kernel(
    kernel, config, arch: str, dump_dir: Path | None, *tensors, scalars: tuple = ATTENTION_SCALARS, after: tuple = ()
):
    """Check ``config`` with the kernel's ``can_implement`` and compile ``kernel`` (built from ``config``) against
    ``tensors``, then ``scalars`` (by default the attention kernels' softmax_scale, diag_offset, window_left,
    window_right), the caller's current stream, and ``after`` (the optional arguments behind the stream: a packed
    batch's, SymbolicProblem.packed_batch). The compiled function takes every argument but the stream, in order;
    optional ones left out at compile time are None at every call."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    import cutlass.cute as cute

    reason = kernel.can_implement(config, arch)
    if reason is not None:
        raise ValueError(f"cannot build {type(kernel).__name__} for {config}: {reason}")
    options = f"--enable-tvm-ffi --gpu-arch {arch}"
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        options += f" --keep-ptx --keep-cubin --dump-dir {dump_dir}"
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(kernel, *tensors, *scalars, stream, *after, options=options)
