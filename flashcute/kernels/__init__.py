"""CuTe DSL kernels: sm80/ (mma.sync, cp.async) and the per-step helpers they share in common/."""
