"""Counters in global memory that order the thread blocks adding into one tile: a block waits until the counter
reaches its place in a fixed order, adds, and moves the counter on (the deterministic Hopper backward's dQ).

The wait reads with acquire semantics and the step writes with release semantics at GPU scope, so what a block
added before its step is visible to the block that waited for it. The order must not deadlock: a block may wait
only for blocks launched before it, which are running or done, or for the few launched beside it that the GPU runs
at the same time (scheduler.ROTATION_SPAN).
"""

import cutlass.cute as cute
from cutlass import Int32
from cutlass._mlir.dialects import llvm


def _load_acquire(counter: cute.Pointer) -> Int32:
    address = counter.toint().ir_value()
    value = llvm.inline_asm(
        Int32.mlir_type, [address], "ld.global.acquire.gpu.b32 $0, [$1];", "=r,l", has_side_effects=True
    )
    return Int32(value)


@cute.jit
def wait_for(counter: cute.Pointer, value: Int32):
    """Spin until the int32 at ``counter`` equals ``value`` (one thread)."""
    seen = _load_acquire(counter)
    while seen != value:
        seen = _load_acquire(counter)


def step(counter: cute.Pointer):
    """Add 1 to the int32 at ``counter``, ordered after this thread's earlier writes (one thread)."""
    address = counter.toint().ir_value()
    llvm.inline_asm(
        None, [address, Int32(1).ir_value()], "red.release.gpu.global.add.s32 [$0], $1;", "l,r", has_side_effects=True
    )
