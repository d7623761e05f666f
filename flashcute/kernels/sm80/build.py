"""The mma.sync family's kernels built for a target against symbolic shapes and strides (kernels/build.py): what
each takes, in order. Part of the compile cache's key (family.py, the launch contract, is not: compile_cache.py)."""

from __future__ import annotations

import os
from pathlib import Path

from flashcute.kernels.sm80.config import BwdConfig, DQConfig, FwdConfig


def compile(config: FwdConfig | BwdConfig | DQConfig, arch: str, dump_dir: Path | None = None):
    """The forward: (q, k, v, out, lse, softmax_scale, diag_offset, window_left, window_right). The dK/dV kernel:
    (q, k, v, dout, lse, d, dq_accum or None, dk, dv, ...the same scalars), dq_accum float32, None when
    ``config.accumulate_dq`` is off. The deterministic dQ kernel: (q, k, v, dout, lse, d, dq, ...the scalars).
    Each then takes a packed batch's arguments (build.optional_arguments), and the cap with ``config.softcap``."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    import cutlass

    from flashcute.kernels.build import SymbolicProblem, compile_kernel, optional_arguments

    p = SymbolicProblem(config)

    def build(kernel, *tensors):
        return compile_kernel(kernel, config, arch, dump_dir, *tensors, after=optional_arguments(p, config))

    if isinstance(config, FwdConfig):
        from flashcute.kernels.sm80.fwd import FlashAttentionForwardSm80

        tensors = (p.q_like(), p.kv_like(), p.v_like(), p.o_like(), p.row_stats())
        return build(FlashAttentionForwardSm80(config), *tensors)
    inputs = (p.q_like(), p.kv_like(), p.v_like(), p.o_like(), p.row_stats(), p.row_stats())  # dout is out-shaped
    if isinstance(config, BwdConfig):
        from flashcute.kernels.sm80.bwd import FlashAttentionBackwardSm80

        dq_accum = p.q_like(cutlass.Float32) if config.accumulate_dq else None
        kernel = FlashAttentionBackwardSm80(config, arch)
        return build(kernel, *inputs, dq_accum, p.kv_like(), p.v_like())
    from flashcute.kernels.sm80.bwd_dq import FlashAttentionBackwardDQSm80

    return build(FlashAttentionBackwardDQSm80(config), *inputs, p.q_like())
