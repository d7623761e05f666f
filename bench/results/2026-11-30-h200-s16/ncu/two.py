"""ours (the heuristic's config) and flash-attn-4, D=128 bf16 non-causal 16k, B=1, H=16, one launch each inside nvtx
ranges 'ours' and 'fa4' (for ncu --nvtx --nvtx-include ours/ or fa4/)."""

from functools import partial

import torch
from flash_attn.cute import flash_attn_func as fa4

import flashcute

q, k, v = (torch.randn(1, 16384, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
runs = {"ours": partial(flashcute.flash_attn_func, q, k, v, kernel="sm90"), "fa4": partial(fa4, q, k, v)}
for _ in range(3):
    for fn in runs.values():
        fn()
torch.cuda.synchronize()
for name, fn in runs.items():
    with torch.cuda.nvtx.range(name):
        fn()
torch.cuda.synchronize()
