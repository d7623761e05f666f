"""The Hopper family's kernels built for a target against symbolic shapes and strides (kernels/build.py): what
each takes, in order. Part of the compile cache's key (family.py, the launch contract, is not: compile_cache.py)."""

from __future__ import annotations

import os
from pathlib import Path

from flashcute.kernels.sm90.config import Sm90BwdConfig, Sm90FwdConfig


def compile(config: Sm90FwdConfig | Sm90BwdConfig, arch: str, dump_dir: Path | None = None):
    """The forward: (q, k, v, out, lse, tile_counter, softmax_scale, diag_offset, window_left, window_right,
    max_grid). The backward: (q, k, v, dout, lse_log2, d, dq_accum, dk, dv, softmax_scale, diag_offset,
    window_left, window_right), lse_log2 and d padded to whole Q tiles. Each then takes a packed batch's arguments
    (build.optional_arguments), and the cap with ``config.softcap``; the deterministic backward last its Q tiles'
    counters."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    import cutlass

    from flashcute.kernels.build import ATTENTION_SCALARS, SymbolicProblem, compile_kernel, optional_arguments

    p = SymbolicProblem(config)
    if isinstance(config, Sm90FwdConfig):
        from flashcute.kernels.sm90.fwd import FlashAttentionForwardSm90

        tensors = (p.q_like(), p.kv_like(), p.v_like(), p.o_like(), p.row_stats(), p.tile_counter())
        kernel = FlashAttentionForwardSm90(config)
        after = optional_arguments(p, config)
        return compile_kernel(kernel, config, arch, dump_dir, *tensors, scalars=(*ATTENTION_SCALARS, 1), after=after)
    from flashcute.kernels.sm90.bwd import FlashAttentionBackwardSm90
    from flashcute.kernels.sm90.bwd_wide import FlashAttentionBackwardSm90Wide

    stats = (p.padded_row_stats(), p.padded_row_stats())
    tensors = (p.q_like(), p.kv_like(), p.kv_like(), p.q_like(), *stats, p.q_like(cutlass.Float32))
    kernel = (FlashAttentionBackwardSm90Wide if config.wide else FlashAttentionBackwardSm90)(config)
    after = optional_arguments(p, config, p.q_tile_counters() if config.deterministic else None)
    return compile_kernel(kernel, config, arch, dump_dir, *tensors, p.kv_like(), p.kv_like(), after=after)
