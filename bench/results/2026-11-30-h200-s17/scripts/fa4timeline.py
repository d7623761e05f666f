# ruff: noqa: E402  (a measurement script, as it ran)
"""Step timeline of a patched flash-attn-4 sm90 forward (block (0,0,0)); same stamps/printing as step_timeline.py."""

import argparse
import itertools
import os
import statistics
import subprocess
import sys

import torch

p = argparse.ArgumentParser()
p.add_argument("--headdim", type=int, default=128)
p.add_argument("--seqlen", type=int, default=16384)
p.add_argument("--causal", action="store_true")
p.add_argument("--dtype", default="bfloat16")
p.add_argument("--steps", type=int, default=120)
p.add_argument("--window", type=int, default=8)
a = p.parse_args()
STAMPS = 6
NAMES = ("start", "turn", "issued", "s_ready", "after_pv_wait", "end")
buf = torch.zeros(1 + 2 * a.steps * STAMPS, dtype=torch.int32, device="cuda")
os.environ["FA4_TRACE_PTR"] = str(buf.data_ptr())
os.environ["FA4_TRACE_STEPS"] = str(a.steps)
here = os.path.dirname(os.path.abspath(__file__))
subprocess.run([sys.executable, f"{here}/fa4patch.py", "/tmp/flashcute-site", "/tmp/fa4t"], check=True)
sys.path.insert(0, "/tmp/fa4t")
from flash_attn.cute import flash_attn_func

assert flash_attn_func.__module__.startswith("flash_attn"), flash_attn_func
import flash_attn

print("flash_attn from", flash_attn.__file__)
d, L = a.headdim, a.seqlen
B, H = 16384 // L, 2048 // d
dt = getattr(torch, a.dtype)
q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=dt) for _ in "qkv")
for _ in range(3):
    buf.zero_()
    flash_attn_func(q, k, v, causal=a.causal)
torch.cuda.synchronize()
st = buf[1:].view(2, a.steps, STAMPS).cpu().long()
st = (st - st[0, 0, 0] + (1 << 31)) % (1 << 32) - (1 << 31)
st -= st[:, :, 0].min()
print(f"FA4 D={d} L={L} {'causal' if a.causal else 'non-causal'} {a.dtype}, block (0,0,0), {a.steps} steps")
names = [f"{x}->{y}" for x, y in itertools.pairwise(NAMES)] + ["end->next start"]
for wg in range(2):
    s = st[wg]
    iv = [s[:, i + 1] - s[:, i] for i in range(STAMPS - 1)] + [s[1:, 0] - s[:-1, STAMPS - 1]]
    cells = ", ".join(f"{n} {statistics.median(x.tolist()):.0f}" for n, x in zip(names, iv, strict=False))
    print(
        f"warpgroup {wg}: median cycles {cells}; step period {statistics.median((s[1:, 0] - s[:-1, 0]).tolist()):.0f}"
    )
mid = a.steps // 2
ev = sorted(
    (int(st[wg, s_, i]), wg, s_, NAMES[i])
    for wg in range(2)
    for s_ in range(mid, mid + a.window)
    for i in range(STAMPS)
)
t0 = ev[0][0]
print(f"\nsteps {mid}..{mid + a.window - 1} on one clock:")
for t, wg, s_, n in ev:
    print(f"{t - t0:8d}  wg{wg} step {s_:4d} {n}")
torch.save(st, os.environ.get("OUT", "/tmp") + f"/fa4-tl-{d}-{int(a.causal)}-{a.dtype}.pt")
