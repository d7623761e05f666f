"""Hopper (sm_90a) kernels: TMA, wgmma, warp specialization."""
