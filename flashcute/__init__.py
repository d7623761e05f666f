"""flashcute: FlashAttention for PyTorch, with GPU kernels written in Python through NVIDIA's CuTe DSL."""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("flashcute")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from flashcute.interface import available_kernels, flash_attn_func, flash_attn_varlen_func
    from flashcute.kvcache import flash_attn_with_kvcache
    from flashcute.packed_qkv import (
        flash_attn_kvpacked_func,
        flash_attn_qkvpacked_func,
        flash_attn_varlen_kvpacked_func,
        flash_attn_varlen_qkvpacked_func,
    )
    from flashcute.padding import pad_input, unpad_input

__all__ = [
    "__version__",
    "available_kernels",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "pad_input",
    "unpad_input",
]
_API = set(__all__) - {"__version__"}  # imported on first use (__getattr__)
# The modules of the names in _API that do not come from flashcute.interface
_MODULES = {
    "flash_attn_with_kvcache": "flashcute.kvcache",
    "flash_attn_kvpacked_func": "flashcute.packed_qkv",
    "flash_attn_qkvpacked_func": "flashcute.packed_qkv",
    "flash_attn_varlen_kvpacked_func": "flashcute.packed_qkv",
    "flash_attn_varlen_qkvpacked_func": "flashcute.packed_qkv",
    "pad_input": "flashcute.padding",
    "unpad_input": "flashcute.padding",
}


def __getattr__(name: str) -> Any:
    """The API is imported on first use, so that `import flashcute` (and `flashcute --help`) does not load torch."""
    if name in _API:
        module = import_module(_MODULES.get(name, "flashcute.interface"))
        value = globals()[name] = getattr(module, name)  # later lookups find it without this call
        return value
    raise AttributeError(f"module 'flashcute' has no attribute {name!r}")
