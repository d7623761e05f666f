"""Split-KV attention's last step (sm_80 and newer): the partial results of the key splits merged into O and LSE.

When few query rows attend to many keys (decoding), the keys of each sequence are cut into splits that thread
blocks walk in parallel (flashcute/splitkv.py); split s leaves a partial O_s, normalized over its own keys, and its
LSE_s. Over all the keys,

    LSE = log(sum_s exp(LSE_s)),    O = sum_s exp(LSE_s - LSE) * O_s,

computed in fp32 against the largest LSE_s (a split that saw no key has LSE_s = -inf and weight 0; a row that no
split saw gets O = 0 and LSE = -inf, as the attention kernels give it). With learnable sinks (config.sink), the
row's head's sink joins as one more split whose LSE_s is the sink and whose O_s is 0 (the attention kernels'
softmax.finalize does the same where keys are not split): a row that no split saw gets O = 0 and LSE = sink.

The partial rows are the grouped-query-packed rows of the split kernel: row r of sequence b and kv head h is the
query at position r // group and head h * group + r % group. The combine writes O and LSE straight into
flash_attn's layouts, so the packing costs no further copy. One thread owns a 16-byte vector of one row: it reads
the row's LSE_s (the threads of a row read the same words, served by L1), then adds its vector of each O_s.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32

from flashcute.kernels.common.dtypes import CUTLASS_DTYPES
from flashcute.kernels.common.limits import dtype_limits
from flashcute.kernels.common.prepost_config import VECTOR, CombineConfig
from flashcute.kernels.common.softmax import LN2, LOG2_E


def threads_per_row(head_dim_padded: int) -> int:
    """The threads that share a row: one per 16-byte vector, rounded up to a power of two (a warp holds whole
    rows); the ones past the head dim (12 vectors at 96, 24 at 192) idle."""
    return 1 << (head_dim_padded // VECTOR - 1).bit_length()


class SplitKvCombine:
    """O and LSE from the splits' partial O_s and LSE_s. Construct from a CombineConfig."""

    def __init__(self, config: CombineConfig):
        self.config = config
        self.dtype = CUTLASS_DTYPES[config.dtype]
        self.head_dim_padded = config.head_dim_padded
        self.num_threads = config.num_warps * 32
        self.threads_per_row = threads_per_row(config.head_dim_padded)
        self.block_m = self.num_threads // self.threads_per_row

    @staticmethod
    def can_implement(config: CombineConfig, arch: str) -> str | None:
        """None if the kernel can be built for ``config`` on target ``arch``, else the reason it cannot."""
        return dtype_limits(config)  # a row's threads (at most 32, a power of two) divide any number of warps

    @cute.jit
    def __call__(
        self,
        mOp: cute.Tensor,  # (batch, splits, seqlen_q * group, nheads_k, head_dim): the partial O_s
        mLSEp: cute.Tensor,  # (nheads_k, batch, splits, seqlen_q * group) float32: the partial LSE_s
        mO: cute.Tensor,  # (batch * seqlen_q, group, nheads_k, head_dim): out, flash_attn's layout seen by kv head
        mLSE: cute.Tensor,  # (batch, nheads_k, group, seqlen_q) float32: lse, flash_attn's layout seen by kv head
        stream: cuda.CUstream,
        mSink: cute.Tensor | None = None,  # (nheads_k, group) float32: learnable sinks, with config.sink
    ):
        num_m_blocks = cute.ceil_div(mOp.shape[0] * mOp.shape[2], self.block_m)
        self.kernel(mOp, mLSEp, mO, mLSE, mSink).launch(
            grid=[num_m_blocks, mOp.shape[3], 1], block=[self.num_threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(
        self, mOp: cute.Tensor, mLSEp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, mSink: cute.Tensor | None
    ):
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head_idx, _ = cute.arch.block_idx()
        row = m_block * self.block_m + tidx // self.threads_per_row  # (batch_idx, r) flattened
        vector_idx = tidx % self.threads_per_row
        num_splits, rows_per_seq, head_dim = mOp.shape[1], mOp.shape[2], mOp.shape[4]
        group, seqlen_q = mO.shape[1], mLSE.shape[3]
        batch_idx, r = row // rows_per_seq, row % rows_per_seq
        if row < mOp.shape[0] * rows_per_seq:
            # ---- the largest LSE_s of the row, the sink's among them (0 when every split is empty and there is no
            # sink, so that no -inf - -inf arises)
            sink = mSink[head_idx, row % group] if cutlass.const_expr(self.config.sink) else None
            lse_max = -Float32.inf if cutlass.const_expr(sink is None) else sink
            for s in cutlass.range(num_splits):
                lse_max = cute.arch.fmax(lse_max, mLSEp[head_idx, batch_idx, s, r])
            lse_max = lse_max if lse_max != -Float32.inf else Float32(0.0)

            # ---- sum_s w_s and sum_s w_s * O_s in fp32, w_s = exp(LSE_s - lse_max): the difference is taken before
            # the scaling, so that the largest term's weight is exactly 1 (an FFMA of LSE_s * log2(e) - lse_max *
            # log2(e) leaves the rounding of the second product), and a row that only the sink saw gets LSE = sink
            owns_vector = vector_idx * VECTOR < head_dim  # always, at an exact head dim
            copy_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
            partial = cute.make_rmem_tensor((VECTOR,), self.dtype)
            acc = cute.make_rmem_tensor((VECTOR,), Float32)
            acc.fill(0.0)
            weight_sum = Float32(0.0)
            if cutlass.const_expr(sink is not None):  # a split with O_s = 0
                weight_sum = cute.math.exp2((sink - lse_max) * LOG2_E, fastmath=True)
            for s in cutlass.range(num_splits):
                weight = cute.math.exp2((mLSEp[head_idx, batch_idx, s, r] - lse_max) * LOG2_E, fastmath=True)
                weight_sum += weight
                if owns_vector:
                    gOp = cute.local_tile(mOp[batch_idx, s, r, head_idx, None], (VECTOR,), (vector_idx,))
                    cute.copy(copy_atom, gOp, partial)
                    acc.store(acc.load() + weight * partial.load().to(Float32))

            # ---- O = the weighted sum / sum_s w_s (0 for a row no split saw), LSE = lse_max + log(sum_s w_s)
            inv_sum = Float32(0.0) if weight_sum == 0.0 else cute.arch.rcp_approx(weight_sum)
            bl, g = row // group, row % group  # row = (batch_idx * seqlen_q + position) * group + g
            if owns_vector:
                out = cute.make_rmem_tensor((VECTOR,), self.dtype)
                out.store((acc.load() * inv_sum).to(self.dtype))
                cute.copy(copy_atom, out, cute.local_tile(mO[bl, g, head_idx, None], (VECTOR,), (vector_idx,)))
            if vector_idx == 0:
                lse = -Float32.inf
                if weight_sum > 0.0:
                    lse = lse_max + cute.math.log2(weight_sum, fastmath=True) * LN2
                mLSE[bl // seqlen_q, head_idx, g, bl % seqlen_q] = lse
