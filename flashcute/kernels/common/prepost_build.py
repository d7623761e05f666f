"""The shared kernels (the backward's preprocess and postprocess, the split-KV combine) built for a target against
symbolic shapes and strides (kernels/build.py): what each takes, in order. Part of the compile cache's key
(prepost.py, their launches, is not: compile_cache.py)."""

from __future__ import annotations

import os
from pathlib import Path

from flashcute.kernels.common.prepost_config import (
    AppendConfig,
    BwdPostConfig,
    BwdPreConfig,
    CombineConfig,
    ZeroRowsConfig,
)


def compile(
    config: BwdPreConfig | BwdPostConfig | CombineConfig | AppendConfig | ZeroRowsConfig,
    arch: str,
    dump_dir: Path | None = None,
):
    """The preprocess: (out, dout, d, dq_accum or None, lse or None, lse_log2 or None, dlse or None, sink or None,
    sink_grad or None), d (batch, nheads, rows) float32 (rows may pass seqlen_q with ``config.lse_log2``), dq_accum
    float32, zeroed by the kernel, None when ``config.clear_dq_accum`` is off; lse (batch, nheads, seqlen_q) with
    ``config.lse_log2`` or ``config.sink``, lse_log2 (batch, nheads, rows) with ``config.lse_log2``; dlse shaped like
    lse with ``config.dlse``; sink (nheads,) and sink_grad shaped like lse with ``config.sink``. The postprocess:
    (dq_accum, dq, softmax_scale). The combine: (partial_out, partial_lse, out, lse, sink), combine.SplitKvCombine's
    tensors, sink only with ``config.sink``. The append: (lengths, k, v, k_cache, v_cache, cache_batch_idx,
    block_table, counts, chunk, tail_rows, tail_keys, seq_rows), append.KvCacheAppend's, None for what ``config``
    leaves out. The zeroing: (dk_rows, dv_rows, cu_seqlens_k, seqused_k), zero_rows.ZeroRowsOutsideSequences's."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)
    import cutlass
    import cutlass.cute as cute

    from flashcute.kernels.build import SymbolicProblem, compile_kernel, fake_int32, fake_rows, fake_stats

    if isinstance(config, AppendConfig):
        from flashcute.kernels.common.append import KvCacheAppend
        from flashcute.kernels.common.dtypes import CUTLASS_DTYPES

        dtype = CUTLASS_DTYPES[config.dtype]

        def rows(shape):  # any head dim, a multiple of 8 (16-byte vectors)
            return fake_rows(dtype, (*shape, cute.sym_int(divisibility=8)))

        batch, seqlen_new, nheads_k, cache_rows, slot_rows = (cute.sym_int() for _ in range(5))
        keys = [None] * 4
        if config.keys:
            new, cache = (batch, seqlen_new, nheads_k), (cache_rows, slot_rows, nheads_k)
            keys = [rows(new), rows(new), rows(cache), rows(cache)]
        table = fake_int32((batch, cute.sym_int())) if config.pages else None  # (batch, max_pages)
        counts = fake_int32((batch, cute.sym_int())) if config.counts else None  # (batch, splits)
        index = fake_int32((batch,)) if config.batch_index else None
        tensors = (fake_int32((batch,)), *keys, index, table, counts)
        tail = (fake_int32((2, cute.sym_int())) if config.tail else None, cutlass.Int32(0), cutlass.Int32(0))
        kernel = KvCacheAppend(config)
        return compile_kernel(kernel, config, arch, dump_dir, *tensors, scalars=(cutlass.Int32(0),), after=tail)
    if isinstance(config, ZeroRowsConfig):
        from flashcute.kernels.common.dtypes import CUTLASS_DTYPES
        from flashcute.kernels.common.zero_rows import ZeroRowsOutsideSequences

        dtype = CUTLASS_DTYPES[config.dtype]
        rows, batch = cute.sym_int(), cute.sym_int()
        widths = (fake_rows(dtype, (rows, cute.sym_int(divisibility=8))) for _ in "kv")  # whole 16-byte vectors
        tensors = (*widths, fake_int32((cute.sym_int(),)), fake_int32((batch,)))
        return compile_kernel(ZeroRowsOutsideSequences(config), config, arch, dump_dir, *tensors, scalars=())
    p = SymbolicProblem(config)
    if isinstance(config, BwdPreConfig):
        from flashcute.kernels.common.bwd_pre import FlashAttentionBackwardPreprocess

        dq_accum = p.q_like(cutlass.Float32) if config.clear_dq_accum else None
        padded_rows = fake_stats((p.batch, p.nheads, cute.sym_int()))  # D's rows: seqlen_q, or whole Q tiles
        lse = p.row_stats() if config.lse_log2 or config.sink else None
        tensors = (p.q_like(), p.q_like(), padded_rows, dq_accum, lse, padded_rows if config.lse_log2 else None)
        after = [p.row_stats() if config.dlse else None, *((p.head_vector(), p.row_stats()) if config.sink else ())]
        while after and after[-1] is None:  # (the launch passes None there)
            after.pop()
        # the Hopper backward's preprocess (LSE * log2(e) too) lets that kernel start while it ends
        kernel = FlashAttentionBackwardPreprocess(config, early_next=config.lse_log2 and arch == "sm_90a")
        return compile_kernel(kernel, config, arch, dump_dir, *tensors, scalars=(), after=tuple(after))
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
