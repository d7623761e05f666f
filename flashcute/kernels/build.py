"""Compiling kernels against symbolic tensors, on a machine with or without a GPU.

``compile_fwd(config, arch)`` returns a TVM-FFI function taking
    (q, k, v, out, lse, softmax_scale, diag_offset, window_left, window_right)
as torch tensors and Python numbers, launching on the current CUDA stream; ``compile_bwd`` likewise for the
backward kernel, ``compile_kernel`` for either by the type of its config. Every size and every stride but the
unit stride of the last dim is symbolic, so the one compiled function serves every shape and layout the
validation admits (strides divisible by 8 elements: 16-byte aligned rows).
"""

from __future__ import annotations

import os
from pathlib import Path

from flashcute.config import BwdConfig, DQConfig, FwdConfig

ARCHS = ("sm_80", "sm_90a")


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


def compile_fwd(config: FwdConfig, arch: str, dump_dir: Path | None = None):
    """Compile the sm80 forward kernel for ``config`` and target ``arch`` ("sm_80" or "sm_90a")."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    import cutlass.cute as cute

    from flashcute.kernels.sm80.fwd import CUTLASS_DTYPES, FlashAttentionForwardSm80

    reason = FlashAttentionForwardSm80.can_implement(config, arch)
    if reason is not None:
        raise ValueError(f"cannot build the sm80 forward kernel for {config}: {reason}")
    dtype = CUTLASS_DTYPES[config.dtype]
    batch, seqlen_q, seqlen_k, nheads, nheads_k = (cute.sym_int() for _ in range(5))
    head_dim = config.head_dim_padded if config.exact_head_dim else cute.sym_int(divisibility=8)
    q = _fake_bshd(dtype, batch, seqlen_q, nheads, head_dim)
    k = _fake_bshd(dtype, batch, seqlen_k, nheads_k, head_dim)
    v = _fake_bshd(dtype, batch, seqlen_k, nheads_k, head_dim)
    o = _fake_bshd(dtype, batch, seqlen_q, nheads, head_dim)
    lse = _fake_row_stats(batch, nheads, seqlen_q)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    kernel = FlashAttentionForwardSm80(config)
    return cute.compile(kernel, q, k, v, o, lse, 1.0, 0, -1, -1, stream, options=_options(arch, dump_dir))


def compile_kernel(config: FwdConfig | BwdConfig | DQConfig, arch: str, dump_dir: Path | None = None):
    """Compile whichever kernel ``config`` configures."""
    build = {FwdConfig: compile_fwd, BwdConfig: compile_bwd, DQConfig: compile_dq}[type(config)]
    return build(config, arch, dump_dir)


def _options(arch: str, dump_dir: Path | None) -> str:
    options = f"--enable-tvm-ffi --gpu-arch {arch}"
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        options += f" --keep-ptx --keep-cubin --dump-dir {dump_dir}"
    return options


def compile_bwd(config: BwdConfig, arch: str, dump_dir: Path | None = None):
    """Compile the sm80 backward kernel; the function takes
    (q, k, v, dout, lse, d, dq_accum, dk, dv, softmax_scale, diag_offset, window_left, window_right)."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    import cutlass
    import cutlass.cute as cute

    from flashcute.kernels.sm80.bwd import FlashAttentionBackwardSm80
    from flashcute.kernels.sm80.fwd import CUTLASS_DTYPES

    reason = FlashAttentionBackwardSm80.can_implement(config, arch)
    if reason is not None:
        raise ValueError(f"cannot build the sm80 backward kernel for {config}: {reason}")
    dtype = CUTLASS_DTYPES[config.dtype]
    batch, seqlen_q, seqlen_k, nheads, nheads_k = (cute.sym_int() for _ in range(5))
    head_dim = config.head_dim_padded if config.exact_head_dim else cute.sym_int(divisibility=8)
    q, do = (_fake_bshd(dtype, batch, seqlen_q, nheads, head_dim) for _ in range(2))
    k, v, dk, dv = (_fake_bshd(dtype, batch, seqlen_k, nheads_k, head_dim) for _ in range(4))
    dq_accum = _fake_bshd(cutlass.Float32, batch, seqlen_q, nheads, head_dim) if config.accumulate_dq else None
    lse, d = (_fake_row_stats(batch, nheads, seqlen_q) for _ in range(2))
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    kernel = FlashAttentionBackwardSm80(config)
    return cute.compile(
        kernel, q, k, v, do, lse, d, dq_accum, dk, dv, 1.0, 0, -1, -1, stream, options=_options(arch, dump_dir)
    )


def compile_dq(config: DQConfig, arch: str, dump_dir: Path | None = None):
    """Compile the deterministic dQ kernel; the function takes
    (q, k, v, dout, lse, d, dq, softmax_scale, diag_offset, window_left, window_right)."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    import cutlass.cute as cute

    from flashcute.kernels.sm80.bwd_dq import FlashAttentionBackwardDQSm80
    from flashcute.kernels.sm80.fwd import CUTLASS_DTYPES

    reason = FlashAttentionBackwardDQSm80.can_implement(config, arch)
    if reason is not None:
        raise ValueError(f"cannot build the sm80 dQ kernel for {config}: {reason}")
    dtype = CUTLASS_DTYPES[config.dtype]
    batch, seqlen_q, seqlen_k, nheads, nheads_k = (cute.sym_int() for _ in range(5))
    head_dim = config.head_dim_padded if config.exact_head_dim else cute.sym_int(divisibility=8)
    q, do, dq = (_fake_bshd(dtype, batch, seqlen_q, nheads, head_dim) for _ in range(3))
    k, v = (_fake_bshd(dtype, batch, seqlen_k, nheads_k, head_dim) for _ in range(2))
    lse, d = (_fake_row_stats(batch, nheads, seqlen_q) for _ in range(2))
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    kernel = FlashAttentionBackwardDQSm80(config)
    return cute.compile(kernel, q, k, v, do, lse, d, dq, 1.0, 0, -1, -1, stream, options=_options(arch, dump_dir))


def _fake_row_stats(batch, nheads, seqlen_q):
    """A (batch, nheads, seqlen_q) float32 tensor with a unit last stride: LSE, or D = rowsum(dO * O)."""
    import cutlass
    import cutlass.cute as cute

    strides = (cute.sym_int64(), cute.sym_int64(), 1)
    return cute.runtime.make_fake_tensor(cutlass.Float32, (batch, nheads, seqlen_q), stride=strides, assumed_align=4)
