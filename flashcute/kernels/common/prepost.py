"""The kernels every family runs around its own (the backward's preprocess and postprocess, split-KV attention's
combine, a decoding step's writes into its cache, a packed backward's rows outside every sequence zeroed): their
compile functions and launches."""

from __future__ import annotations

import itertools

import torch

from flashcute.kernels.common.prepost_build import compile
from flashcute.kernels.common.prepost_config import (
    AppendConfig,
    BwdPostConfig,
    BwdPreConfig,
    CombineConfig,
    ZeroRowsConfig,
    append_config,
    bwd_post_config,
    bwd_pre_config,
    combine_config,
    zero_rows_config,
)
from flashcute.kernels.launch import compiled, dtype_name, run_on_device


def variants(
    dtypes, buckets, exact_only: bool
) -> list[BwdPreConfig | BwdPostConfig | CombineConfig | AppendConfig | ZeroRowsConfig]:
    """The preprocess (zeroing dQaccum or not, with the LSE a tiled backward reads or not), the postprocess and the
    combine, per dtype x head-dim bucket (x exact/padded head dim; at the exact head dims also the preprocess with
    the LSE's gradient, the sinks' or both, and the combine with sinks); they have no mask. Then a decoding step's
    writes per dtype (any head dim): the key counts alone, and the keys into each kind of cache, with the counts
    or without; and the counts of a masked tail's cache by batch, with the keys and without. Last, per dtype, a packed
    backward's zeroing of the rows outside every sequence (any head dim)."""
    configs = []
    for dtype in dtypes:
        for bucket in buckets:
            for head_dim in (bucket,) if exact_only else (bucket, bucket - 8):
                configs += [bwd_pre_config(head_dim, dtype), bwd_pre_config(head_dim, dtype, clear_dq_accum=False)]
                configs.append(bwd_pre_config(head_dim, dtype, lse_log2=True))
                configs += [bwd_post_config(head_dim, dtype), combine_config(head_dim, dtype)]
            configs.append(combine_config(bucket, dtype, sink=True))
            for dlse, sink in ((True, False), (False, True), (True, True)):
                scores = {"dlse": dlse, "sink": sink}
                configs += [bwd_pre_config(bucket, dtype, **scores), bwd_pre_config(bucket, dtype, False, **scores)]
                configs.append(bwd_pre_config(bucket, dtype, lse_log2=True, **scores))
    for dtype in dtypes:
        configs += [append_config(dtype, keys=False, counts=True), append_config(dtype, False, counts=True, tail=True)]
        for slots, counts in itertools.product(({}, {"batch_index": True}, {"pages": True}), (False, True)):
            configs.append(append_config(dtype, keys=True, counts=counts, **slots))
        configs.append(append_config(dtype, keys=True, counts=True, tail=True))
    configs += [zero_rows_config(dtype) for dtype in dtypes]
    return configs


