"""Compiling kernels against symbolic tensors, on a machine with or without a GPU.

``compile_fwd(config, arch)`` returns a TVM-FFI function taking
    (q, k, v, out, lse, softmax_scale, diag_offset, window_left, window_right)
as torch tensors and Python numbers, launching on the current CUDA stream; ``compile_bwd``, ``compile_dq``,
``compile_bwd_pre`` and ``compile_bwd_post`` likewise for the backward kernels, ``compile_kernel`` for any of them
by the type of its config. Every size and every stride but the unit stride of the last dim is symbolic, so the one
compiled function serves every shape and layout the validation admits (strides divisible by 8 elements: 16-byte
aligned rows; the fp32 dQ accumulator's by 4).
"""

from __future__ import annotations

import os
from pathlib import Path

from flashcute.config import BwdConfig, BwdPostConfig, BwdPreConfig, DQConfig, FwdConfig, Sm90BwdConfig, Sm90FwdConfig

ARCHS = ("sm_80", "sm_90a")
# softmax_scale, diag_offset, window_left, window_right: placeholders, as every scalar is a run-time argument
ATTENTION_SCALARS = (1.0, 0, -1, -1)


def _fake_bshd(dtype, batch, seqlen, heads, head_dim):
    """A (batch, seqlen, heads, head_dim) tensor with symbolic, 16-byte-aligned strides and a unit last stride."""
    import cutlass.cute as cute

    align = 128 // dtype.width
    strides = (
        cute.sym_int64(divisibility=align),
        cute.sym_int64(divisibility=align),
        cute.sym_int64(divisibility=align),
        1,
    )
    return cute.runtime.make_fake_tensor(dtype, (batch, seqlen, heads, head_dim), stride=strides, assumed_align=16)


class _SymbolicProblem:
    """Symbolic sizes shared by every tensor of one compile, and fake tensors made from them."""

    def __init__(self, config):
        import cutlass.cute as cute

        from flashcute.kernels.sm80.fwd import CUTLASS_DTYPES

        self.dtype = CUTLASS_DTYPES[config.dtype]
        self.batch, self.seqlen_q, self.seqlen_k, self.nheads, self.nheads_k = (cute.sym_int() for _ in range(5))
        self.head_dim = config.head_dim_padded if config.exact_head_dim else cute.sym_int(divisibility=8)

    def q_like(self, dtype=None):
        """(batch, seqlen_q, nheads, head_dim): q, out, dout, dq."""
        return _fake_bshd(dtype or self.dtype, self.batch, self.seqlen_q, self.nheads, self.head_dim)

    def kv_like(self):
        """(batch, seqlen_k, nheads_k, head_dim): k, v, dk, dv."""
        return _fake_bshd(self.dtype, self.batch, self.seqlen_k, self.nheads_k, self.head_dim)

    def row_stats(self):
        """(batch, nheads, seqlen_q) float32 with a unit last stride: LSE, or D = rowsum(dO * O)."""
        import cutlass
        import cutlass.cute as cute

        shape, strides = (self.batch, self.nheads, self.seqlen_q), (cute.sym_int64(), cute.sym_int64(), 1)
        return cute.runtime.make_fake_tensor(cutlass.Float32, shape, stride=strides, assumed_align=4)

    def tile_counter(self, records: bool = False):
        """int32: the Hopper forward's tile counter (Sm90FwdConfig.claim_tiles), (1,), or of any length with
        tile records after it (Sm90FwdConfig.trace_tiles)."""
        import cutlass
        import cutlass.cute as cute

        size = cute.sym_int() if records else 1
        return cute.runtime.make_fake_tensor(cutlass.Int32, (size,), stride=(1,), assumed_align=4)

    def padded_row_stats(self):
        """(batch, nheads, seqlen_q rounded up to a Q tile) float32, 16-byte aligned rows: the Hopper backward's
        LSE * log2(e) and D, which it reads a tile at a time with bulk copies."""
        import cutlass
        import cutlass.cute as cute

        shape = (self.batch, self.nheads, cute.sym_int(divisibility=4))
        strides = (cute.sym_int64(divisibility=4), cute.sym_int64(divisibility=4), 1)
        return cute.runtime.make_fake_tensor(cutlass.Float32, shape, stride=strides, assumed_align=16)


def _compile(kernel, config, arch: str, dump_dir: Path | None, *tensors, scalars: tuple = ATTENTION_SCALARS):
    """Check ``config`` with the kernel's ``can_implement`` and compile ``kernel`` (built from ``config``) against
    ``tensors``, then ``scalars`` (by default the attention kernels' softmax_scale, diag_offset, window_left,
    window_right) and the caller's current stream."""
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
    return cute.compile(kernel, *tensors, *scalars, stream, options=options)


