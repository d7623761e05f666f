"""The benchmark suite: flashcute's kernels timed against PyTorch SDPA, FlexAttention and flash-attn-4.

Run it as `flashcute bench` or `python -m flashcute.bench`; `--help` lists the flags. Nothing here touches a GPU
at import time, so the package imports (and its tests run) on a machine without one.
"""
