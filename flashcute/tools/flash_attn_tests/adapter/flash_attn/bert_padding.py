"""``flash_attn.bert_padding``: flashcute's pad_input and unpad_input keep flash-attention 2's signatures and
return tuples."""

from flashcute.padding import pad_input, unpad_input

__all__ = ["pad_input", "unpad_input"]
