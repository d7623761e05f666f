"""Tile sweep for a forward kernel: TFLOP/s of each tile candidate of the sm80 or the sm90 (Hopper) kernel.

    python scripts/tune.py [--kernel sm80|sm90] [--headdim 64,128,256] [--seqlen 4096,16384] [--dtype bfloat16]

For each head dim, causal or not, and seqlen (B = 16384 / L, H = 2048 / D, as in the benchmark grid) it times
PyTorch SDPA's flash backend, flash-attn-4 when it is installed, and every candidate (CUDA events, median; each run
timed --rounds times in turn with the others, the median of those kept), checks each candidate's output on a slice
against the float64 spec, and prints one JSON line per point. config.py's
tile tables cite its results. sm80 candidates are (block_m, block_n, num_warps, num_stages[, warps_n]); sm90 candidates
(block_m, block_n, num_stages, rescale_o_early[, take_turns[, grid]]), where grid "tile" launches one thread block
a tile instead of the grid Sm90FwdConfig.grid_limit picks (the persistent grid, under a mask at long walks not),
and "claim" makes the persistent thread blocks claim their tiles (Sm90FwdConfig.claim_tiles) with or without a mask.

    python scripts/tune.py --kernel sm90 --headdim 192 --causal yes --against exp_in_place=1 [--dtype float16]

times, instead of the tile candidates, the heuristic's config ("heuristic") against the same config with the given
fields of config.sm90_fwd_config / config.fwd_config overridden ("against"): 0 and 1 are booleans, AxBxC a tuple of
ints (tiles=128x80x2), other numbers numbers, anything else a string.
"""

import argparse
import json
import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashcute import compile_cache
from flashcute.bench.runner import round_order
from flashcute.config import fwd_config, sm90_fwd_config
from flashcute.interface import _num_sms, device_arch
from flashcute.kernels.build import compile_fwd
from flashcute.kernels.variants import _compile_one
from flashcute.reference import attention_ref

SM90_CANDIDATES = {
    32: [(128, 128, 2, False), (192, 128, 2, False)],
    64: [(192, 128, 2, False), (192, 128, 2, False, True, "tile"), (192, 128, 2, False, True, "claim")],
    96: [(128, 128, 2, False), (192, 128, 2, False), (128, 96, 2, False)],
    128: [
        (128, 128, 2, False),
        (128, 128, 2, False, True, "claim"),
        (128, 144, 2, False, True, "claim"),
        (128, 160, 2, False, True, "claim"),
        (128, 176, 2, False, True, "claim"),
    ],
    192: [(128, 96, 2, True), (128, 112, 2, True), (128, 64, 2, True), (128, 96, 2, True, False)],
    256: [(128, 80, 2, True, False), (128, 80, 2, True, True), (128, 64, 2, True, False), (128, 64, 2, True, True)],
}
CANDIDATES = {
    32: [(128, 128, 4, 1), (128, 64, 4, 1), (128, 128, 4, 2)],
    64: [(128, 64, 4, 1), (128, 64, 4, 2), (128, 128, 4, 1), (128, 128, 4, 2), (128, 128, 8, 1)],
    96: [(128, 64, 4, 1), (128, 64, 4, 2), (128, 32, 4, 1)],
    128: [
        (128, 64, 4, 1),
        (128, 64, 4, 2),
        (128, 48, 4, 1),
        (128, 48, 4, 2),
        (128, 32, 4, 1),
        (128, 64, 8, 1),
        (64, 64, 4, 1),
        (128, 128, 8, 1),
        (128, 128, 8, 2),
        (64, 64, 4, 2),
        (128, 64, 8, 1, 2),
        (128, 64, 8, 2, 2),
    ],
    192: [(128, 64, 8, 1), (128, 64, 8, 1, 2), (128, 64, 8, 2, 2), (64, 64, 4, 1, 2)],
    256: [(128, 64, 8, 1), (128, 64, 8, 1, 2), (128, 64, 8, 2, 2), (64, 64, 4, 1, 2)],
}


def tflops(ms: float, batch: int, heads: int, seqlen: int, head_dim: int, causal: bool) -> float:
    return 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1) / ms / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", default="sm80", choices=["sm80", "sm90"])
    parser.add_argument("--headdim", default="64,128,256")
    parser.add_argument("--seqlen", default="4096,16384")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--causal", default="no,yes", help="which masks to sweep: no, yes or both")
    parser.add_argument("--rounds", type=int, default=3, help="times every run is timed, in turn; the median is kept")
    parser.add_argument("--against", type=parse_overrides, help="KEY=VALUE[,KEY=VALUE]: heuristic against overrides")
    args = parser.parse_args()
    head_dims = [int(d) for d in args.headdim.split(",")]
    seqlens = [int(s) for s in args.seqlen.split(",")]
    masks = [{"no": False, "yes": True}[c] for c in args.causal.split(",")]
    arch = device_arch(torch.device("cuda"))
    configs = {
        (d, causal): candidate_configs(args.kernel, d, args.dtype, causal, args.against)
        for d in head_dims
        for causal in masks
    }
    todo = list(dict.fromkeys(c for named in configs.values() for c in named.values()))
    with ProcessPoolExecutor() as pool:  # fill the disk cache in parallel; the loop below then only loads
        list(pool.map(_compile_one, todo, [arch] * len(todo)))
    dtype = getattr(torch, args.dtype)
    for d in head_dims:
        for causal in masks:
            for seqlen in seqlens:
                row = sweep_point(args.kernel, configs[d, causal], arch, dtype, d, causal, seqlen, args.rounds)
                if args.against:
                    row["against/heuristic"] = round(row["against"] / row["heuristic"], 3)
                print(json.dumps(row), flush=True)


