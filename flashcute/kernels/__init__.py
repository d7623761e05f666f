"""CuTe DSL kernels: one folder per kernel family, what they share in common/, and registry.py, which maps a GPU to
the families that run on it (docs/design.md)."""
