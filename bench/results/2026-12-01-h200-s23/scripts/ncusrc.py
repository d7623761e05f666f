"""Three launches of a forward (for ncu): argv which(sm80|sm90|fa4) head_dim causal(0/1) seqlen dtype."""

import sys

import torch

which, d, causal, L = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
dtype = getattr(torch, sys.argv[5])
B, H = 16384 // L, 2048 // d
q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=dtype) for _ in range(3))
if which == "fa4":
    from flash_attn.cute import flash_attn_func as fa4

    def run():
        fa4(q, k, v, causal=causal)
else:
    from flashcute import flash_attn_func

    def run():
        flash_attn_func(q, k, v, causal=causal, kernel=which)


for _ in range(3):
    run()
torch.cuda.synchronize()
