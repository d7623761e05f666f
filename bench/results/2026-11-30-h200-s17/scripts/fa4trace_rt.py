"""Clock stamps for a patched copy of flash-attn-4's sm90 forward (measurement only, never committed upstream code).
Same six points as flashcute's trace-timeline branch. Buffer address and step count come from the environment."""

import os

import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass._mlir.dialects import llvm

STAMPS = 6
STEPS = int(os.environ.get("FA4_TRACE_STEPS", "120"))
ADDR = int(os.environ.get("FA4_TRACE_PTR", "0"))


def clock() -> Int32:
    return Int32(
        llvm.inline_asm(Int32.mlir_type, [], "mov.u32 $0, %clock;", "=r", has_side_effects=True, is_align_stack=False)
    )


class Trace:
    def __init__(self, wg, writer):
        self.stamps = cute.make_rmem_tensor(STAMPS, Int32)
        self.step = cute.make_rmem_tensor(1, Int32)
        self.step[0] = Int32(0)
        self.wg = wg
        self.writer = writer

    def stamp(self, i):
        self.stamps[i] = clock()

    @cute.jit
    def flush(self):
        step = self.step[0]
        bx, by, bz = cute.arch.block_idx()
        if (bx == 0) & (by == 0) & (bz == 0) & self.writer & (step < STEPS):
            ptr = cute.make_ptr(Int32, ADDR, cute.AddressSpace.gmem, assumed_align=4)
            t = cute.make_tensor(ptr, cute.make_layout(1 + 2 * STEPS * STAMPS))
            base = 1 + (self.wg * STEPS + step) * STAMPS
            for i in cutlass.range_constexpr(STAMPS):
                t[base + i] = self.stamps[i]
        self.step[0] = step + 1
