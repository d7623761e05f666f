"""flashcute: FlashAttention for PyTorch, with GPU kernels written in Python through NVIDIA's CuTe DSL."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("flashcute")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

from flashcute.interface import available_kernels, flash_attn_func

__all__ = ["__version__", "available_kernels", "flash_attn_func"]
