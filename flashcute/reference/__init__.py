"""CPU references: `attention_ref` (float64, the specification), `attention_same_precision` (the error budget's
baseline) and `tiled_attention` (the kernel's block algorithm)."""

from flashcute.reference.naive import attention_ref, attention_same_precision, visibility_mask
from flashcute.reference.tiled import BlockTrace, InexactError, RoundTrace, TiledResult, tiled_attention

__all__ = [
    "BlockTrace",
    "InexactError",
    "RoundTrace",
    "TiledResult",
    "attention_ref",
    "attention_same_precision",
    "tiled_attention",
    "visibility_mask",
]
