"""A decoding step's writes before its attention (sm_80 and newer): the new keys and values into the cache, and the
split-KV chunks' key counts, in one launch.

flash_attn_with_kvcache writes each sequence's seqlen_new new keys and values at positions lengths[b] .. lengths[b]
+ seqlen_new - 1 of its cache, then attends to them. As tensor operations that was three launches (the positions'
add and one index_put_ for each cache) and two more for the split-KV chunks' key counts (an add and a clamp); on a
short cache a step costs about what its launches cost (docs/decoding.md). This kernel does all of it, reading
lengths on the device, so a step stays free of host syncs and can be captured in a CUDA graph.

Where a position lies (config.pages, config.batch_index): sequence b's cache row (cache_batch_idx[b], or b) at
position p, or the page block_table[b, p // page_size] at row p % page_size (page_size: the cache's second dim). A
write whose slot lies outside the cache (a position past the capacity, or a row or page index out of range) is
dropped: the caller keeps them inside (flash_attn's rule), and a slip writes nothing rather than another tensor's
memory.

Thread block r < batch * seqlen_new * nheads_k owns row r of the new keys, (b, i, h) flattened: one thread a
16-byte vector of the key row, then one a vector of the value row (at most 32 each: head dims up to 256). The
blocks past them write the key counts (config.counts), one (sequence, split) a thread: chunk s of sequence b starts
s * chunk keys in and holds max(lengths[b] + seqlen_new - s * chunk, 0) keys, which the attention kernels take as
a cap on the chunk's span (splitkv.SplitPlan.appended_chunks). With config.tail, sequence b's keys end at end =
lengths[b] + seqlen_new kept inside [0, seq_rows], its last min(end, tail_keys) are a tail that several query rows
see under a mask, and the chunks count only the keys before it; the thread of chunk 0 writes where the tail starts
(b * seq_rows + end - min(end, tail_keys): its launch's cu_seqlens_k, whose last entry, batch * seq_rows, sequence
0's thread writes) and how many keys it holds (splitkv.SplitPlan.appended_tail).
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32

from flashcute.kernels.common.dtypes import CUTLASS_DTYPES
from flashcute.kernels.common.limits import DTYPES
from flashcute.kernels.common.prepost_config import VECTOR, AppendConfig

NUM_THREADS = 64
"""A thread block's threads: the 16-byte vectors of a key row and a value row at the largest head dim, 256."""


