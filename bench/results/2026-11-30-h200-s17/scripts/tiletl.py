# ruff: noqa: E402, E501, SIM115  (a measurement script, as it ran)
"""Per-tile timeline of one forward launch: `tiletl.py ours|fa4 D L causal dtype`. Records (tiletrace_rt):
[smid, clock_start, clock_end, ns_start, ns_end, clock_entry, ns_entry, valid] a tile (ours: tile index; fa4: CTA)."""

import os
import statistics
import subprocess
import sys
import tempfile

import torch

who, d, L, causal, dtype = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
B, H = 16384 // L, 2048 // d
buf = torch.zeros(1 << 22, dtype=torch.int32, device="cuda")
os.environ["TILE_TRACE_PTR"] = str(buf.data_ptr())
here = os.path.dirname(os.path.abspath(__file__))
if who == "fa4":
    subprocess.run(
        [sys.executable, f"{here}/fa4tilepatch.py", "/tmp/flashcute-site", "/tmp/fa4tt"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    sys.path.insert(0, "/tmp/fa4tt")
    import flash_attn.cute.flash_fwd_sm90 as _m
    from flash_attn.cute import flash_attn_func as f

    assert _m.__file__.startswith("/tmp/fa4tt"), _m.__file__

    def call(q, k, v):
        return f(q, k, v, causal=causal)
else:
    os.environ["FLASHCUTE_CACHE_DIR"] = tempfile.mkdtemp()
    tree = os.environ.get("TT_TREE", f"{here}/tt")
    sys.path.insert(0, tree)
    import flashcute

    assert flashcute.__file__.startswith(tree), flashcute.__file__

    def call(q, k, v):
        return flashcute.flash_attn_func(q, k, v, causal=causal)


dt = getattr(torch, dtype)
q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=dt) for _ in "qkv")
call(q, k, v)  # compiles
import fcntl

lock = open(os.environ["TT_LOCK"], "w") if os.environ.get("TT_LOCK") else None
if lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
for _ in range(2):
    call(q, k, v)
ms = []
for _ in range(5):
    buf.zero_()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    call(q, k, v)
    e1.record()
    torch.cuda.synchronize()
    ms.append(e0.elapsed_time(e1))
flops = 4 * B * H * L * L * d / (2 if causal else 1)
rec = buf.view(-1, 8).cpu().long()
n = int((rec[:, 7] == 1).nonzero().max()) + 1
rec = rec[:n]
assert bool((rec[:, 7] == 1).all()), "missing records"


def rel(x, ref):  # 32-bit wrap-safe differences
    return (x - ref + (1 << 31)) % (1 << 32) - (1 << 31)


ns0 = rec[:, 3].min() if who != "fa4" else rec[:, 6].min()
cs, ce = rec[:, 1], rec[:, 2]
ns_s, ns_e = rel(rec[:, 3], ns0), rel(rec[:, 4], ns0)
dur_c = rel(ce, cs)
dur_ns = (ns_e - ns_s).double()
mhz = dur_c.double() / dur_ns * 1000
print(
    f"{who} D={d} L={L} causal={int(causal)} {dtype}: {n} tiles, launch {statistics.median(ms):.3f} ms "
    f"({flops / statistics.median(ms) / 1e9:.0f} TFLOP/s, min {min(ms):.3f}); SM clock median {mhz.median():.0f} MHz"
)
print(
    f"  tile cycles: median {dur_c.median():.0f} p10 {dur_c.double().quantile(0.1):.0f} p90 {dur_c.double().quantile(0.9):.0f}"
)
sm = rec[:, 0]
ends, firsts, gaps, entry_gap, counts = [], [], [], [], []
for s in sm.unique().tolist():
    idx = (sm == s).nonzero().flatten()
    order = idx[ns_s[idx].argsort()]
    counts.append(len(order))
    ends.append(int(ns_e[order[-1]]))
    firsts.append(int(ns_s[order[0]]) if who != "fa4" else int(rel(rec[order[0], 6], ns0)))
    for a, b in zip(order[:-1].tolist(), order[1:].tolist(), strict=False):
        nxt = rel(rec[b, 6], ns0) if who == "fa4" else ns_s[b]
        gaps.append(int(nxt - ns_e[a]))
    if who == "fa4":
        entry_gap += (ns_s[order] - rel(rec[order, 6], ns0)).tolist()
ends_t = torch.tensor(ends, dtype=torch.float64)
print(
    f"  SMs {len(counts)}; tiles an SM min {min(counts)} max {max(counts)}; first start (ns) max {max(firsts)}; "
    f"last end (us) min {ends_t.min() / 1e3:.1f} median {ends_t.median() / 1e3:.1f} max {ends_t.max() / 1e3:.1f}"
)
g = torch.tensor(gaps, dtype=torch.float64)
print(
    f"  between tiles on an SM (ns, end -> next {'CTA entry' if who == 'fa4' else 'tile start'}): median {g.median():.0f} p90 {g.quantile(0.9):.0f} max {g.max():.0f}"
)
if entry_gap:
    e = torch.tensor(entry_gap, dtype=torch.float64)
    print(f"  CTA entry -> consumer tile start (ns): median {e.median():.0f} p90 {e.quantile(0.9):.0f}")
busy = dur_ns.sum() / len(counts)
print(
    f"  mean busy an SM {busy / 1e3:.1f} us of span {ends_t.max() / 1e3:.1f} us; tile ns median {dur_ns.median():.0f}"
)
if lock:
    fcntl.flock(lock, fcntl.LOCK_UN)
torch.save(
    rec, os.environ.get("OUT", "/tmp") + f"/tiles-{who}{os.environ.get('TT_TAG', '')}-{d}-{L}-{int(causal)}-{dtype}.pt"
)
