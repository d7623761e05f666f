"""flashcute: FlashAttention for PyTorch, with GPU kernels written in Python through NVIDIA's CuTe DSL."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("flashcute")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from flashcute.interface import available_kernels, flash_attn_func

__all__ = ["__version__", "available_kernels", "flash_attn_func"]
_API = {"available_kernels", "flash_attn_func"}


def __getattr__(name: str) -> Any:
    """The API is imported on first use, so that `import flashcute` (and `flashcute --help`) does not load torch."""
    if name in _API:
        from flashcute import interface

        value = globals()[name] = getattr(interface, name)  # later lookups find it without this call
        return value
    raise AttributeError(f"module 'flashcute' has no attribute {name!r}")
