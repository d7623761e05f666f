# ruff: noqa: E402, E501, SIM115  (a measurement script, as it ran)
"""Per-tile cycles of one variant tree over several shapes, in one process: tiletl2.py TREE TAG d:L:causal:dtype ...
Compiles every shape first, then times under an flock (TT_LOCK) so parallel processes do not overlap on the GPU."""

import fcntl
import os
import statistics
import sys
import tempfile

import torch

tree, tag, shapes = sys.argv[1], sys.argv[2], sys.argv[3:]
buf = torch.zeros(1 << 22, dtype=torch.int32, device="cuda")
os.environ["TILE_TRACE_PTR"] = str(buf.data_ptr())
os.environ["FLASHCUTE_CACHE_DIR"] = tempfile.mkdtemp()
sys.path.insert(0, tree)
import flashcute

assert flashcute.__file__.startswith(tree), flashcute.__file__
probs = []
for s in shapes:
    d, L, c, dt = s.split(":")
    d, L, c = int(d), int(L), c == "1"
    B, H = 16384 // L, 2048 // d
    q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=getattr(torch, dt)) for _ in "qkv")
    flashcute.flash_attn_func(q, k, v, causal=c)  # compile
    probs.append((s, q, k, v, c))
torch.cuda.synchronize()
lock = open(os.environ.get("TT_LOCK", "/tmp/gpu.lock"), "w")
fcntl.flock(lock, fcntl.LOCK_EX)


def rel(x, ref):
    return (x - ref + (1 << 31)) % (1 << 32) - (1 << 31)


for s, q, k, v, c in probs:
    for _ in range(2):
        flashcute.flash_attn_func(q, k, v, causal=c)
    cyc, mhz = [], []
    for _ in range(3):
        buf.zero_()
        flashcute.flash_attn_func(q, k, v, causal=c)
        torch.cuda.synchronize()
        rec = buf.view(-1, 8)[: (buf.view(-1, 8)[:, 7] == 1).sum()].cpu().long()
        dc = rel(rec[:, 2], rec[:, 1]).double()
        dn = rel(rec[:, 4], rec[:, 3]).double()
        cyc.append(dc.median().item())
        mhz.append((dc / dn * 1000).median().item())
    print(
        f"RESULT {tag} {s} tile_cycles {statistics.median(cyc):.0f} clock_mhz {statistics.median(mhz):.0f} spread {max(cyc) / min(cyc) - 1:.4f}",
        flush=True,
    )
fcntl.flock(lock, fcntl.LOCK_UN)
