"""D=256 causal 1k: does our Hopper forward's occasional fall follow the inputs' allocation? Fresh inputs per trial,
each timed three times (ours, fa4 in turn); prints TFLOP/s and the tensors' addresses mod 1 MiB."""
import torch, triton.testing, statistics
from functools import partial
import flashcute
from flash_attn.cute import flash_attn_func as fa4
B, H, L, D = 16, 8, 1024, 256
fl = 4 * B * H * L * L * D / 2
keep = []
for dtype in (torch.float16, torch.bfloat16):
    for trial in range(10):
        q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=dtype) for _ in "qkv")
        if trial % 3 == 2:
            keep.append(torch.empty(int(37e6), dtype=torch.uint8, device="cuda"))  # shift later allocations
        ours = partial(flashcute.flash_attn_func, q, k, v, causal=True, kernel="sm90")
        ref = partial(fa4, q, k, v, causal=True)
        ours(); ref()
        t_o = [fl / triton.testing.do_bench(ours, warmup=10, rep=40) / 1e9 for _ in range(3)]
        t_r = [fl / triton.testing.do_bench(ref, warmup=10, rep=40) / 1e9 for _ in range(3)]
        addr = [t.data_ptr() % (1 << 20) // 1024 for t in (q, k, v)]
        print(str(dtype)[6:], trial, "ours", [round(x) for x in t_o], "fa4", [round(x) for x in t_r], "addr KiB mod 1MiB", addr, flush=True)
        del q, k, v
