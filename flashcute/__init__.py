"""flashcute: FlashAttention for PyTorch, with GPU kernels written in Python through NVIDIA's CuTe DSL."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("flashcute")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
