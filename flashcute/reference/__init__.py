"""CPU references: `attention_ref` (float64, the specification) and `tiled_attention` (the kernel's block algorithm)."""

from flashcute.reference.naive import attention_ref, visibility_mask
from flashcute.reference.tiled import BlockTrace, InexactError, RoundTrace, TiledResult, tiled_attention

__all__ = [
    "BlockTrace",
    "InexactError",
    "RoundTrace",
    "TiledResult",
    "attention_ref",
    "tiled_attention",
    "visibility_mask",
]
