"""`flashcute demo`: flashcute against PyTorch SDPA on one LLM-sized problem; without a GPU, the CPU model.

With a CUDA GPU that runs a flashcute kernel it times `flashcute.flash_attn_func` and
`torch.nn.functional.scaled_dot_product_attention` on the same inputs (CUDA events, median) and prints each one's
error against the float64 specification `attention_ref` (on the first and last batch element and head, to keep
the float64 computation cheap) and its TFLOP/s (design.md: 4·B·H·Lq·Lk·D, halved for causal).

Without one it says so, runs `tiled_attention` (the kernel's block algorithm on the CPU) on a small random problem
against `attention_ref`, and prints the seed article's worked example as the tiled reference computes it.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import torch

from flashcute.bench.command import parse_size

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
WARMUP_MS, REPEAT_MS = 25.0, 100.0
CPU_PROBLEM = {"batch": 2, "seqlen": 200, "nheads": 4, "headdim": 64}  # 200 rows: a partial tile of 64 at the end

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `flashcute demo` (the problem run on the GPU)."""
    parser.add_argument("--batch", type=parse_size, default=4, help="batch size (default 4)")
    parser.add_argument("--seqlen", type=parse_size, default=4096, help="query and key length, k = 1024 (default 4k)")
    parser.add_argument("--nheads", type=parse_size, default=16, help="heads (default 16)")
    parser.add_argument("--headdim", type=parse_size, default=128, help="head dimension (default 128)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help="input dtype (default bf16)")
    parser.add_argument(
        "--causal", action=argparse.BooleanOptionalAction, default=True, help="causal mask (default: causal)"
    )


def run(args: argparse.Namespace) -> int:
    import flashcute

    if torch.cuda.is_available() and flashcute.available_kernels():
        return gpu_demo(args)
    if torch.cuda.is_available():
        print(f"No flashcute kernel runs on {torch.cuda.get_device_name()}: the kernels need sm_80 or newer.")
    else:
        print(f"No CUDA GPU found (torch {torch.__version__}: torch.cuda.is_available() is False).")
    print("The GPU kernel cannot run here; its CPU model runs instead.\n")
    return cpu_demo(args.causal)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """PyTorch SDPA on flashcute's (batch, seqlen, nheads, headdim) layout, through (b, h, s, d) transposed views."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
    )
    return out.transpose(1, 2)


def gpu_demo(args: argparse.Namespace) -> int:
    import flashcute
    from flashcute.bench.timing import gpu_time_ms

    shape = (args.batch, args.seqlen, args.nheads, args.headdim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=DTYPES[args.dtype]) for _ in range(3))
    print(
        f"{torch.cuda.get_device_name()}: batch {args.batch}, seqlen {args.seqlen}, {args.nheads} heads, "
        f"head dim {args.headdim}, {args.dtype}, {'causal' if args.causal else 'no mask'}"
    )
    flash: Attention = functools.partial(flashcute.flash_attn_func, causal=args.causal)
    start = time.perf_counter()
    try:
        flash(q, k, v)
    except ValueError as error:
        print(f"flashcute demo: error: {error}")
        return 2
    torch.cuda.synchronize()
    print(f"flashcute's first call (compile, or load from the kernel cache): {time.perf_counter() - start:.1f} s\n")
    backends = {"flashcute": flash, "torch SDPA": functools.partial(sdpa, causal=args.causal)}
    print(compare(backends, q, k, v, args.causal, lambda step: gpu_time_ms(step, WARMUP_MS, REPEAT_MS)))
    return 0


def compare(
    backends: dict[str, Attention],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    time_ms: Callable[[Callable[[], object]], float],
) -> str:
    """A table of each backend's error against the float64 spec and its speed, then the speed ratios."""
    from flashcute.bench.check import errors, sample
    from flashcute.bench.flops import attention_flops
    from flashcute.reference import attention_ref

    expected = attention_ref(*(sample(t) for t in (q, k, v)), causal=causal)
    batch, seqlen_q, nheads, headdim = q.shape
    flops = attention_flops(batch, nheads, seqlen_q, k.shape[1], headdim, causal)
    lines = [f"{'':<12} {'max |err|':>10} {'rel L2 err':>10} {'ms':>9} {'TFLOP/s':>9}"]
    tflops = {}
    for name, attention in backends.items():
        err = errors(sample(attention(q, k, v)), expected)
        ms = time_ms(functools.partial(attention, q, k, v))
        tflops[name] = flops / ms / 1e9
        lines.append(f"{name:<12} {err['max_abs']:>10.2e} {err['rel_l2']:>10.2e} {ms:>9.3f} {tflops[name]:>9.1f}")
    first, *others = tflops
    lines += [f"{first} / {other}: {tflops[first] / tflops[other]:.2f}x the speed" for other in others]
    lines.append("errors: against the float64 spec (attention_ref) on the first and last batch element and head")
    return "\n".join(lines)


def cpu_demo(causal: bool) -> int:
    from flashcute.reference import attention_ref, tiled_attention
    from flashcute.walkthrough import summary

    p = CPU_PROBLEM
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(p["batch"], p["seqlen"], p["nheads"], p["headdim"], generator=generator, dtype=torch.float64)
        for _ in range(3)
    )
    result = tiled_attention(q, k, v, causal=causal, block_m=64, block_n=64)
    out, lse = attention_ref(q, k, v, causal=causal, return_lse=True)
    out_err = (torch.from_numpy(result.out) - out).abs().max().item()
    lse_err = (torch.from_numpy(result.lse) - lse).abs().max().item()
    print(
        "flashcute.reference.tiled_attention (the kernel's block algorithm, float64) against attention_ref "
        f"(the float64 spec):\n  batch {p['batch']}, seqlen {p['seqlen']}, {p['nheads']} heads, "
        f"head dim {p['headdim']}, {'causal' if causal else 'no mask'}, 64 x 64 tiles\n"
        f"  max |tiled - spec|: out {out_err:.1e}, lse {lse_err:.1e}\n"
    )
    print(summary())
    print("\nRun `flashcute walkthrough` to see it round by round, as the kernel computes it.")
    return 0
