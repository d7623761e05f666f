"""Views of mma.sync register fragments.

An SM80 16x8 accumulator fragment has shape ((2, 2), MMA_M, MMA_N): a thread holds 2 consecutive columns of
row r and the same 2 columns of row r + 8, in each of MMA_M x MMA_N atoms. Softmax works per row, so it reads the
fragment through a (rows, cols) view; P.V reuses the same registers as an A operand, which mma.sync 16x8x16 wants
as ((2, 2, 2), MMA_M, MMA_K): two neighbouring 16x8 C atoms make one 16x16 A atom.

A Hopper wgmma 64xN accumulator is the same pattern with the N/8 column blocks folded into the first mode,
((2, 2, N/8), MMA_M, MMA_N), and its (rows, cols) view is ((2, MMA_M), (2, N/8, MMA_N)).
"""

import math

import cutlass
import cutlass.cute as cute


def acc_rows_cols(acc: cute.Tensor) -> cute.Tensor:
    """View an accumulator fragment ((2, 2), MMA_M, MMA_N) as (rows, cols) = ((2, MMA_M), (2, MMA_N)), or a
    wgmma one ((2, 2, N/8), MMA_M, MMA_N) as ((2, MMA_M), (2, N/8, MMA_N))."""
    flat = cute.make_layout(acc.layout.shape)
    col_modes = (0, 2) if cute.rank(flat.shape[0]) == 3 else (0,)
    rows_cols = cute.make_layout(
        (
            (flat.shape[0][1], flat.shape[1]),
            (*(flat.shape[0][i] for i in col_modes), flat.shape[2]),
        ),
        stride=(
            (flat.stride[0][1], flat.stride[1]),
            (*(flat.stride[0][i] for i in col_modes), flat.stride[2]),
        ),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, rows_cols))


def acc_as_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """View a C fragment (4, MMA_M, MMA_N) as an A fragment ((4, 2), MMA_M, MMA_N / 2) of the next GEMM."""
    divided = cute.logical_divide(acc.layout, (None, None, 2))
    as_a = cute.make_layout(
        ((divided.shape[0], divided.shape[2][0]), divided.shape[1], divided.shape[2][1]),
        stride=((divided.stride[0], divided.stride[2][0]), divided.stride[1], divided.stride[2][1]),
    )
    return cute.make_tensor(acc.iterator, as_a)


def store_converted(src: cute.Tensor, dst: cute.Tensor):
    """dst = src in dst's element type, for two register fragments of one shape. LLVM converts a vector whose
    length is not a power of two one element at a time: the 40 values a thread holds of a 64x80 warpgroup tile took
    40 F2FP and 20 PRMT, where 20 F2FP convert them in pairs. Such a vector goes in chunks of 8 (in logical order);
    a power-of-two one in one piece, which LLVM converts in pairs itself (chunks there changed ptxas's register
    allocation of the spilling sm80 d128 kernel: 149 -> 153 spill instructions)."""
    n = cute.size(src)
    chunk = n if n & (n - 1) == 0 else math.gcd(n, 8)
    src_chunks = cute.logical_divide(src, cute.make_layout(chunk))
    dst_chunks = cute.logical_divide(dst, cute.make_layout(chunk))
    for i in range(n // chunk):
        dst_chunks[None, i].store(src_chunks[None, i].load().to(dst.element_type))


def converted(src: cute.Tensor, dtype: type[cutlass.Numeric]) -> cute.Tensor:
    """A new register fragment like ``src`` holding its values in ``dtype`` (see store_converted)."""
    dst = cute.make_fragment_like(src, dtype)
    store_converted(src, dst)
    return dst