def parse_overrides(text: str) -> dict:
    """--against's KEY=VALUE[,KEY=VALUE] as keyword arguments of the config heuristic."""

    def value(v: str):
        if v in ("0", "1"):
            return v == "1"
        if "x" in v:
            return tuple(int(part) for part in v.split("x"))
        for kind in (int, float):
            try:
                return kind(v)
            except ValueError:
                pass
        return v

    return {key: value(v) for key, v in (item.split("=", 1) for item in text.split(","))}


def candidate_configs(kernel: str, d: int, dtype: str, causal: bool, against: dict | None) -> dict:
    """The configs timed at one (head dim, mask), by name: the tile candidates, or the heuristic and --against's."""
    if against is not None:
        if kernel == "sm90":
            heuristic = partial(sm90_fwd_config, d, dtype, causal=causal)
        else:  # the sm80 kernel's config for the GPU it runs on, as flash_attn_func picks it
            heuristic = partial(fwd_config, d, dtype, causal=causal, arch=device_arch(torch.device("cuda")))
        return {"heuristic": heuristic(), "against": heuristic(**against)}
    return {
        str(candidate): make_config(kernel, d, dtype, causal, candidate)
        for candidate in (SM90_CANDIDATES if kernel == "sm90" else CANDIDATES)[d]
    }


def make_config(kernel: str, d: int, dtype: str, causal: bool, candidate: tuple):
    if kernel == "sm90":
        take_turns = candidate[4] if len(candidate) > 4 else None
        claim_tiles = True if candidate[5:] == ("claim",) else None
        return sm90_fwd_config(
            d,
            dtype,
            causal=causal,
            tiles=candidate[:3],
            rescale_o_early=candidate[3],
            take_turns=take_turns,
            claim_tiles=claim_tiles,
        )
    return fwd_config(d, dtype, causal=causal, tiles=candidate)


def sweep_point(
    kernel_name: str, configs: dict, arch: str, dtype: torch.dtype, d: int, causal: bool, seqlen: int, rounds: int
) -> dict:
    batch, heads = 16384 // seqlen, 2048 // d
    q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=dtype) for _ in "qkv")
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def sdpa_flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    runs = {"sdpa_flash": sdpa_flash}
    try:
        from flash_attn.cute import flash_attn_func as fa4

        runs["fa4"] = partial(fa4, q, k, v, causal=causal)
    except ImportError:
        pass
    dtype_name = str(dtype).removeprefix("torch.")
    row: dict = {"dtype": dtype_name, "headdim": d, "causal": causal, "seqlen": seqlen}
    sm90 = kernel_name == "sm90"
    for name, config in configs.items():
        one_block_a_tile = sm90 and name.endswith("'tile')")
        extra = ()
        if sm90:
            extra = (1 << 30 if one_block_a_tile else config.grid_limit(seqlen, _num_sms(torch.cuda.current_device())),)
        kernel = compile_cache.get_compiled(arch, config, partial(compile_fwd, config, arch))
        out, lse = torch.empty_like(q), torch.empty(batch, heads, seqlen, device="cuda")
        counter = torch.zeros(1, dtype=torch.int32, device="cuda") if sm90 and config.claim_tiles else None
        tensors = (q, k, v, out, lse, counter) if sm90 else (q, k, v, out, lse)
        launch = partial(kernel, *tensors, 1 / math.sqrt(d), 0, -1, 0 if causal else -1, *extra)

        def run(counter=counter, launch=launch):
            if counter is not None:
                counter.zero_()  # the claimed-tile counter starts at 0 every launch
            launch()

        run()
        ref = attention_ref(q[:1, -256:, :2], k[:1, :, :2], v[:1, :, :2], causal=causal)
        row[f"error {name}"] = (out[:1, -256:, :2].double() - ref).abs().max().item()
        runs[name] = run
    # Every run timed once a round, in turn, in bench.runner.round_order's order, and the median kept: the GPU clock
    # drifts within a process (docs/perf-notes.md, "Session of stop 12"), and at the power cap a reading depends on
    # the run before it (stop 15: the first candidate, timed after flash-attn-4, read 3-10 % low in every sweep;
    # stop 19: still 1.3 % with every other round reversed).
    times: dict[str, list[float]] = {name: [] for name in runs}
    for round_idx in range(rounds):
        for name, fn in round_order(list(runs.items()), round_idx):
            times[name].append(triton.testing.do_bench(fn))
    for name, ms in times.items():
        row[name] = round(tflops(statistics.median(ms), batch, heads, seqlen, d, causal), 1)
    return row


if __name__ == "__main__":
    main()