def compile_fwd(config: FwdConfig | Sm90FwdConfig, arch: str, dump_dir: Path | None = None):
    """A forward kernel, sm80 or sm90 by the config's type: (q, k, v, out, lse, softmax_scale, diag_offset,
    window_left, window_right), and for sm90 with a tile counter (or None without claim_tiles) before the
    scalars and max_grid, the most thread blocks its grid may have (Sm90FwdConfig.grid_limit), after them."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    from flashcute.kernels.sm80.fwd import FlashAttentionForwardSm80
    from flashcute.kernels.sm90.fwd import FlashAttentionForwardSm90

    sm90 = isinstance(config, Sm90FwdConfig)
    kernel = FlashAttentionForwardSm90(config) if sm90 else FlashAttentionForwardSm80(config)
    p = _SymbolicProblem(config)
    tensors = (p.q_like(), p.kv_like(), p.kv_like(), p.q_like(), p.row_stats())
    if sm90:
        tensors += (p.tile_counter(config.trace_tiles) if config.claim_tiles else None,)
    return _compile(
        kernel, config, arch, dump_dir, *tensors, scalars=(*ATTENTION_SCALARS, 1) if sm90 else ATTENTION_SCALARS
    )


def compile_bwd(config: BwdConfig, arch: str, dump_dir: Path | None = None):
    """The dK/dV kernel: (q, k, v, dout, lse, d, dq_accum or None, dk, dv, softmax_scale, diag_offset,
    window_left, window_right); dq_accum is float32 and None when ``config.accumulate_dq`` is off."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    import cutlass

    from flashcute.kernels.sm80.bwd import FlashAttentionBackwardSm80

    p = _SymbolicProblem(config)
    dq_accum = p.q_like(cutlass.Float32) if config.accumulate_dq else None
    tensors = (p.q_like(), p.kv_like(), p.kv_like(), p.q_like(), p.row_stats(), p.row_stats(), dq_accum)
    kernel = FlashAttentionBackwardSm80(config, arch)
    return _compile(kernel, config, arch, dump_dir, *tensors, p.kv_like(), p.kv_like())


def compile_sm90_bwd(config: Sm90BwdConfig, arch: str, dump_dir: Path | None = None):
    """The Hopper backward: (q, k, v, dout, lse_log2, d, dq_accum, dk, dv, softmax_scale, diag_offset,
    window_left, window_right); lse_log2 and d padded to whole Q tiles (see kernels/sm90/bwd.py)."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    import cutlass

    from flashcute.kernels.sm90.bwd import FlashAttentionBackwardSm90

    p = _SymbolicProblem(config)
    stats = (p.padded_row_stats(), p.padded_row_stats())
    tensors = (p.q_like(), p.kv_like(), p.kv_like(), p.q_like(), *stats, p.q_like(cutlass.Float32))
    return _compile(FlashAttentionBackwardSm90(config), config, arch, dump_dir, *tensors, p.kv_like(), p.kv_like())


def compile_dq(config: DQConfig, arch: str, dump_dir: Path | None = None):
    """The deterministic dQ kernel: (q, k, v, dout, lse, d, dq, softmax_scale, diag_offset, window_left,
    window_right)."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    from flashcute.kernels.sm80.bwd_dq import FlashAttentionBackwardDQSm80

    p = _SymbolicProblem(config)
    tensors = (p.q_like(), p.kv_like(), p.kv_like(), p.q_like(), p.row_stats(), p.row_stats(), p.q_like())
    return _compile(FlashAttentionBackwardDQSm80(config), config, arch, dump_dir, *tensors)


def compile_bwd_pre(config: BwdPreConfig, arch: str, dump_dir: Path | None = None):
    """The backward's preprocess: (out, dout, d, dq_accum or None); d is (batch, nheads, seqlen_q) float32 and
    dq_accum float32, zeroed by the kernel, and None when ``config.clear_dq_accum`` is off."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    import cutlass

    from flashcute.kernels.sm80.bwd_pre import FlashAttentionBackwardPreprocessSm80

    p = _SymbolicProblem(config)
    dq_accum = p.q_like(cutlass.Float32) if config.clear_dq_accum else None
    tensors = (p.q_like(), p.q_like(), p.row_stats(), dq_accum)
    return _compile(FlashAttentionBackwardPreprocessSm80(config), config, arch, dump_dir, *tensors, scalars=())


def compile_bwd_post(config: BwdPostConfig, arch: str, dump_dir: Path | None = None):
    """The backward's postprocess: (dq_accum, dq, softmax_scale); dq_accum is float32."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    import cutlass

    from flashcute.kernels.sm80.bwd_post import FlashAttentionBackwardPostprocessSm80

    p = _SymbolicProblem(config)
    tensors = (p.q_like(cutlass.Float32), p.q_like())
    return _compile(FlashAttentionBackwardPostprocessSm80(config), config, arch, dump_dir, *tensors, scalars=(1.0,))


def compile_kernel(
    config: FwdConfig | Sm90FwdConfig | BwdConfig | Sm90BwdConfig | DQConfig | BwdPreConfig | BwdPostConfig,
    arch: str,
    dump_dir: Path | None = None,
):
    """Compile whichever kernel ``config`` configures."""
    build = {
        FwdConfig: compile_fwd,
        Sm90FwdConfig: compile_fwd,
        BwdConfig: compile_bwd,
        Sm90BwdConfig: compile_sm90_bwd,
        DQConfig: compile_dq,
        BwdPreConfig: compile_bwd_pre,
        BwdPostConfig: compile_bwd_post,
    }[type(config)]
    return build(config, arch, dump_dir)
