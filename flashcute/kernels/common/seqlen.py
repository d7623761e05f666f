"""Step 1's other half: where one sequence of the batch sits in the tensors, and how long it is.

A dense batch holds every sequence at the same length in a (batch, seqlen, heads, head_dim) tensor. A packed
variable-length batch (flash_attn_varlen_func) holds them one after another in a (1, total, heads, head_dim) view:
sequence b's rows are [cu_seqlens[b], cu_seqlens[b + 1]), of which its first seqused[b] count (the host passes
cu_seqlens[1:] as seqused when the caller gives none: min(cu_seqlens[b + 1] - cu_seqlens[b], cu_seqlens[b + 1]) is
then the whole range). Its causal diagonal is its own bottom-right one, seqlen_k - seqlen_q of its two lengths,
which the kernel adds to the host's diag_offset (0 for packed batches).

The kernels take the packed batch's tensors as Optional arguments: None (a dense batch) compiles none of this.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32


class SeqLens:
    """Sequence ``batch_idx``'s offsets into the packed tensors (0 for a dense batch) and its lengths."""

    def __init__(
        self,
        batch_idx: Int32,
        seqlen_q: Int32,
        seqlen_k: Int32,
        diag_offset: Int32,
        mCuSeqlensQ: cute.Tensor | None = None,
        mCuSeqlensK: cute.Tensor | None = None,
        mSeqUsedQ: cute.Tensor | None = None,
        mSeqUsedK: cute.Tensor | None = None,
    ):
        self.batch_idx = batch_idx
        self.packed = mCuSeqlensQ is not None
        if cutlass.const_expr(self.packed):
            self.offset_q, self.seqlen_q = self.rows_of(mCuSeqlensQ, mSeqUsedQ, batch_idx)
            self.offset_k, self.seqlen_k = self.rows_of(mCuSeqlensK, mSeqUsedK, batch_idx)
            self.diag_offset = diag_offset + self.seqlen_k - self.seqlen_q
        else:
            self.offset_q, self.seqlen_q = Int32(0), seqlen_q
            self.offset_k, self.seqlen_k = Int32(0), seqlen_k
            self.diag_offset = diag_offset

    @staticmethod
    def rows_of(mCuSeqlens: cute.Tensor, mSeqUsed: cute.Tensor, batch_idx: Int32):
        """(start, length): where sequence ``batch_idx`` starts in the packed rows and how many of its rows count."""
        start = mCuSeqlens[batch_idx]
        end = mCuSeqlens[batch_idx + 1]
        return start, cutlass.min(end - start, mSeqUsed[batch_idx])

    def rows_q(self, mX: cute.Tensor, head_idx: Int32, seq_mode: int = 1) -> cute.Tensor:
        """This sequence's (seqlen, head_dim) slice of head ``head_idx`` of a q-like (batch, seqlen, heads,
        head_dim) tensor, or with ``seq_mode=0`` of a TMA view (seqlen, head_dim, heads, batch)."""
        return self._head(self.heads_q(mX, seq_mode), head_idx, seq_mode)

    def rows_k(self, mX: cute.Tensor, head_idx: Int32, seq_mode: int = 1) -> cute.Tensor:
        """As rows_q, for k-like tensors (k, v, dk, dv)."""
        return self._head(self.heads_k(mX, seq_mode), head_idx, seq_mode)

    def heads_q(self, mX: cute.Tensor, seq_mode: int = 1) -> cute.Tensor:
        """This sequence's rows of every head: (seqlen, heads, head_dim), or (seqlen, head_dim, heads) with
        ``seq_mode=0``. (A loop over heads slices this, made before it: the DSL carries no Python object through
        a run-time loop.)"""
        return self._sequence(mX, seq_mode, self.offset_q)

    def heads_k(self, mX: cute.Tensor, seq_mode: int = 1) -> cute.Tensor:
        """As heads_q, for k-like tensors."""
        return self._sequence(mX, seq_mode, self.offset_k)

    def row_stats(self, mX: cute.Tensor, head_idx: Int32, offset: Int32 | None = None) -> cute.Tensor:
        """This sequence's (seqlen,) row of head ``head_idx`` of a (batch, heads, seqlen) float32 tensor (LSE, D),
        at ``offset`` rows into a packed one (default: its Q offset)."""
        return self.heads_stats(mX, offset)[head_idx, None]

    def heads_stats(self, mX: cute.Tensor, offset: Int32 | None = None) -> cute.Tensor:
        """As row_stats for every head: (heads, seqlen)."""
        if cutlass.const_expr(not self.packed):
            return mX[self.batch_idx, None, None]
        return cute.domain_offset((0, self.offset_q if offset is None else offset), mX[0, None, None])

    def _sequence(self, mX: cute.Tensor, seq_mode: int, offset: Int32) -> cute.Tensor:
        batch = (self.batch_idx, None, None, None) if seq_mode == 1 else (None, None, None, self.batch_idx)
        if cutlass.const_expr(not self.packed):
            return mX[batch]
        first = (0, None, None, None) if seq_mode == 1 else (None, None, None, 0)
        return cute.domain_offset((offset, 0, 0), mX[first])

    @staticmethod
    def _head(mX: cute.Tensor, head_idx: Int32, seq_mode: int) -> cute.Tensor:
        return mX[None, head_idx, None] if seq_mode == 1 else mX[None, None, head_idx]
