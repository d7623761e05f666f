"""One-process A/B of the backward (bf16): flashcute (this tree) against flashcute_base (DIR, from
scripts/ab_inprocess.py prepare), rounds alternating.  python -P ab_bwd.py DIR"""

import itertools
import statistics
import sys
from functools import partial

import torch
import triton.testing

sys.path.insert(0, sys.argv[1])
import flashcute_base

import flashcute
from flashcute.bench.flops import attention_flops

ROUNDS = 5


def main() -> None:
    ratios = []
    for d, causal, seqlen in itertools.product((64, 128, 256), (False, True), (4096, 16384)):
        batch, nheads = 16384 // seqlen, 2048 // d
        q, k, v = (
            torch.randn(batch, seqlen, nheads, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in "qkv"
        )
        dout = torch.randn_like(q)
        calls = {}
        for name, module in (("new", flashcute), ("base", flashcute_base)):
            out = module.flash_attn_func(q, k, v, causal=causal)
            calls[name] = partial(torch.autograd.grad, out, (q, k, v), dout, retain_graph=True)
        for call in calls.values():
            call()
        times: dict[str, list[float]] = {name: [] for name in calls}
        for round_idx in range(ROUNDS):
            for name in ("new", "base") if round_idx % 2 == 0 else ("base", "new"):
                times[name].append(triton.testing.do_bench(calls[name], warmup=10, rep=40))
        flops = attention_flops(batch, nheads, seqlen, seqlen, d, causal, "bwd")
        tflops = {name: flops / statistics.median(ms) / 1e9 for name, ms in times.items()}
        ratios.append(tflops["new"] / tflops["base"])
        mask = "causal" if causal else "nc"
        print(f"bf16 D{d:<3} {mask:6} {seqlen:>5}  new {tflops['new']:5.0f}  base {tflops['base']:5.0f}  ", end="")
        print(f"new/base {ratios[-1]:.3f}", flush=True)
    print(f"new/base geometric mean {statistics.geometric_mean(ratios):.4f}")


if __name__ == "__main__":
    main()
