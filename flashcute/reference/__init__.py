"""CPU references: `attention_ref` (float64, the specification; `attention_varlen_ref` for packed batches,
`attention_kvcache_ref` for flash_attn_with_kvcache), `attention_same_precision` (the error budget's baseline) and
`tiled_attention` (the kernel's block algorithm)."""

from flashcute.reference.kvcache import attention_kvcache_ref
from flashcute.reference.naive import attention_ref, attention_same_precision, attention_varlen_ref, visibility_mask
from flashcute.reference.tiled import BlockTrace, InexactError, RoundTrace, TiledResult, tiled_attention

__all__ = [
    "BlockTrace",
    "InexactError",
    "RoundTrace",
    "TiledResult",
    "attention_kvcache_ref",
    "attention_ref",
    "attention_same_precision",
    "attention_varlen_ref",
    "tiled_attention",
    "visibility_mask",
]
