"""D=256 causal 1k: does our Hopper forward's occasional fall follow the inputs' allocation? Fresh inputs per trial,
each timed three times (ours, then flash-attn-4); prints TFLOP/s and the tensors' addresses mod 1 MiB (in KiB).

    python3 -P fall.py    # on the GPU host, flashcute and flash-attn-4 importable
"""

from functools import partial

import torch
import triton.testing
from flash_attn.cute import flash_attn_func as fa4

import flashcute

BATCH, HEADS, SEQLEN, HEAD_DIM = 16, 8, 1024, 256
FLOPS = 4 * BATCH * HEADS * SEQLEN * SEQLEN * HEAD_DIM / 2


def tflops(fn) -> list[int]:
    return [round(FLOPS / triton.testing.do_bench(fn, warmup=10, rep=40) / 1e9) for _ in range(3)]


def main() -> None:
    keep = []
    for dtype in (torch.float16, torch.bfloat16):
        for trial in range(10):
            q, k, v = (torch.randn(BATCH, SEQLEN, HEADS, HEAD_DIM, device="cuda", dtype=dtype) for _ in "qkv")
            if trial % 3 == 2:  # shift the next trials' allocations
                keep.append(torch.empty(int(37e6), dtype=torch.uint8, device="cuda"))
            ours = partial(flashcute.flash_attn_func, q, k, v, causal=True, kernel="sm90")
            ref = partial(fa4, q, k, v, causal=True)
            ours()
            ref()
            addresses = [t.data_ptr() % (1 << 20) // 1024 for t in (q, k, v)]
            name = str(dtype).removeprefix("torch.")
            print(name, trial, "ours", tflops(ours), "fa4", tflops(ref), "addr KiB mod 1MiB", addresses, flush=True)


if __name__ == "__main__":
    main()
