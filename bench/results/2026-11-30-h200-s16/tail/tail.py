"""Tail test: TFLOP/s of ours and fa4 (non-causal) as the tile count goes from a fractional to a whole number of
rounds over the SMs. tiles = (L / block_m) * B * H. Usage: python3 -P tail.py OUT.json (main's tree on PYTHONPATH)."""

import json
import statistics
import sys
from functools import partial

import torch
import triton.testing
from flash_attn.cute import flash_attn_func as fa4

import flashcute

SMS = torch.cuda.get_device_properties(0).multi_processor_count
CASES = [  # (D, L, B, H)
    (128, 16384, 1, 16),
    (128, 16384, 1, 32),
    (128, 16384, 1, 33),
    (128, 16384, 1, 31),
    (128, 4096, 4, 16),
    (128, 4096, 4, 33),
    (128, 4096, 4, 32),
    (256, 16384, 1, 8),
    (256, 16384, 1, 33),
    (256, 16384, 1, 32),
    (64, 16384, 1, 32),
    (64, 16384, 1, 33),
]


def main(out: str) -> None:
    rows = []
    for d, seqlen, batch, heads in CASES:
        q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
        flop = 4 * batch * heads * seqlen * seqlen * d
        fns = {"ours": partial(flashcute.flash_attn_func, q, k, v, kernel="sm90"), "fa4": partial(fa4, q, k, v)}
        for fn in fns.values():
            fn()
        readings = {name: [] for name in fns}
        for r in range(4):  # rounds alternate direction
            for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
                readings[name].append(flop / triton.testing.do_bench(fns[name], warmup=10, rep=40) / 1e9)
        med = {name: statistics.median(x) for name, x in readings.items()}
        tiles = -(-seqlen // (192 if d == 64 else 128)) * batch * heads
        rows.append(dict(D=d, L=seqlen, B=batch, H=heads, tiles=tiles, rounds=round(tiles / SMS, 3), **med))
        ratio = med["ours"] / med["fa4"]
        print(
            f"D{d} L{seqlen} B{batch} H{heads} tiles {tiles} rounds {tiles / SMS:.2f}  ours {med['ours']:.0f}  "
            f"fa4 {med['fa4']:.0f}  ours/fa4 {ratio:.3f}",
            flush=True,
        )
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
