"""flashcute as an attention implementation of Hugging Face transformers models.

    from flashcute.integrations.transformers import register

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=register(), dtype=torch.bfloat16)

The attention function takes transformers' arguments the way its flash-attention path does
(``modeling_flash_attention_utils._flash_attention_forward``), in the same order of precedence:

- a 2-D padding mask (batch, seqlen_k), zero at padding: the batch is unpadded, attended with
  ``flash_attn_varlen_func`` and padded back (padding rows are 0). The queries are the last seqlen_q positions of
  the mask, as in generation with a cache;
- the packed-sequence kwargs ``cu_seq_lens_q``, ``cu_seq_lens_k``, ``max_length_q``, ``max_length_k`` (e.g. from
  transformers' ``DataCollatorWithFlattening``): ``flash_attn_varlen_func`` over the flattened batch;
- ``position_ids`` of a batch of one that restart (sequences packed without padding): each restart begins a
  sequence, and ``flash_attn_varlen_func`` attends within each;
- otherwise ``flash_attn_func`` over the dense batch.

Attention sinks (``s_aux``, one logit per query head, as gpt-oss passes them) become ``learnable_sink``, with its
gradient. Causality comes from ``module.is_causal`` unless the caller passes ``is_causal``. A sliding window of w
tokens is window_size (w - 1, w - 1), which causal attention cuts to (w - 1, 0): the key itself and w - 1 before it, as
transformers' masks and its flash path have it. The backward is deterministic when the caller passes
``deterministic=True`` or, without it, under FLASH_ATTENTION_DETERMINISTIC=1 (as for flash_attn).

The mask function registered beside the attention function is transformers' own for flash attention, so the model
hands over the 2-D padding mask, or None when nothing is padded, and never a 4-D mask (unless the caller built one).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

import flashcute
from flashcute.padding import pad_input, unpad_input

DEFAULT_NAME = "cute_attention"
PACKED_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def register(name: str = DEFAULT_NAME) -> str:
    """Register flashcute's attention (and the mask format it takes) with transformers under ``name``, for
    ``attn_implementation=name``; returns the name.

    A name containing "flash" is refused: transformers takes such a name for one of the flash_attn packages or a
    kernel from its hub, and fails when it loads the model trying to import one.
    """
    if "flash" in name:
        raise ValueError(
            f"name must not contain 'flash', got {name!r}: transformers would take it for a flash_attn package "
            "or hub kernel and try to load that"
        )
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    deterministic: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention function: query (batch, nheads, seqlen_q, head_dim), key and value (batch, nheads_k,
    seqlen_k, head_dim); returns (attn_output (batch, seqlen_q, nheads, head_dim), None), no attention weights."""
    if dropout and module.training:
        raise ValueError(f"flashcute has no attention dropout: dropout must be 0 in training, got dropout={dropout}")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            f"flashcute takes a 2-D padding attention_mask (batch, seqlen_k) or None, got shape "
            f"{tuple(attention_mask.shape)}: a 4-D mask (a custom mask pattern) needs attn_implementation='sdpa' "
            "or 'eager'"
        )
    is_causal = module.is_causal if is_causal is None else is_causal
    if deterministic is None:  # transformers' flash path reads this switch too; enable_full_determinism() sets it
        deterministic = os.environ.get("FLASH_ATTENTION_DETERMINISTIC", "0") == "1"
    q, k, v = _to_flash_dtype(module, *(x.transpose(1, 2) for x in (query, key, value)))
    options = {
        "softmax_scale": None if scaling is None else float(scaling),
        # one query row sees every key under bottom-right alignment: causal or not, the same mask
        "causal": bool(is_causal) and q.shape[1] > 1,
        "window_size": (-1, -1) if sliding_window is None else (sliding_window - 1, sliding_window - 1),
        "softcap": 0.0 if softcap is None else float(softcap),
        "deterministic": deterministic,
    }
    if kwargs.get("s_aux") is not None:  # attention sinks: a logit per query head in every row's denominator
        options["learnable_sink"] = kwargs["s_aux"]
    if attention_mask is not None:
        return _padded_attention(q, k, v, attention_mask, options), None
    if all(kwargs.get(name) is not None for name in PACKED_KWARGS):
        packed = [kwargs[name] for name in PACKED_KWARGS]
        return _packed_attention(q, k, v, *packed, options), None
    restarts = _sequences_from_positions(kwargs.get("position_ids"), q.shape[0])
    if restarts is not None:
        cu_seqlens, max_seqlen = restarts
        return _packed_attention(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, options), None
    return flashcute.flash_attn_func(q, k, v, **options), None


