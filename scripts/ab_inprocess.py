"""A/B of one forward kernel of two trees in one process: this checkout's `flashcute` against an earlier commit's
copy renamed `flashcute_base`, with a reference beside them (flash-attn-4 for the Hopper forward, PyTorch SDPA's
flash backend for the sm80 one), each point's three timed in turn for several rounds (bench.runner.round_order: each
round in another order, every one after every other).

    python scripts/ab_inprocess.py prepare REV DIR    # here (needs git): DIR/flashcute_base from commit REV
    python -P scripts/ab_inprocess.py run DIR OUT.json [--kernel sm90] [--rounds 5] [--headdim 64,128,256]
        [--seqlen 1k,4k,16k] [--causal no,yes]

Separate processes read the same kernels apart by several per cent (clocks, the 700 W cap: docs/perf-notes.md,
stops 12-14); in one process, alternating, both trees see the same conditions. The renamed copy has its own compile
cache entries (the cache keys on the package's sources). Pre-compile both first, e.g. `python3 -P -m
flashcute.kernels.variants --arch sm_90a --only sm90-fwd --exact-only` and the same with `flashcute_base` on
PYTHONPATH=DIR. B = 16384 / L and H = 2048 / D as in the benchmark; prints one line a point and a summary.
"""

import argparse
import io
import itertools
import json
import re
import statistics
import subprocess
import sys
import tarfile
from functools import partial
from pathlib import Path


def prepare(rev: str, out_dir: Path) -> None:
    """Write out_dir/flashcute_base: the flashcute package of ``rev`` with its imports renamed."""
    archive = subprocess.run(["git", "archive", rev, "flashcute"], capture_output=True, check=True).stdout
    target = out_dir / "flashcute_base"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(".py"):
                text = tar.extractfile(member).read().decode()
                text = re.sub(r"\bflashcute\.", "flashcute_base.", text)
                text = re.sub(r"^(\s*)(from|import) flashcute\b", r"\1\2 flashcute_base", text, flags=re.M)
                path = target / Path(member.name).relative_to("flashcute")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    print(f"{target} from {rev}")


REFERENCES = {"sm90": "fa4", "sm80": "sdpa-flash"}


def run(
    base_dir: Path, out: Path, kernel: str, rounds: int, head_dims: list[int], seqlens: list[int], masks: list[bool]
) -> None:
    import torch
    import triton.testing

    sys.path.insert(0, str(base_dir))
    import flashcute_base

    import flashcute
    from flashcute.bench.backends import registry
    from flashcute.bench.grid import Shape
    from flashcute.bench.runner import round_order

    ref_name = REFERENCES[kernel]
    reference = registry()[ref_name]
    rows = []
    for dtype, d, causal, seqlen in itertools.product(("bf16", "fp16"), head_dims, masks, seqlens):
        shape = Shape(dtype, d, causal, seqlen, 16384 // seqlen, 2048 // d)
        q, k, v = (
            torch.randn(shape.batch, seqlen, shape.nheads, d, device="cuda", dtype=shape.torch_dtype) for _ in "qkv"
        )
        kernels = {
            "new": partial(flashcute.flash_attn_func, kernel=kernel, causal=causal),
            "base": partial(flashcute_base.flash_attn_func, kernel=kernel, causal=causal),
            "ref": reference.build(shape),
        }
        calls = {name: partial(fn, q, k, v) for name, fn in kernels.items()}
        times: dict[str, list[float]] = {name: [] for name in calls}
        with reference.context():
            for call in calls.values():
                call()
            for round_idx in range(rounds):
                for name, call in round_order(list(calls.items()), round_idx):
                    times[name].append(triton.testing.do_bench(call, warmup=10, rep=40))
        tflops = {name: shape.flops("fwd") / statistics.median(ms) / 1e9 for name, ms in times.items()}
        row = {"kernel": kernel, "reference": ref_name, "dtype": dtype, "headdim": d, "causal": causal}
        rows.append({**row, "seqlen": seqlen, **{name: round(t, 1) for name, t in tflops.items()}})
        new_base, new_ref = tflops["new"] / tflops["base"], tflops["new"] / tflops["ref"]
        timings = "  ".join(f"{name} {t:5.0f}" for name, t in tflops.items())
        mask = "causal" if causal else "nc"
        print(f"{dtype:8} D{d:<3} {mask:6} {seqlen:>5}  {timings}  new/base {new_base:.3f}  new/ref {new_ref:.3f}")
    out.write_text(json.dumps(rows, indent=1))
    ratio = statistics.geometric_mean([r["new"] / r["base"] for r in rows])
    above = {name: sum(r[name] >= r["ref"] for r in rows) for name in ("new", "base")}
    print(f"new/base geometric mean {ratio:.4f}; at or above {ref_name} (ref): new {above['new']}", end="")
    print(f" and base {above['base']} of {len(rows)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare")
    prep.add_argument("rev")
    prep.add_argument("dir", type=Path)
    timed = commands.add_parser("run")
    timed.add_argument("dir", type=Path)
    timed.add_argument("out", type=Path)
    timed.add_argument("--kernel", default="sm90", choices=sorted(REFERENCES))
    timed.add_argument("--rounds", type=int, default=5)
    timed.add_argument("--headdim", default="64,128,256")
    timed.add_argument("--seqlen", default="1k,4k,16k")
    timed.add_argument("--causal", default="no,yes", help="which masks: no, yes or both")
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.rev, args.dir)
    else:
        seqlens = [int(s[:-1]) * 1024 if s.endswith("k") else int(s) for s in args.seqlen.split(",")]
        masks = [{"no": False, "yes": True}[m] for m in args.causal.split(",")]
        run(args.dir, args.out, args.kernel, args.rounds, [int(d) for d in args.headdim.split(",")], seqlens, masks)


if __name__ == "__main__":
    main()
