"""Per-tile clock/globaltimer records (measurement only). Buffer address from TILE_TRACE_PTR; 8 int32 words a record:
[smid, clock_start, clock_end, ns_start, ns_end, clock_entry, ns_entry, 1]."""

import os

import cutlass.cute as cute
from cutlass import Int32
from cutlass._mlir.dialects import llvm

ADDR = int(os.environ.get("TILE_TRACE_PTR", "0"))
WORDS = 8


def _asm(text):
    return Int32(llvm.inline_asm(Int32.mlir_type, [], text, "=r", has_side_effects=True, is_align_stack=False))


def clock():
    return _asm("mov.u32 $0, %clock;")


def gtimer():
    return _asm("{ .reg .u64 t; mov.u64 t, %globaltimer; cvt.u32.u64 $0, t; }")


def smid():
    return _asm("mov.u32 $0, %smid;")


def _buf():
    ptr = cute.make_ptr(Int32, ADDR, cute.AddressSpace.gmem, assumed_align=4)
    return cute.make_tensor(ptr, cute.make_layout(1 << 24))


def make():
    return cute.make_rmem_tensor(2, Int32)


def begin(v):
    v[0] = clock()
    v[1] = gtimer()


@cute.jit
def end(v, index, writer):
    c1 = clock()
    n1 = gtimer()
    if writer:
        t = _buf()
        base = index * WORDS
        t[base + 0] = smid()
        t[base + 1] = v[0]
        t[base + 2] = c1
        t[base + 3] = v[1]
        t[base + 4] = n1
        t[base + 7] = Int32(1)


@cute.jit
def entry(index, writer):
    c = clock()
    n = gtimer()
    if writer:
        t = _buf()
        t[index * WORDS + 5] = c
        t[index * WORDS + 6] = n
