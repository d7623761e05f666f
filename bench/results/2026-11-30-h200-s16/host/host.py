"""Host microseconds a call (bench.timing.host_overhead_us, median of 5 runs of 300 calls, alternating order) on a
tiny problem (1 x 128 x 2 x 128, bf16): this tree's flashcute against the main copy (flashcute_base) and
flash-attn-4, forward alone and forward + backward with inputs that need grad."""

import json
import statistics
import sys

import flashcute_base
import torch
from flash_attn.cute import flash_attn_func as fa4

import flashcute
from flashcute.bench.timing import host_overhead_us


def first(out):
    return out[0] if isinstance(out, tuple) else out


q, k, v = (torch.randn(1, 128, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
dout = torch.randn_like(q)
cases = {
    "fwd sm90 (this tree)": lambda: flashcute.flash_attn_func(q, k, v, kernel="sm90"),
    "fwd sm90 (main)": lambda: flashcute_base.flash_attn_func(q, k, v, kernel="sm90"),
    "fwd sm80 (this tree)": lambda: flashcute.flash_attn_func(q, k, v, kernel="sm80"),
    "fwd sm80 (main)": lambda: flashcute_base.flash_attn_func(q, k, v, kernel="sm80"),
    "fwd flash-attn-4": lambda: fa4(q, k, v),
    "fwd+bwd sm90 (this tree)": lambda: flashcute.flash_attn_func(qg, kg, vg, kernel="sm90").backward(dout),
    "fwd+bwd sm90 (main)": lambda: flashcute_base.flash_attn_func(qg, kg, vg, kernel="sm90").backward(dout),
    "fwd+bwd flash-attn-4": lambda: first(fa4(qg, kg, vg)).backward(dout),
}
readings = {name: [] for name in cases}
for r in range(5):
    for name in list(cases) if r % 2 == 0 else list(cases)[::-1]:
        readings[name].append(host_overhead_us(cases[name], calls=300))
result = {name: round(statistics.median(x), 1) for name, x in readings.items()}
for name, us in result.items():
    print(f"{name:28} {us:7.1f} us a call   (runs: {', '.join(f'{x:.0f}' for x in readings[name])})")
with open(sys.argv[1], "w") as f:
    json.dump(readings, f, indent=1)
