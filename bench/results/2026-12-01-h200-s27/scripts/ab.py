"""A/B in one process: the heuristic's D=256 Hopper forward against the same with exp_in_place, rounds in turn."""

import json
import math
import os
import statistics
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from configs import base, inplace

from flashcute import compile_cache
from flashcute.bench.runner import round_order
from flashcute.interface import _num_sms
from flashcute.kernels.build import compile_fwd
from flashcute.reference import attention_ref

rounds = int(sys.argv[1])
seqlens = [int(s) for s in sys.argv[2].split(",")]
nsm = _num_sms(0)
for causal in [c == "yes" for c in sys.argv[3].split(",")]:
    for dt in ("bfloat16", "float16"):
        for seqlen in seqlens:
            d = 256
            batch, heads = 16384 // seqlen, 2048 // d
            q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=getattr(torch, dt)) for _ in "qkv")
            runs, row = {}, {"dtype": dt, "causal": causal, "seqlen": seqlen}
            for name, cfg in (("base", base(d, dt, causal)), ("inplace", inplace(d, dt, causal))):
                kern = compile_cache.get_compiled("sm_90a", cfg, lambda cfg=cfg: compile_fwd(cfg, "sm_90a"))
                out, lse = torch.empty_like(q), torch.empty(batch, heads, seqlen, device="cuda")
                counter = torch.zeros(1, dtype=torch.int32, device="cuda")
                grid = cfg.grid_limit(seqlen, nsm)

                def run(kern=kern, out=out, lse=lse, counter=counter, grid=grid, qkv=(q, k, v), d=d, causal=causal):
                    counter.zero_()
                    kern(*qkv, out, lse, counter, 1 / math.sqrt(d), 0, -1, 0 if causal else -1, grid)

                run()
                ref = attention_ref(q[:1, -256:, :2], k[:1, :, :2], v[:1, :, :2], causal=causal)
                row[f"err {name}"] = (out[:1, -256:, :2].double() - ref).abs().max().item()
                runs[name] = run
            times = {n: [] for n in runs}
            for r in range(rounds):
                for n, fn in round_order(list(runs.items()), r):
                    times[n].append(triton.testing.do_bench(fn))
            for n, ms in times.items():
                row[n] = round(
                    4 * batch * heads * seqlen * seqlen * d / (2 if causal else 1) / statistics.median(ms) / 1e9, 1
                )
            row["ratio"] = round(row["inplace"] / row["base"], 3)
            print(json.dumps(row), flush=True)
