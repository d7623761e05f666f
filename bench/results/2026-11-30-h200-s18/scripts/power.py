"""Power, SM clock and TFLOP/s of ours (flashcute, this tree) against flash-attn-4 in sustained launch loops.
usage: power.py D L causal dtype [seconds] ; alternates ours, fa4, ours, fa4."""

import statistics
import subprocess
import sys
import time

import torch
from flash_attn.cute import flash_attn_func as fa4

import flashcute

d, L, causal, dtype = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
secs = float(sys.argv[5]) if len(sys.argv) > 5 else 3.0
B, H = 16384 // L, 2048 // d

dt = getattr(torch, dtype)
q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=dt) for _ in "qkv")
fns = {"ours": lambda: flashcute.flash_attn_func(q, k, v, causal=causal), "fa4": lambda: fa4(q, k, v, causal=causal)}
for f in fns.values():
    f()
    torch.cuda.synchronize()
helpq = subprocess.run(["nvidia-smi", "--help-query-gpu"], capture_output=True, text=True).stdout
pw = "power.draw.instant" if "power.draw.instant" in helpq else "power.draw"
reason = "clocks_event_reasons.active" if "clocks_event_reasons.active" in helpq else "clocks_throttle_reasons.active"
fields = f"timestamp,{pw},clocks.sm,temperature.gpu,{reason}"
flops = 4 * B * H * L * L * d / (2 if causal else 1)
out = []
for who in ["ours", "fa4", "ours", "fa4"]:
    f = fns[who]
    for _ in range(10):
        f()
    torch.cuda.synchronize()
    smi = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-lms", "25"],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.3)
    t_end = time.time() + secs
    evs = []
    while time.time() < t_end:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        f()
        e1.record()
        evs.append((e0, e1))
        if len(evs) % 20 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    smi.terminate()
    text = smi.communicate()[0]
    ms = [a.elapsed_time(b) for a, b in evs]
    rows = [r.split(", ") for r in text.strip().splitlines()]
    rows = rows[len(rows) // 5 :]  # skip the ramp

    def num(x):
        try:
            return float(x)
        except ValueError:
            return float("nan")

    p = [num(r[1]) for r in rows]
    c = [num(r[2]) for r in rows]
    t = [num(r[3]) for r in rows]
    reasons = sorted({r[4] for r in rows})
    ms_med = statistics.median(ms[len(ms) // 5 :])
    tf = flops / ms_med / 1e9
    pm = statistics.median(p)
    line = (
        f"{who:4} D={d} L={L} c={int(causal)} {dtype:8}: {tf:5.0f} TFLOP/s ({ms_med:.3f} ms, {len(ms)} launches), "
        f"power {pm:.0f} W, SM clock {statistics.median(c):.0f} MHz, temp {statistics.median(t):.0f} C, "
        f"{pm * ms_med / 1e3 / (flops / 1e12):.3f} J/PFLOP..., reasons {reasons}"
    )
    print(line, flush=True)
