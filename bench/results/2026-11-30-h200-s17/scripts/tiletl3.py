# ruff: noqa: E402, SIM115  (a measurement script, as it ran)
"""Per-tile cycles of the Hopper forward with config overrides, over several shapes, in one process:
tiletl3.py TREE TAG 'json overrides' d:L:causal:dtype ...  (compiles all first; times under an flock)."""

import dataclasses
import fcntl
import json
import os
import statistics
import sys
import tempfile

import torch

tree, tag, ovr, shapes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4:]
buf = torch.zeros(1 << 22, dtype=torch.int32, device="cuda")
os.environ["TILE_TRACE_PTR"] = str(buf.data_ptr())
os.environ["FLASHCUTE_CACHE_DIR"] = tempfile.mkdtemp()
sys.path.insert(0, tree)
import flashcute
import flashcute.interface as fi

assert flashcute.__file__.startswith(tree), flashcute.__file__
orig = fi.sm90_fwd_config


def patched(*a, **k):
    cfg = orig(*a, **k)
    o = {key: (val if not isinstance(val, str) else eval(val, {"cfg": cfg})) for key, val in ovr.items()}
    return dataclasses.replace(cfg, **o)


fi.sm90_fwd_config = patched
probs = []
for s in shapes:
    d, L, c, dt = s.split(":")
    d, L, c = int(d), int(L), c == "1"
    B, H = 16384 // L, 2048 // d
    q, k, v = (torch.randn(B, L, H, d, device="cuda", dtype=getattr(torch, dt)) for _ in "qkv")
    fi.flash_attn_func(q, k, v, causal=c)
    probs.append((s, q, k, v, c))
torch.cuda.synchronize()
lock = open(os.environ.get("TT_LOCK", "/tmp/gpu.lock"), "w")
fcntl.flock(lock, fcntl.LOCK_EX)


def rel(x, ref):
    return (x - ref + (1 << 31)) % (1 << 32) - (1 << 31)


for s, q, k, v, c in probs:
    for _ in range(2):
        fi.flash_attn_func(q, k, v, causal=c)
    cyc = []
    for _ in range(3):
        buf.zero_()
        fi.flash_attn_func(q, k, v, causal=c)
        torch.cuda.synchronize()
        rec = buf.view(-1, 8)[: (buf.view(-1, 8)[:, 7] == 1).sum()].cpu().long()
        cyc.append(rel(rec[:, 2], rec[:, 1]).double().median().item())
    print(f"RESULT {tag} {s} {statistics.median(cyc):.0f} {max(cyc) / min(cyc) - 1:.4f}", flush=True)
fcntl.flock(lock, fcntl.LOCK_UN)
