"""compute-sanitizer over every flashcute kernel, on small problems with partial tiles (run on a GPU host).

    python -P scripts/sanitize.py OUT_DIR [--tools memcheck,racecheck,synccheck] [--kernels sm90,sm80]
        [--cases 0,3,7]

For each tool, this file's driver (``--driver``) runs under ``compute-sanitizer --tool TOOL``: it calls
flash_attn_func forward and, where a case says so, backward through autograd, on each case of CASES (seqlens
that end inside a tile, seqlen_q != seqlen_k both ways, one query row, GQA, q sliced out of a wider tensor,
padded head dims, both causal alignments, windows, a given softmax scale; the atomic and the deterministic dQ).
That covers every kind of kernel: the sm80 and sm90 forwards, the sm80 and sm90 backwards, the deterministic dQ
kernel, and the backward's preprocess and postprocess. The driver runs once without the sanitizer first: it
compiles every kernel into the disk cache (FLASHCUTE_CACHE_DIR) and checks each output against attention_ref,
so the sanitized runs only load kernels and the check says the cases compute what they should.

PyTorch's caching allocator is off in the sanitized runs (PYTORCH_NO_CUDA_MEMORY_CACHING=1): each tensor is its
own allocation, so memcheck sees an access past a tensor's end instead of landing in a neighbour in the same pool.

Writes OUT_DIR/<tool>.log, OUT_DIR/check.log and OUT_DIR/sanitize.json (per tool: errors reported, exit status,
seconds) and prints a table last. Exit status 0 iff every run finished and reported no error.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

TOOLS = ("memcheck", "racecheck", "synccheck")
ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")
RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazard")


@dataclass(frozen=True)
class Case:
    """One call: sizes (batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim), flash_attn_func options, and what
    else it runs (backward, deterministic dQ; q as a head slice of a wider tensor)."""

    sizes: tuple[int, int, int, int, int, int]
    options: dict = field(default_factory=dict)
    dtype: str = "bfloat16"
    backward: bool = False
    deterministic: bool = False
    q_strided: bool = False

    def __str__(self) -> str:
        b, sq, sk, h, hk, d = self.sizes
        opts = "".join(f"-{key}={value}" for key, value in self.options.items())
        extra = ("-bwd" if self.backward else "") + ("-det" if self.deterministic else "")
        return f"{self.dtype}-b{b}-q{sq}-k{sk}-h{h}x{hk}-d{d}{opts}{extra}{'-strided' if self.q_strided else ''}"


CASES = (
    Case((1, 113, 239, 2, 2, 128), backward=True),
    Case((1, 239, 113, 4, 2, 128), {"causal": True}, backward=True),
    Case((2, 1, 17, 2, 1, 64), {"causal": True}),
    Case((1, 200, 200, 2, 2, 64), {"causal": True, "causal_align": "top_left"}, "float16", backward=True),
    Case((1, 131, 77, 3, 1, 72), {"window_size": (40, 9)}, backward=True, q_strided=True),
    Case((1, 150, 150, 2, 2, 256), {"causal": True}, backward=True),
    Case((1, 97, 161, 2, 2, 192), backward=True, deterministic=True),
    Case((1, 129, 257, 2, 2, 96), {"causal": True, "softmax_scale": 0.3}, "float16", backward=True),
    Case((1, 65, 65, 2, 2, 32), {"window_size": (0, 0)}, backward=True, deterministic=True),
)


def run_cases(kernels: list[str], cases: list[Case], check: bool) -> list[str]:
    """Each case through each kernel, forward and (where the case says) backward; with ``check``, compare the
    output with attention_ref and return the failures as lines."""
    import torch

    from flashcute import flash_attn_func
    from flashcute.reference import attention_ref

    failures = []
    for case in cases:
        b, sq, sk, h, hk, d = case.sizes
        dtype = getattr(torch, case.dtype)
        generator = torch.Generator(device="cuda").manual_seed(sum(case.sizes))
        q = torch.randn(b, sq, h + (2 if case.q_strided else 0), d, device="cuda", dtype=dtype, generator=generator)
        q = q[:, :, :h]
        k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=dtype, generator=generator) for _ in "kv")
        for kernel in kernels:
            leaves = [x.detach().clone().requires_grad_(case.backward) for x in (q, k, v)]
            out = flash_attn_func(*leaves, deterministic=case.deterministic, kernel=kernel, **case.options)
            if case.backward:
                out.backward(torch.randn_like(out))
            torch.cuda.synchronize()
            if check:
                ref = attention_ref(q, k, v, **case.options)
                error = (out.double() - ref).abs().max().item()
                if not error < 0.05:
                    failures.append(f"{kernel} {case}: max |out - attention_ref| = {error:.3g}")
                if case.backward and not all(torch.isfinite(x.grad).all() for x in leaves):
                    failures.append(f"{kernel} {case}: a gradient holds NaN or inf")
            print(f"ran {kernel} {case}", flush=True)
    return failures


def sanitize(tool: str, driver: list[str], log: Path) -> dict:
    """One sanitized run of the driver; what it reported."""
    command = ["compute-sanitizer", f"--tool={tool}", "--print-limit=50", "--error-exitcode=9", *driver]
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    start = time.perf_counter()
    with log.open("w") as sink:
        status = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, env=env).returncode
    text = log.read_text()
    summary = ERROR_SUMMARY.findall(text) or RACE_SUMMARY.findall(text)
    return {
        "tool": tool,
        "returncode": status,
        "errors": int(summary[-1]) if summary else None,
        "seconds": round(time.perf_counter() - start, 1),
        "cases_run": sum(line.startswith("ran ") for line in text.splitlines()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--kernels", default="sm90,sm80")
    parser.add_argument("--cases", default="", help="indices into CASES, comma-separated (default: all)")
    parser.add_argument("--driver", action="store_true", help="run the cases here (what the sanitizer wraps)")
    parser.add_argument("--check", action="store_true", help="with --driver: compare with attention_ref")
    args = parser.parse_args(argv)
    kernels = args.kernels.split(",")
    cases = [CASES[int(i)] for i in args.cases.split(",")] if args.cases else list(CASES)
    if args.driver:
        failures = run_cases(kernels, cases, args.check)
        print("\n".join(failures) or "all outputs match attention_ref" if args.check else "done")
        return 1 if failures else 0
    if args.out is None:
        parser.error("OUT_DIR is required without --driver")
    args.out.mkdir(parents=True, exist_ok=True)
    driver = [sys.executable, "-P", __file__, "--driver", "--kernels", args.kernels, "--cases", args.cases]
    with (args.out / "check.log").open("w") as sink:
        checked = subprocess.run([*driver, "--check"], stdout=sink, stderr=subprocess.STDOUT).returncode
    results = [sanitize(tool, driver, args.out / f"{tool}.log") for tool in args.tools.split(",")]
    (args.out / "sanitize.json").write_text(json.dumps({"check_returncode": checked, "runs": results}, indent=1))
    print(f"check against attention_ref: {'ok' if checked == 0 else 'FAILED'} ({args.out / 'check.log'})")
    print(f"{'tool':10} {'errors':>6} {'rc':>3} {'cases':>5} {'seconds':>8}")
    for r in results:
        print(f"{r['tool']:10} {r['errors']!s:>6} {r['returncode']:>3} {r['cases_run']:>5} {r['seconds']:>8}")
    clean = checked == 0 and all(r["returncode"] == 0 and r["errors"] == 0 for r in results)
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
