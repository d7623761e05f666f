"""`flashcute warmup`: compile kernels into the disk cache ahead of time, so that a process's first call loads them.

By default the kernels a typical LLM calls on this GPU: bf16, head dims 64 and 128, causal and not, forward and
backward (dQ by atomics) of every family the GPU runs, and the backward's pre- and postprocess. The flags narrow or
widen that; `--all` compiles every variant the heuristics pick and the alternative tiles the GPU tests run (what
`scripts/gpu_suite.sh` needs). Each variant compiles in a process of its own, `--jobs` at a time; one already in the
cache is only loaded. `flashcute cache` shows what the cache holds.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from flashcute.bench.command import comma_list, parse_causal, parse_size
from flashcute.kernels import registry
from flashcute.kernels.common.prepost_config import BwdPreConfig

DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "bfloat16": "bfloat16", "float16": "float16"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", help="the target, e.g. sm_90a or sm_80 (default: this GPU's)")
    parser.add_argument(
        "--dtype", type=comma_list(lambda t: DTYPE_NAMES[t]), default=("bfloat16",), help="bf16,fp16 (default: bf16)"
    )
    parser.add_argument("--headdim", type=comma_list(parse_size), default=(64, 128), help="(default: 64,128)")
    parser.add_argument("--causal", type=comma_list(parse_causal), default=(False, True), help="no,yes (default: both)")
    parser.add_argument(
        "--kernels", type=comma_list(registry.family_name), help="families (default: every one the target runs)"
    )
    parser.add_argument(
        "--pass",
        dest="passes",
        type=comma_list(lambda p: {"fwd": "fwd", "bwd": "bwd"}[p]),
        default=("fwd", "bwd"),
        help="fwd,bwd (default: both)",
    )
    parser.add_argument("--deterministic", action="store_true", help="also the deterministic backward's kernels")
    parser.add_argument(
        "--packed",
        action="store_true",
        help="also the kernels of packed variable-length batches (flash_attn_varlen_func)",
    )
    parser.add_argument(
        "--softcap", action="store_true", help="also the kernels that cap scores (softcap > 0, e.g. Gemma 2)"
    )
    parser.add_argument(
        "--sink", action="store_true", help="also the forward kernels with learnable sinks (e.g. gpt-oss)"
    )
    parser.add_argument("--alibi", action="store_true", help="also the kernels with ALiBi biases (e.g. MPT, BLOOM)")
    parser.add_argument(
        "--paged",
        action="store_true",
        help="also the forward kernels that read a paged KV cache where it lies (flash_attn_with_kvcache with a "
        "block_table; pages of 16, 64 and 256 rows)",
    )
    parser.add_argument(
        "--value",
        action="store_true",
        help="also the kernels where v's head dim is not q's, for the pairs models use (192,128 and 128,64: "
        "DeepSeek-style), at the --headdim of q",
    )
    parser.add_argument("--all", action="store_true", help="every variant of every family the target runs")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles (default: cores)")
    parser.add_argument("--dry-run", action="store_true", help="list the variants, compile nothing")


def _target(arch: str | None) -> str | None:
    if arch is not None:
        return arch
    import torch

    if not torch.cuda.is_available():
        return None
    from flashcute.kernels.launch import device_arch

    return device_arch(torch.device("cuda"))


def chosen_variants(args: argparse.Namespace, arch: str) -> list:
    """The configs the flags ask for on target ``arch``."""
    from flashcute.kernels.variants import all_variants

    if args.all:
        return all_variants(arch)
    masks = tuple((-1, 0) if causal else (-1, -1) for causal in args.causal)
    groups = registry.variants(arch, exact_only=True, dtypes=args.dtype, buckets=args.headdim, masks=masks)
    families = args.kernels or registry.FAMILIES
    kinds = {"fwd"} if "fwd" in args.passes else set()
    if "bwd" in args.passes:
        kinds |= {"bwd", "dq", "bwd-deterministic"} if args.deterministic else {"bwd"}
    names = ("packed", "softcap", "sink", "alibi", "value", "paged")
    layouts = ("", *(f"-{name}" for name in names if getattr(args, name)))
    configs = [
        c for name in families for kind in kinds for end in layouts for c in groups.get(f"{name}-{kind}{end}", [])
    ]
    if "bwd" in args.passes:  # the preprocess that leaves dQaccum alone serves the deterministic backward only
        unused = (c for c in groups["prepost"] if isinstance(c, BwdPreConfig) and not c.clear_dq_accum)
        configs += [c for c in groups["prepost"] if args.deterministic or c not in set(unused)]
    return list(dict.fromkeys(configs))


def _compile(config, arch: str) -> float:
    from flashcute.kernels.variants import compile_one

    return compile_one(config, arch)


def run(args: argparse.Namespace) -> int:
    arch = _target(args.arch)
    if arch is None:
        print("flashcute warmup: no CUDA GPU here to take the target from: name one with --arch", file=sys.stderr)
        return 2
    configs = chosen_variants(args, arch)
    if args.dry_run:
        print("\n".join(f"{arch} {config.label}" for config in configs))
        return 0
    from flashcute import compile_cache

    directory = compile_cache.cache_dir()
    if directory is not None and not compile_cache.writable(directory):
        print(
            f"flashcute warmup: cannot write the kernel cache folder {directory}: set FLASHCUTE_CACHE_DIR to a folder "
            "this user can write",
            file=sys.stderr,
        )
        return 2
    print(f"{len(configs)} variants for {arch} into {directory or 'memory (the disk cache is off)'}")
    start = time.perf_counter()
    # spawned workers: this process may have started CUDA to read the target, and a forked child must not inherit it
    with ProcessPoolExecutor(max(1, args.jobs), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_compile, config, arch): config for config in configs}
        for done, future in enumerate(as_completed(futures), 1):
            print(f"[{done}/{len(configs)}] {futures[future].label} {future.result():.1f} s", flush=True)
    print(f"{len(configs)} variants for {arch} in {time.perf_counter() - start:.0f} s")
    return 0
