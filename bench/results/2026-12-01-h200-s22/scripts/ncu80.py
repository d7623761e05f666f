"""Run the sm80 forward three times, then SDPA flash twice (for ncu): argv head_dim causal(0/1) seqlen dtype."""

import sys

import torch
import torch.nn.functional as F

from flashcute import flash_attn_func

d, causal, L, dtype = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3]), getattr(torch, sys.argv[4])
B, H = 16384 // L, 2048 // d
q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=dtype) for _ in range(3))
for _ in range(3):
    flash_attn_func(q, k, v, causal=causal, kernel="sm80")
qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
    for _ in range(2):
        F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
torch.cuda.synchronize()
