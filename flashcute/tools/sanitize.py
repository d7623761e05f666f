"""`flashcute sanitize OUT_DIR`: compute-sanitizer's memcheck, racecheck and synccheck over every kind of kernel,
on small problems with partial tiles.

For each tool the driver (`flashcute sanitize --driver`) runs under `compute-sanitizer --tool TOOL`: it calls
flash_attn_func forward and, where a case says so, backward through autograd, with each kernel family first
(--kernels; default: every family this GPU runs) on each case of CASES (seqlens that end inside a tile, seqlen_q !=
seqlen_k both ways, one query row, GQA, q sliced out of a wider tensor, every head-dim bucket and a padded head dim,
both causal alignments, windows, a given softmax scale; the atomic and the deterministic dQ). That reaches every
kind of kernel: each family's forward and backward, the deterministic dQ kernel, and the backward's preprocess and
postprocess. The driver runs once without the sanitizer first: it compiles every kernel into the disk cache and
checks each output against attention_ref, so the sanitized runs only load kernels and the check says the cases
compute what they should.

PyTorch's caching allocator is off in the sanitized runs (PYTORCH_NO_CUDA_MEMORY_CACHING=1): each tensor is its
own allocation, so memcheck sees an access past a tensor's end instead of one landing in a neighbour in the pool.

Writes OUT_DIR/<tool>.log, OUT_DIR/check.log and OUT_DIR/sanitize.json (per tool: errors reported, exit status,
seconds) and prints a table last. Exit status 0 iff the check passed and every run finished without an error.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from flashcute.bench.command import comma_list, no_gpu

TOOLS = ("memcheck", "racecheck", "synccheck")
ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")
RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazard")
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    """One call: sizes (batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim), flash_attn_func options, and what
    else it runs (backward, deterministic dQ; q as a head slice of a wider tensor). With ``packed`` (the sequences'
    query and key lengths) a packed batch through flash_attn_varlen_func instead, batch and seqlens unused."""

    sizes: tuple[int, int, int, int, int, int]
    options: dict = field(default_factory=dict)
    dtype: str = "bfloat16"
    backward: bool = False
    deterministic: bool = False
    q_strided: bool = False
    packed: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    def __str__(self) -> str:
        b, sq, sk, h, hk, d = self.sizes
        opts = "".join(f"-{key}={value}" for key, value in self.options.items())
        extra = ("-bwd" if self.backward else "") + ("-det" if self.deterministic else "")
        rows = (
            f"b{b}-q{sq}-k{sk}"
            if self.packed is None
            else "packed-q{}-k{}".format(*("_".join(map(str, lens)) for lens in self.packed))
        )
        return f"{self.dtype}-{rows}-h{h}x{hk}-d{d}{opts}{extra}{'-strided' if self.q_strided else ''}"


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
    Case((0, 0, 0, 4, 2, 128), {"causal": True}, backward=True, packed=((70, 0, 130, 1), (90, 40, 129, 300))),
    Case(
        (0, 0, 0, 2, 1, 64), {"window_size": (20, 3)}, "float16", backward=True, packed=((33, 190, 64), (200, 17, 64))
    ),
    Case((0, 0, 0, 2, 2, 96), {}, backward=True, deterministic=True, packed=((5, 129), (300, 64))),
    Case((1, 300, 333, 4, 2, 128), {"window_size": (100, 7)}, backward=True, deterministic=True),
    Case(
        (0, 0, 0, 2, 1, 64),
        {"causal": True},
        "float16",
        backward=True,
        deterministic=True,
        packed=((130, 7), (200, 190)),
    ),
    Case((0, 0, 0, 2, 2, 128), {}, backward=True, deterministic=True, packed=((81, 0, 160), (100, 30, 241))),
)


def parse_tool(text: str) -> str:
    if text not in TOOLS:
        raise ValueError(f"tool {text!r} is not one of {', '.join(TOOLS)}")
    return text


def parse_case(text: str) -> int:
    if not 0 <= int(text) < len(CASES):
        raise ValueError(f"case {text} is not in 0..{len(CASES) - 1} (--list shows them)")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description, parser.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    parser.add_argument("out", metavar="OUT_DIR", nargs="?", type=Path, help="where the logs and sanitize.json go")
    parser.add_argument(
        "--tools", type=comma_list(parse_tool), default=TOOLS, help=f"comma list (default: {','.join(TOOLS)})"
    )
    parser.add_argument(
        "--kernels", type=comma_list(str), help="kernel families, comma list (default: every one this GPU runs)"
    )
    parser.add_argument("--cases", type=comma_list(parse_case), help="indices into CASES, comma list (default: all)")
    parser.add_argument("--list", action="store_true", help="print the cases with their indices and exit")
    parser.add_argument("--driver", action="store_true", help="run the cases in this process (what the tools wrap)")
    parser.add_argument("--check", action="store_true", help="with --driver: compare the outputs with attention_ref")


def run_cases(kernels: list[str], cases: list[Case], check: bool) -> list[str]:
    """Each case through each kernel, forward and (where the case says) backward; with ``check``, compare the
    output with attention_ref and return the failures as lines."""
    import torch

    from flashcute import flash_attn_func, flash_attn_varlen_func
    from flashcute.reference import attention_ref, attention_varlen_ref

    failures = []
    for case in cases:
        b, sq, sk, h, hk, d = case.sizes
        dtype = getattr(torch, case.dtype)
        generator = torch.Generator(device="cuda").manual_seed(sum(case.sizes))
        q_rows, kv_rows = (b, sq), (b, sk)
        if case.packed is not None:
            lens_q, lens_k = case.packed
            q_rows, kv_rows = (sum(lens_q),), (sum(lens_k),)
            cu_q, cu_k = (
                torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device="cuda") for lens in case.packed
            )
            attend = partial(flash_attn_varlen_func, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
            attend = partial(attend, max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))
            reference = partial(attention_varlen_ref, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        else:
            attend, reference = flash_attn_func, attention_ref
        q = torch.randn(*q_rows, h + (2 if case.q_strided else 0), d, device="cuda", dtype=dtype, generator=generator)
        q = q[..., :h, :]
        k, v = (torch.randn(*kv_rows, hk, d, device="cuda", dtype=dtype, generator=generator) for _ in "kv")
        for kernel in kernels:
            leaves = [x.detach().clone().requires_grad_(case.backward) for x in (q, k, v)]
            out = attend(*leaves, deterministic=case.deterministic, kernel=kernel, **case.options)
            if case.backward:
                out.backward(torch.randn_like(out))
            torch.cuda.synchronize()
            if check:
                ref = reference(q, k, v, **case.options)
                error = (out.double() - ref).abs().max().item()
                if not error < 0.05:
                    failures.append(f"{kernel} {case}: max |out - attention_ref| = {error:.3g}")
                if case.backward and not all(torch.isfinite(x.grad).all() for x in leaves):
                    failures.append(f"{kernel} {case}: a gradient holds NaN or inf")
            print(f"ran {kernel} {case}", flush=True)
    return failures


def driver_env() -> dict[str, str]:
    """The environment of the driver: this flashcute first on its path, whichever directory it is run from."""
    path = [str(PACKAGE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def sanitize(tool: str, driver: list[str], log: Path) -> dict:
    """One sanitized run of the driver; what it reported."""
    command = ["compute-sanitizer", f"--tool={tool}", "--print-limit=50", "--error-exitcode=9", *driver]
    env = {**driver_env(), "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
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


def run(args: argparse.Namespace) -> int:
    """--list, the driver, or the check and the sanitized runs; 2 for an unknown family, without OUT_DIR, a GPU or
    compute-sanitizer."""
    indices = args.cases or range(len(CASES))
    if args.list:
        print("\n".join(f"{index:>2}  {CASES[index]}" for index in indices))
        return 0
    from flashcute.kernels import registry

    try:
        kernels = [registry.family(name).NAME for name in args.kernels or registry.available()]
    except ValueError as exc:
        print(f"flashcute sanitize: {exc}", file=sys.stderr)
        return 2
    if args.out is None and not args.driver:
        print("flashcute sanitize: OUT_DIR is required (unless --driver or --list)", file=sys.stderr)
        return 2
    if no_gpu("sanitize"):
        return 2
    if not kernels:
        print("flashcute sanitize: no flashcute kernel runs on this GPU", file=sys.stderr)
        return 2
    if args.driver:
        failures = run_cases(kernels, [CASES[index] for index in indices], args.check)
        print("\n".join(failures) or "all outputs match attention_ref" if args.check else "done")
        return 1 if failures else 0
    if shutil.which("compute-sanitizer") is None:
        print("flashcute sanitize: compute-sanitizer is not on PATH (it comes with the CUDA toolkit)", file=sys.stderr)
        return 2
    return sanitize_all(args.out, args.tools, kernels, list(indices))


def sanitize_all(out: Path, tools: list[str], kernels: list[str], indices: list[int]) -> int:
    """The unsanitized check, then each tool's run of the driver; the table; 0 iff all is clean."""
    out.mkdir(parents=True, exist_ok=True)
    driver = [sys.executable, "-m", "flashcute", "sanitize", "--driver", "--kernels", ",".join(kernels)]
    driver += ["--cases", ",".join(map(str, indices))]
    with (out / "check.log").open("w") as sink:
        check = subprocess.run([*driver, "--check"], stdout=sink, stderr=subprocess.STDOUT, env=driver_env())
    checked = check.returncode
    results = [sanitize(tool, driver, out / f"{tool}.log") for tool in tools]
    (out / "sanitize.json").write_text(json.dumps({"check_returncode": checked, "runs": results}, indent=1))
    print(f"check against attention_ref: {'ok' if checked == 0 else 'FAILED'} ({out / 'check.log'})")
    print(f"{'tool':10} {'errors':>6} {'rc':>3} {'cases':>5} {'seconds':>8}")
    for r in results:
        print(f"{r['tool']:10} {r['errors']!s:>6} {r['returncode']:>3} {r['cases_run']:>5} {r['seconds']:>8}")
    clean = checked == 0 and all(r["returncode"] == 0 and r["errors"] == 0 for r in results)
    return 0 if clean else 1