class KvCacheAppend:
    """New keys and values into a cache, and split-KV key counts. Construct from an AppendConfig."""

    def __init__(self, config: AppendConfig):
        self.config = config
        self.dtype = CUTLASS_DTYPES[config.dtype]

    @staticmethod
    def can_implement(config: AppendConfig, arch: str) -> str | None:
        """None if the kernel can be built for ``config`` on target ``arch``, else the reason it cannot."""
        if config.dtype not in DTYPES:
            return f"dtype {config.dtype!r} is not one of {DTYPES}"
        if not config.keys and (config.pages or config.batch_index or not config.counts):
            return "a launch without keys writes the key counts alone: pages and batch_index off, counts on"
        if config.pages and config.batch_index:
            return "pages and batch_index both on: a paged cache has no cache rows to pick"
        if config.tail and (config.pages or config.batch_index or not config.counts):
            return "tail counts a cache by batch: pages and batch_index off, counts on"
        return None

    @cute.jit
    def __call__(
        self,
        mLengths: cute.Tensor,  # (batch,) int32: each sequence's keys before the new ones
        mK: cute.Tensor | None,  # (batch, seqlen_new, nheads_k, head_dim): the new keys, with config.keys
        mV: cute.Tensor | None,  # (batch, seqlen_new, nheads_k, head_dim_v): the new values, with config.keys
        mKc: cute.Tensor | None,  # (batch_cache or pages, seqlen_cache or page_size, nheads_k, head_dim): k_cache
        mVc: cute.Tensor | None,  # (batch_cache or pages, seqlen_cache or page_size, nheads_k, head_dim_v): v_cache
        mIndex: cute.Tensor | None,  # (batch,) int32: cache_batch_idx, with config.batch_index
        mTable: cute.Tensor | None,  # (batch, max_pages) int32: block_table, with config.pages
        mCounts: cute.Tensor | None,  # (batch, splits) int32, written: the chunks' key counts, with config.counts
        chunk: Int32,  # keys a split's chunk spans, with config.counts
        stream: cuda.CUstream,
        mTail: cute.Tensor | None,  # (2, batch + 1) int32, written: the tail's key starts and counts, with config.tail
        tail_keys: Int32,  # the keys of a full tail, with config.tail
        seq_rows: Int32,  # a sequence's rows of the cache, with config.tail
    ):
        rows = 0
        if cutlass.const_expr(self.config.keys):
            rows = mK.shape[0] * mK.shape[1] * mK.shape[2]
        count_blocks = 0
        if cutlass.const_expr(self.config.counts):
            count_blocks = cute.ceil_div(mCounts.shape[0] * mCounts.shape[1], NUM_THREADS)
        tail = (mTail, tail_keys, seq_rows)
        self.kernel(mLengths, mK, mV, mKc, mVc, mIndex, mTable, mCounts, chunk, *tail, rows).launch(
            grid=[rows + count_blocks, 1, 1], block=[NUM_THREADS, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        mLengths: cute.Tensor,
        mK: cute.Tensor | None,
        mV: cute.Tensor | None,
        mKc: cute.Tensor | None,
        mVc: cute.Tensor | None,
        mIndex: cute.Tensor | None,
        mTable: cute.Tensor | None,
        mCounts: cute.Tensor | None,
        chunk: Int32,
        mTail: cute.Tensor | None,
        tail_keys: Int32,
        seq_rows: Int32,
        rows: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        added = 0
        if cutlass.const_expr(self.config.keys):
            added = mK.shape[1]
            if bidx < rows:
                self.write_row(mLengths, mK, mV, mKc, mVc, mIndex, mTable, bidx, tidx)
        if cutlass.const_expr(self.config.counts):
            # ---- chunk s of sequence b: the keys from s * chunk on, up to lengths[b] + seqlen_new; (b, s) flattened
            # is thread j of the blocks past the rows
            splits = mCounts.shape[1]
            j = (bidx - rows) * NUM_THREADS + tidx
            if j >= 0 and j < mCounts.shape[0] * splits:
                b, s = j // splits, j % splits
                keys = mLengths[b] + added
                if cutlass.const_expr(self.config.tail):
                    # ---- the last min(end, tail_keys) of the keys are the tail's; the chunks count the rest
                    end = cutlass.min(cutlass.max(keys, 0), seq_rows)
                    in_tail = cutlass.min(end, tail_keys)
                    keys = end - in_tail
                    if s == 0:
                        mTail[0, b] = b * seq_rows + keys
                        mTail[1, b] = in_tail
                        if b == 0:
                            batch = mCounts.shape[0]
                            mTail[0, batch] = batch * seq_rows
                mCounts[b, s] = cutlass.max(keys - s * chunk, 0)

    @cute.jit
    def write_row(
        self,
        mLengths: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mKc: cute.Tensor,
        mVc: cute.Tensor,
        mIndex: cute.Tensor | None,
        mTable: cute.Tensor | None,
        row: Int32,
        tidx: Int32,
    ):
        # ---- the row's sequence, new key and head, and the cache slot of its position
        nheads_k, seqlen_new = mK.shape[2], mK.shape[1]
        head = row % nheads_k
        b, i = row // nheads_k // seqlen_new, row // nheads_k % seqlen_new
        position = mLengths[b] + i
        slot_rows = mKc.shape[1]  # a cache row's positions, or a page's rows
        cache_row, offset = b, position
        if cutlass.const_expr(self.config.batch_index):
            cache_row = mIndex[b]
        inside = position >= 0 and position < slot_rows
        if cutlass.const_expr(self.config.pages):
            page = cutlass.max(position, 0) // slot_rows
            cache_row = mTable[b, cutlass.min(page, mTable.shape[1] - 1)]  # (read inside the table, used if inside)
            offset = cutlass.max(position, 0) % slot_rows
            inside = position >= 0 and page < mTable.shape[1]
        inside = inside and cache_row >= 0 and cache_row < mKc.shape[0]

        # ---- one 16-byte vector a thread: the key row's, then the value row's
        key_vectors = mK.shape[3] // VECTOR
        copy_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        vector = cute.make_rmem_tensor((VECTOR,), self.dtype)
        if inside:
            if tidx < key_vectors:
                cute.copy(copy_atom, cute.local_tile(mK[b, i, head, None], (VECTOR,), (tidx,)), vector)
                gKc = cute.local_tile(mKc[cache_row, offset, head, None], (VECTOR,), (tidx,))
                cute.copy(copy_atom, vector, gKc)
            elif tidx < key_vectors + mV.shape[3] // VECTOR:
                t = tidx - key_vectors
                cute.copy(copy_atom, cute.local_tile(mV[b, i, head, None], (VECTOR,), (t,)), vector)
                cute.copy(copy_atom, vector, cute.local_tile(mVc[cache_row, offset, head, None], (VECTOR,), (t,)))
