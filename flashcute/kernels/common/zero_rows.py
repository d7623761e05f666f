"""The rows of a packed batch's dK and dV that no sequence covers, zeroed (sm_80 and newer).

A packed backward's kernels write dK and dV for each sequence's keys, rows cu_seqlens_k[b] to cu_seqlens_k[b] +
min(cu_seqlens_k[b + 1] - cu_seqlens_k[b], seqused_k[b]) (kernels/common/seqlen.py, SeqLens.rows_of, which this
launch asks too), and no other row: not the rows past a sequence's seqused_k, nor those before cu_seqlens_k[0] or
past cu_seqlens_k[-1]. Their gradient is 0.
Zeroing all of dK and dV first (torch.zeros_like) wrote every byte of both once more; this launch writes only the
rows that need it, finding them on the device (no host sync, as a CUDA graph needs): docs/design.md, Packed
variable-length batches, has the measurement.

A warp owns 32 consecutive rows, one a lane: the lane finds its row's sequence by a binary search of cu_seqlens_k
and whether the row lies among its keys. A warp whose rows all do stops there (the common case: a few thousand
warps, each a few loads of lengths that the L1 cache holds); otherwise the warp zeroes each uncovered row in turn,
a 16-byte vector a lane, dK's and then dV's.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32

from flashcute.kernels.common.dtypes import CUTLASS_DTYPES
from flashcute.kernels.common.limits import DTYPES
from flashcute.kernels.common.prepost_config import VECTOR, ZeroRowsConfig
from flashcute.kernels.common.seqlen import SeqLens

NUM_WARPS = 4
"""Warps a thread block, 32 rows each."""
SEARCH_STEPS = 32
"""Binary-search steps, enough for any int32 count of sequences."""


class ZeroRowsOutsideSequences:
    """dK's and dV's rows that no sequence of a packed batch covers, zeroed. Construct from a ZeroRowsConfig."""

    def __init__(self, config: ZeroRowsConfig):
        self.config = config
        self.dtype = CUTLASS_DTYPES[config.dtype]

    @staticmethod
    def can_implement(config: ZeroRowsConfig, arch: str) -> str | None:
        """None if the kernel can be built for ``config`` on target ``arch``, else the reason it cannot."""
        if config.dtype not in DTYPES:
            return f"dtype {config.dtype!r} is not one of {DTYPES}"
        return None

    @cute.jit
    def __call__(
        self,
        mdK: cute.Tensor,  # (total_k, nheads_k * head_dim): dK's rows, each a whole number of 16-byte vectors
        mdV: cute.Tensor,  # (total_k, nheads_k * head_dim_v): dV's
        mCuSeqlens: cute.Tensor,  # (batch + 1,) int32: cu_seqlens_k
        mSeqUsed: cute.Tensor,  # (batch,) int32: seqused_k, or cu_seqlens_k[1:] where the caller gave none
        stream: cuda.CUstream,
    ):
        rows_per_block = NUM_WARPS * 32
        self.kernel(mdK, mdV, mCuSeqlens, mSeqUsed).launch(
            grid=[cute.ceil_div(mdK.shape[0], rows_per_block), 1, 1], block=[rows_per_block, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, mdK: cute.Tensor, mdV: cute.Tensor, mCuSeqlens: cute.Tensor, mSeqUsed: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        first_row = (bidx * NUM_WARPS + tidx // 32) * 32
        row = first_row + lane

        # ---- this lane's row: its sequence b, the last with cu_seqlens[b] <= row, and whether b's keys hold it
        batch = mCuSeqlens.shape[0] - 1
        lo, hi = Int32(0), batch + 1  # cu_seqlens[lo] <= row < cu_seqlens[hi], cu_seqlens[batch + 1] read as +inf
        for _ in cutlass.range(SEARCH_STEPS, unroll=1):
            if hi - lo > 1:
                mid = (lo + hi) // 2
                if mCuSeqlens[mid] <= row:
                    lo = mid
                else:
                    hi = mid
        covered = False
        if row >= mCuSeqlens[0] and lo < batch:
            start, length = SeqLens.rows_of(mCuSeqlens, mSeqUsed, lo)  # the rows the kernels write
            covered = row - start < length
        outside = row < mdK.shape[0] and not covered

        # ---- each of the warp's rows outside every sequence, zeroed by the whole warp
        if cute.arch.vote_any_sync(outside):
            copy_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
            zeros = cute.make_rmem_tensor((VECTOR,), self.dtype)
            zeros.fill(0.0)
            for i in cutlass.range(32, unroll=1):
                if cute.arch.shuffle_sync(Int32(outside), i) != 0:
                    for mX in (mdK, mdV):
                        for v in cutlass.range(lane, mX.shape[1] // VECTOR, 32, unroll=1):
                            cute.copy(copy_atom, zeros, cute.local_tile(mX[first_row + i, None], (VECTOR,), (v,)))
