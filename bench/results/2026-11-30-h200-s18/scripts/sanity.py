import time

import torch

import flashcute

for d, L, dt in [
    (128, 4096, torch.bfloat16),
    (128, 1000, torch.float16),
    (64, 333, torch.bfloat16),
    (256, 2048, torch.float16),
    (128, 16384, torch.bfloat16),
]:
    B, H = max(1, 16384 // L), 2048 // d
    q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=dt) for _ in "qkv")
    t = time.time()
    o = flashcute.flash_attn_func(q, k, v)
    torch.cuda.synchronize()
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    ).transpose(1, 2)
    print(d, L, dt, "max err", (o.float() - ref.float()).abs().max().item(), f"{time.time() - t:.1f}s", flush=True)
