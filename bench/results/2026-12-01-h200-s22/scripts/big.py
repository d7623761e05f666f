"""Past 2**31 elements: q, k, v of (B, 128, 1, 128) with B*128*128 > 2**31; forward and backward on both kernels,
checked against attention_ref on batches at the start, the middle and the end."""

import torch

import flashcute
from flashcute.reference import attention_ref

B, L, H, D = 2**31 // (128 * 128) + 8, 128, 1, 128
torch.manual_seed(0)
q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
dout = torch.randn_like(q)
idx = torch.tensor([0, 1, B // 2, B - 2, B - 1], device="cuda")
print("elements", q.numel(), "> 2**31:", q.numel() > 2**31, flush=True)
for kernel in ("sm90", "sm80"):
    for causal in (False, True):
        leaves = [t.requires_grad_(True) for t in (q, k, v)]
        out = flashcute.flash_attn_func(*leaves, kernel=kernel, causal=causal)
        dq, dk, dv = torch.autograd.grad(out, leaves, dout)
        sub = [t.detach()[idx].double().requires_grad_(True) for t in (q, k, v)]
        ref = attention_ref(*sub, causal=causal)
        rdq, rdk, rdv = torch.autograd.grad(ref, sub, dout[idx].double())
        errs = [(a[idx].double() - b).abs().max().item() for a, b in ((out, ref), (dq, rdq), (dk, rdk), (dv, rdv))]
        print(
            kernel,
            "causal" if causal else "nc",
            "max err out/dq/dk/dv",
            " ".join(f"{e:.3g}" for e in errs),
            "OK" if max(errs) < 0.05 else "FAIL",
            flush=True,
        )
        del out, dq, dk, dv
        for t in (q, k, v):
            t.requires_grad_(False)
