"""flash-attention 2's entry points (``flash_attn.flash_attn_interface``) with their signatures, each handing its
arguments by name to flashcute's entry of the same name, which names them alike.

Where the two differ: flash-attention 2 takes ``dropout_p`` fourth (flashcute has no dropout: only 0 maps, anything
else raises NotImplementedError) and ``return_attn_probs``, which returns (out, softmax_lse, S_dmask); S_dmask is
None here (it only ever holds dropout's pattern). ``_get_block_size_n`` serves only the tests' dropout helpers.
"""

from __future__ import annotations

import flashcute

USE_TRITON_ROCM = False


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    raise NotImplementedError("flashcute has no dropout, whose S_dmask this block size reads")


def _call(entry, dropout_p, return_attn_probs, **arguments):
    """``entry`` with ``arguments`` by name, flash-attention 2's way: no dropout, and the LSE in a triple when asked."""
    if dropout_p != 0:
        raise NotImplementedError(f"flashcute has no dropout: dropout_p must be 0, got {dropout_p!r}")
    result = entry(**arguments, return_lse=bool(return_attn_probs))
    return (*result, None) if return_attn_probs else result


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    return _call(flashcute.flash_attn_qkvpacked_func, **locals())


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    return _call(flashcute.flash_attn_kvpacked_func, **locals())


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    return _call(flashcute.flash_attn_func, **locals())


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    return _call(flashcute.flash_attn_varlen_qkvpacked_func, **locals())


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    return _call(flashcute.flash_attn_varlen_kvpacked_func, **locals())


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    return _call(flashcute.flash_attn_varlen_func, **locals())


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
):
    return flashcute.flash_attn_with_kvcache(**locals())  # (the same names, return_softmax_lse among them)
