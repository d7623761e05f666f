"""A stand-in ``flash_attn`` package: flash-attention 2's Python API on top of flashcute, for running flash-attention
2's own tests against flashcute (`flashcute flash-attn-tests`). Only that command puts it on ``sys.path``."""

from flash_attn.flash_attn_interface import (  # noqa: F401 (the names flash-attention 2 exports)
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)