def _to_flash_dtype(module: torch.nn.Module, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """float32 inputs (from layer norms kept in float32, as PEFT does) cast to the autocast dtype, or else to the
    half-precision dtype of the module's linear weights, as transformers' flash path does; others unchanged."""
    if tensors[0].dtype != torch.float32:
        return tensors
    device_type = tensors[0].device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
    else:
        dtype = next((m.weight.dtype for m in module.modules() if isinstance(m, torch.nn.Linear)), torch.float32)
    if dtype not in (torch.float16, torch.bfloat16):
        return tensors
    return tuple(x.to(dtype) for x in tensors)


def _padded_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask: torch.Tensor, options: dict
) -> torch.Tensor:
    """Attention of a padded batch (q, k, v as flash_attn_func takes them) by unpadding it."""
    batch, seqlen_q = q.shape[:2]
    seqlen_k = attention_mask.shape[1]
    k, v = k[:, :seqlen_k], v[:, :seqlen_k]  # a static cache holds more key slots than the mask covers
    k_packed, indices_k, cu_seqlens_k, max_seqlen_k, _ = unpad_input(k, attention_mask)
    v_packed = v.flatten(0, 1).index_select(0, indices_k)
    if seqlen_q == seqlen_k:
        q_packed = q.flatten(0, 1).index_select(0, indices_k)
        indices_q, cu_seqlens_q, max_seqlen_q = indices_k, cu_seqlens_k, max_seqlen_k
    else:
        q_packed, indices_q, cu_seqlens_q, max_seqlen_q, _ = unpad_input(q, attention_mask[:, -seqlen_q:])
    out = flashcute.flash_attn_varlen_func(
        q_packed, k_packed, v_packed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options
    )
    return pad_input(out, indices_q, batch, seqlen_q)


def _packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | torch.Tensor,
    max_seqlen_k: int | torch.Tensor,
    options: dict,
) -> torch.Tensor:
    """Attention within the sequences that the cumulative lengths mark along the flattened (batch * seqlen) axis."""
    out = flashcute.flash_attn_varlen_func(
        q.flatten(0, 1),
        k.flatten(0, 1),
        v.flatten(0, 1),
        cu_seqlens_q.to(torch.int32),
        cu_seqlens_k.to(torch.int32),
        int(max_seqlen_q),
        int(max_seqlen_k),
        **options,
    )
    return out.view(q.shape[0], -1, *out.shape[1:])


def _sequences_from_positions(position_ids: torch.Tensor | None, batch: int) -> tuple[torch.Tensor, int] | None:
    """(cu_seqlens int32, max_seqlen) of the sequences packed into a batch of one, where each sequence starts
    at the smallest position id (0, or the offset of RoBERTa-like models); None where position_ids show one
    sequence (or none at all, or a batch of several), as transformers' ``_is_packed_sequence`` decides."""
    if position_ids is None or batch != 1 or position_ids.shape[-1] == 1:
        return None
    positions = position_ids.reshape(-1)
    first = positions.min()
    if torch.equal(positions, torch.arange(positions.numel(), device=positions.device, dtype=positions.dtype) + first):
        return None
    starts = (positions == first).nonzero().flatten()
    cu_seqlens = torch.cat((starts, starts.new_tensor([positions.numel()]))).to(torch.int32)
    return cu_seqlens, int(cu_seqlens.diff().max())
