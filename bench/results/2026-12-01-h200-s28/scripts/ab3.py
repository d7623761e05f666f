"""A/B/C in one process: the heuristic's Hopper forward (base), the same config with overrides (var) and
flash-attn-4 (fa4), rounds in turn.

    python3 -P ab3.py ROUNDS HEADDIMS SEQLENS CAUSAL[,..] KEY=VALUE[,KEY=VALUE]

e.g. `ab3.py 5 256 4096,16384 no exp_in_place=1`. B = 16384 / L, H = 2048 / D.
"""

import json
import math
import statistics
import sys

import torch
import triton.testing

from flashcute import compile_cache
from flashcute.bench.backends import registry
from flashcute.bench.grid import Shape
from flashcute.bench.runner import round_order
from flashcute.config import sm90_fwd_config
from flashcute.interface import _num_sms
from flashcute.kernels.build import compile_fwd
from flashcute.reference import attention_ref


def parse(v):
    if v in ("0", "1"):
        return v == "1"
    return tuple(int(x) for x in v.split("x")) if "x" in v else v


rounds = int(sys.argv[1])
dims = [int(s) for s in sys.argv[2].split(",")]
seqlens = [int(s) for s in sys.argv[3].split(",")]
masks = [c == "yes" for c in sys.argv[4].split(",")]
over = dict((kv.split("=")[0], parse(kv.split("=")[1])) for kv in sys.argv[5].split(",")) if len(sys.argv) > 5 else {}
nsm = _num_sms(0)
fa4 = registry()["fa4"]
for causal in masks:
    for d in dims:
        for dt in ("bfloat16", "float16"):
            for seqlen in seqlens:
                batch, heads = 16384 // seqlen, 2048 // d
                shape = Shape("bf16" if dt == "bfloat16" else "fp16", d, causal, seqlen, batch, heads)
                q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=getattr(torch, dt)) for _ in "qkv")
                runs, row = {}, {"dtype": dt, "d": d, "causal": causal, "seqlen": seqlen}
                base = sm90_fwd_config(d, dt, causal=causal)
                var = sm90_fwd_config(d, dt, causal=causal, **over)
                for name, cfg in (("base", base), ("var", var)):
                    kern = compile_cache.get_compiled("sm_90a", cfg, lambda cfg=cfg: compile_fwd(cfg, "sm_90a"))
                    out, lse = torch.empty_like(q), torch.empty(batch, heads, seqlen, device="cuda")
                    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
                    grid = cfg.grid_limit(seqlen, nsm)

                    def run(kern=kern, out=out, lse=lse, counter=counter, grid=grid, qkv=(q, k, v), d=d, causal=causal):
                        counter.zero_()
                        kern(*qkv, out, lse, counter, 1 / math.sqrt(d), 0, -1, 0 if causal else -1, grid)

                    run()
                    ref = attention_ref(q[:1, -256:, :2], k[:1, :, :2], v[:1, :, :2], causal=causal)
                    row[f"err {name}"] = float(f"{(out[:1, -256:, :2].double() - ref).abs().max().item():.2e}")
                    runs[name] = run
                f = fa4.build(shape)
                runs["fa4"] = lambda f=f, qkv=(q, k, v): f(*qkv)
                runs["fa4"]()
                times = {n: [] for n in runs}
                with fa4.context():
                    for r in range(rounds):
                        for n, fn in round_order(list(runs.items()), r):
                            times[n].append(triton.testing.do_bench(fn, warmup=10, rep=40))
                for n, ms in times.items():
                    row[n] = round(shape.flops("fwd") / statistics.median(ms) / 1e9, 1)
                row["var/base"] = round(row["var"] / row["base"], 3)
                row["base/fa4"] = round(row["base"] / row["fa4"], 3)
                row["var/fa4"] = round(row["var"] / row["fa4"], 3)
                print(json.dumps(row), flush=True)
