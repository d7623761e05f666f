"""The kernels every family runs around its own (the backward's preprocess and postprocess, split-KV attention's
combine): their compile functions and launches."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from flashcute.kernels.common.prepost_config import (
    BwdPostConfig,
    BwdPreConfig,
    CombineConfig,
    bwd_post_config,
    bwd_pre_config,
    combine_config,
)
from flashcute.kernels.launch import compiled, dtype_name, run_on_device

CONFIG_TYPES = (BwdPreConfig, BwdPostConfig, CombineConfig)


def compile(config: BwdPreConfig | BwdPostConfig | CombineConfig, arch: str, dump_dir: Path | None = None):
    """The preprocess: (out, dout, d, dq_accum or None, lse or None, lse_log2 or None), d (batch, nheads, rows)
    float32 (rows may pass seqlen_q with ``config.lse_log2``), dq_accum float32, zeroed by the kernel, None when
    ``config.clear_dq_accum`` is off; lse (batch, nheads, seqlen_q) and lse_log2 (batch, nheads, rows) with
    ``config.lse_log2``. The postprocess: (dq_accum, dq, softmax_scale). The combine: (partial_out, partial_lse,
    out, lse, sink), combine.SplitKvCombine's tensors, sink only with ``config.sink``."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    import cutlass
    import cutlass.cute as cute

    from flashcute.kernels.build import SymbolicProblem, compile_kernel, fake_rows, fake_stats

    p = SymbolicProblem(config)
    if isinstance(config, BwdPreConfig):
        from flashcute.kernels.common.bwd_pre import FlashAttentionBackwardPreprocess

        dq_accum = p.q_like(cutlass.Float32) if config.clear_dq_accum else None
        padded_rows = fake_stats((p.batch, p.nheads, cute.sym_int()))  # D's rows: seqlen_q, or whole Q tiles
        lse = (p.row_stats(), padded_rows) if config.lse_log2 else (None, None)
        tensors = (p.q_like(), p.q_like(), padded_rows, dq_accum, *lse)
        # the Hopper backward's preprocess (LSE * log2(e) too) lets that kernel start while it ends
        kernel = FlashAttentionBackwardPreprocess(config, early_next=config.lse_log2 and arch == "sm_90a")
        return compile_kernel(kernel, config, arch, dump_dir, *tensors, scalars=())
    if isinstance(config, CombineConfig):
        from flashcute.kernels.common.combine import SplitKvCombine

        # sizes: batch, splits, seqlen_q * group, batch * seqlen_q, group, seqlen_q, nheads_k (head dim: p's)
        batch, splits, rows, positions, group, seqlen_q, nheads_k = (cute.sym_int() for _ in range(7))
        tensors = (
            fake_rows(p.dtype, (batch, splits, rows, nheads_k, p.head_dim)),
            fake_stats((nheads_k, batch, splits, rows)),
            fake_rows(p.dtype, (positions, group, nheads_k, p.head_dim)),
            fake_stats((batch, nheads_k, group, seqlen_q)),
        )
        sink = (fake_stats((nheads_k, group)),) if config.sink else ()
        return compile_kernel(SplitKvCombine(config), config, arch, dump_dir, *tensors, scalars=(), after=sink)
    from flashcute.kernels.common.bwd_post import FlashAttentionBackwardPostprocess

    tensors = (p.q_like(cutlass.Float32), p.q_like())
    return compile_kernel(FlashAttentionBackwardPostprocess(config), config, arch, dump_dir, *tensors, scalars=(1.0,))


def variants(dtypes, buckets, exact_only: bool) -> list[BwdPreConfig | BwdPostConfig | CombineConfig]:
    """The preprocess (zeroing dQaccum or not), the postprocess and the combine, per dtype x head-dim bucket (x
    exact/padded head dim; the combine with sinks at the exact head dims); they have no mask."""
    configs = []
    for dtype in dtypes:
        for bucket in buckets:
            for head_dim in (bucket,) if exact_only else (bucket, bucket - 8):
                configs += [bwd_pre_config(head_dim, dtype), bwd_pre_config(head_dim, dtype, clear_dq_accum=False)]
                configs.append(bwd_pre_config(head_dim, dtype, lse_log2=True))
                configs += [bwd_post_config(head_dim, dtype), combine_config(head_dim, dtype)]
            configs.append(combine_config(bucket, dtype, sink=True))
    return configs


def preprocess(
    dout: torch.Tensor,
    out: torch.Tensor,
    delta: torch.Tensor,
    dq_accum: torch.Tensor | None,
    lse: torch.Tensor | None = None,
    lse_log2: torch.Tensor | None = None,
) -> None:
    """``delta`` (batch, nheads, seqlen_q) float32, unit last stride, gets D = rowsum(dO * O) summed in float32, and
    ``dq_accum`` (float32, shaped like ``out``), when given, is zeroed in the same launch for the dQ atomics. With
    ``lse`` (batch, nheads, seqlen_q), ``lse_log2`` (shaped like ``delta``) gets LSE * log2(e), +inf where LSE =
    -inf, and both may have more rows than seqlen_q: there D = 0 and LSE * log2(e) = +inf."""
    config = bwd_pre_config(out.shape[-1], dtype_name(out), dq_accum is not None, lse is not None)
    run_on_device(out.device, compiled(config, out.device, compile), out, dout, delta, dq_accum, lse, lse_log2)


def postprocess(dq_accum: torch.Tensor, dq: torch.Tensor, softmax_scale: float) -> None:
    """dq = dq_accum * softmax_scale in dq's dtype."""
    config = bwd_post_config(dq.shape[-1], dtype_name(dq))
    run_on_device(dq.device, compiled(config, dq.device, compile), dq_accum, dq, softmax_scale)


def combine(
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    sink: torch.Tensor | None = None,
) -> None:
    """Split-KV attention's O and LSE from its splits' (combine.SplitKvCombine): partial_out (batch, splits,
    seqlen_q * group, nheads_k, head_dim), partial_lse (nheads_k, batch, splits, seqlen_q * group) float32; out
    (batch * seqlen_q, group, nheads_k, head_dim) and lse (batch, nheads_k, group, seqlen_q) float32, views of
    flash_attn's layouts; ``sink``, learnable sinks as (nheads_k, group) contiguous float32, join every row's sum."""
    config = combine_config(out.shape[-1], dtype_name(out), sink=sink is not None)
    # every argument by position, None where the variant left it out: a kernel loaded from the disk cache takes
    # all of them (only the function compiled in this process fills in the ones left out)
    run_on_device(out.device, compiled(config, out.device, compile), partial_out, partial_lse, out, lse, sink)
