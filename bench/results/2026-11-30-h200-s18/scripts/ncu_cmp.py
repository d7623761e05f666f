import sys

import torch
from flash_attn.cute import flash_attn_func as fa4

import flashcute

d, causal, L = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
dt = torch.float16 if len(sys.argv) > 4 and sys.argv[4] == "fp16" else torch.bfloat16
B, H = 16384 // L, 2048 // d
q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=dt) for _ in range(3))
for _ in range(3):
    flashcute.flash_attn_func(q, k, v, causal=causal, kernel="sm90")
    fa4(q, k, v, causal=causal)
torch.cuda.synchronize()
with torch.cuda.nvtx.range("ours"):
    flashcute.flash_attn_func(q, k, v, causal=causal, kernel="sm90")
with torch.cuda.nvtx.range("fa4"):
    fa4(q, k, v, causal=causal)
torch.cuda.synchronize()