def preprocess(
    dout: torch.Tensor,
    out: torch.Tensor,
    delta: torch.Tensor,
    dq_accum: torch.Tensor | None,
    lse: torch.Tensor | None = None,
    lse_log2: torch.Tensor | None = None,
    dlse: torch.Tensor | None = None,
    sink: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """``delta`` (batch, nheads, seqlen_q) float32, unit last stride, gets D = rowsum(dO * O) summed in float32, and
    ``dq_accum`` (float32, shaped like ``out``), when given, is zeroed in the same launch for the dQ atomics. With
    ``lse_log2`` (shaped like ``delta``), it gets LSE * log2(e) of ``lse`` (batch, nheads, seqlen_q), +inf where
    LSE = -inf, and both may have more rows than seqlen_q: there D = 0 and LSE * log2(e) = +inf.

    ``dlse`` (batch, nheads, seqlen_q): the gradient of the forward's LSE, where a loss uses it. LSE_i = log sum_j
    exp(s_ij) gives dLSE_i / ds_ij = P_ij, so the score gradient P * (dP - D) + dlse * P is the kernels' with D
    - dlse in place of D: one subtraction per row in this launch, no kernel of its own.

    ``sink`` (nheads,) float32, the learnable sinks (with ``lse``): returns each row's share of their gradient,
    (batch, nheads, seqlen_q) float32, which sink_grad sums (the sink's probability in row i is p_i = exp(sink -
    LSE_i), and O_i depends on the sink only through the normalization, so dsink = -sum_i p_i D_i, with D less
    dlse alike); None without sinks."""
    if dlse is not None and (dlse.dtype != torch.float32 or dlse.stride(-1) != 1):
        dlse = dlse.float().contiguous()  # (autograd's: any layout, expanded)
    sink_rows = None if sink is None else lse.new_empty(lse.shape)
    flags = {"lse_log2": lse_log2 is not None, "dlse": dlse is not None, "sink": sink is not None}
    config = bwd_pre_config(out.shape[-1], dtype_name(out), dq_accum is not None, **flags)
    tensors = (out, dout, delta, dq_accum, lse if lse_log2 is not None or sink is not None else None, lse_log2)
    run_on_device(out.device, compiled(config, out.device, compile), *tensors, dlse, sink, sink_rows)
    return sink_rows


def sink_grad(sink_rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The learnable sinks' gradient (nheads,) in ``dtype`` from preprocess's rows: their sum over batch and rows,
    in a fixed order (deterministic)."""
    return sink_rows.sum(dim=(0, 2)).to(dtype)


def zero_rows_outside_sequences(
    dk: torch.Tensor, dv: torch.Tensor, cu_seqlens_k: torch.Tensor, seqused_k: torch.Tensor
) -> None:
    """Zero the rows of dk (total_k, nheads_k, head_dim) and dv (total_k, nheads_k, head_dim_v), contiguous, head
    dims multiples of 8, that no sequence of a packed batch covers: row r is sequence b's where cu_seqlens_k[b] <=
    r < cu_seqlens_k[b] + min(cu_seqlens_k[b + 1] - cu_seqlens_k[b], seqused_k[b]) (int32 (batch + 1,) and
    (batch,); seqused_k may be cu_seqlens_k[1:]), the rows a packed backward's kernels write; the others are
    left as they are. The queries' rows alike: dq as both tensors, with cu_seqlens_q and seqused_q."""
    config = zero_rows_config(dtype_name(dk))
    rows = dk.shape[0]
    run_on_device(
        dk.device, compiled(config, dk.device, compile), dk.view(rows, -1), dv.view(rows, -1), cu_seqlens_k, seqused_k
    )


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


def append(
    lengths: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_batch_idx: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    counts: torch.Tensor | None = None,
    chunk: int = 0,
    tail: tuple[torch.Tensor, int, int] | None = None,
) -> None:
    """A decoding step's writes (append.KvCacheAppend), one launch: k, v (batch, seqlen_new, nheads_k, head dims
    multiples of 8), when given, into k_cache and v_cache at positions lengths[b] .. lengths[b] + seqlen_new - 1 of
    sequence b (lengths int32 (batch,)): cache row cache_batch_idx[b] (int32; default b) of a (batch_cache,
    seqlen_cache, nheads_k, head dim) cache, or with block_table (int32 (batch, max_pages)) page block_table[b, p //
    page_size] at row p % page_size of a (pages, page_size, nheads_k, head dim) cache; slots outside the cache are
    not written. With ``counts``, int32 (batch, splits), rows contiguous: counts[b, s] = max(lengths[b] +
    seqlen_new - s * chunk, 0). With ``tail`` (rows, tail_keys, seq_rows) as well, for a cache by batch: sequence
    b's keys end at end = lengths[b] + seqlen_new kept inside [0, seq_rows], the counts leave out its last in_tail =
    min(end, tail_keys), and rows (int32 (2, batch + 1)) gets rows[0, b] = b * seq_rows + end - in_tail, rows[0,
    batch] = batch * seq_rows and rows[1, b] = in_tail (splitkv.SplitPlan.appended_tail). The caches' rows must be
    16-byte aligned (the attention's need as well); new keys and values whose rows are not are copied first."""
    if k is not None:
        k, v = _vectors(k), _vectors(v)
    keys = k is not None
    slots = {"pages": keys and block_table is not None, "batch_index": keys and cache_batch_idx is not None}
    config = append_config(dtype_name(k_cache), keys, counts=counts is not None, tail=tail is not None, **slots)
    if not keys:
        k_cache = v_cache = None
    tensors = (lengths, k, v, k_cache, v_cache, cache_batch_idx if slots["batch_index"] else None)
    tensors += (block_table if slots["pages"] else None, counts)
    run_on_device(lengths.device, compiled(config, lengths.device, compile), *tensors, chunk, *(tail or NO_TAIL))


# The tail arguments (rows, tail_keys, seq_rows) of an append without a masked tail
NO_TAIL = (None, 0, 0)


def _vectors(t: torch.Tensor) -> torch.Tensor:
    """``t`` with rows of whole 16-byte vectors (a unit last stride, other strides multiples of 8 elements, a 16-byte
    aligned start), copied into such a tensor where it is not."""
    if t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in t.stride()[:-1]):
        return t
    return t.clone(memory_format=torch.contiguous_format)
