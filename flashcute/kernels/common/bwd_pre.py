"""The backward's preprocess (sm_80 and newer): D = rowsum(dO * O) per query row, and dQaccum zeroed.

dS = P * (dP - D) needs D for every query row before the dK/dV kernel starts. One thread block owns block_m rows
of one (batch, head): every thread loads 16-byte vectors of O and dO straight into registers (no shared memory:
each value is read once), multiplies and adds its share of a row in fp32, and the threads that share a row
finish the sum with butterfly shuffles; the thread holding column 0 writes D. When the dK/dV kernel adds dQ with
atomics, the same thread blocks also zero those rows of the fp32 accumulator, so no separate memset pass runs.

With ``early_next`` (sm_90 and newer) every thread block, once its loads are issued, lets the next kernel on the
stream start (programmatic dependent launch): the Hopper backward, launched so, loads K and V meanwhile and waits
for this grid to finish before it reads LSE and D (griddepcontrol.wait).

Rows past seqlen_q are not read. With ``lse_log2`` the same threads also write LSE * log2(e) per row into a second
tensor shaped like D, +inf where LSE = -inf (a row that saw no key: its recomputed P is then 0), and both may hold
more rows than seqlen_q (a backward that reads whole Q tiles of them): there D = 0 and LSE * log2(e) = +inf. These
are the statistics a tiled backward reads, made in this launch rather than by separate fix-ups. Head-dim columns past
the real head dim are predicated per vector and read as zero, so they add nothing to D.

With ``dlse`` (a loss used the returned LSE) D is written less that gradient, row by row (prepost.preprocess says
why). With ``sink`` each row's share of the learnable sinks' gradient, -exp(sink - LSE) * D, goes to a float32
tensor shaped like the LSE, which the host sums over batch and rows: the gradient of every head in one launch and
one reduction, in a fixed order, rather than a chain of tensor operations after the backward.
"""

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from flashcute.kernels.common import copy as gcopy
from flashcute.kernels.common.dtypes import CUTLASS_DTYPES
from flashcute.kernels.common.limits import streaming_limits
from flashcute.kernels.common.prepost_config import BwdPreConfig
from flashcute.kernels.common.softmax import LOG2_E


class FlashAttentionBackwardPreprocess:
    """D = rowsum(dO * O) in fp32 (and dQaccum zeroed, with ``clear_dq_accum``; LSE * log2(e), with
    ``lse_log2``; less dLSE, with ``dlse``; the sinks' gradient per row, with ``sink``). Construct from a
    BwdPreConfig."""

    def __init__(self, config: BwdPreConfig, early_next: bool = False):
        self.config = config
        self.early_next = early_next
        self.dtype = CUTLASS_DTYPES[config.dtype]
        self.block_m = config.block_m
        self.head_dim_padded = config.head_dim_padded
        self.num_threads = config.num_warps * 32

    @staticmethod
    def can_implement(config: BwdPreConfig, arch: str) -> str | None:
        """None if the kernel can be built for ``config`` on target ``arch``, else the reason it cannot."""
        return streaming_limits(config, config.num_warps * 32)

    @cute.jit
    def __call__(
        self,
        mO: cute.Tensor,  # (batch, seqlen_q, nheads, head_dim)
        mdO: cute.Tensor,  # (batch, seqlen_q, nheads, head_dim)
        mD: cute.Tensor,  # (batch, nheads, rows) float32, the output (rows > seqlen_q with config.lse_log2)
        mdQaccum: cute.Tensor | None,  # (batch, seqlen_q, nheads, head_dim) float32, zeroed; None: left alone
        mLSE: cute.Tensor | None,  # (batch, nheads, seqlen_q) float32, with config.lse_log2 or config.sink
        mLSElog2: cute.Tensor | None,  # (batch, nheads, rows) float32, the output, with config.lse_log2
        stream: cuda.CUstream,
        mdLSE: cute.Tensor | None = None,  # (batch, nheads, seqlen_q) float32, with config.dlse
        mSink: cute.Tensor | None = None,  # (nheads,) float32, with config.sink
        mSinkGrad: cute.Tensor | None = None,  # (batch, nheads, seqlen_q) float32, the output, with config.sink
    ):
        num_m_blocks = cute.ceil_div(mD.shape[2], self.block_m)
        self.kernel(
            mO,
            mdO,
            mD,
            mdQaccum,
            mLSE,
            mLSElog2,
            mdLSE,
            mSink,
            mSinkGrad,
            num_m_blocks,
            gcopy.make_gmem_tiled_copy(self.dtype, self.head_dim_padded, self.num_threads, False),
            gcopy.make_gmem_tiled_copy(Float32, self.head_dim_padded, self.num_threads, False),
        ).launch(
            grid=[num_m_blocks * mO.shape[2] * mO.shape[0], 1, 1],
            block=[self.num_threads, 1, 1],
            stream=stream,
            # the rows of dLSE and the sinks' loads in flight, which ptxas otherwise fits in 96 registers by spilling
            # a few (bf16 at head dims 96 to 256); a bound of one block an SM lifts that cap
            min_blocks_per_mp=1 if self.config.dlse or self.config.sink else 0,
        )

    @cute.kernel
    def kernel(
        self,
        mO: cute.Tensor,
        mdO: cute.Tensor,
        mD: cute.Tensor,
        mdQaccum: cute.Tensor | None,
        mLSE: cute.Tensor | None,
        mLSElog2: cute.Tensor | None,
        mdLSE: cute.Tensor | None,
        mSink: cute.Tensor | None,
        mSinkGrad: cute.Tensor | None,
        num_m_blocks: Int32,
        gmem_tiled_copy: cute.TiledCopy,
        gmem_tiled_copy_accum: cute.TiledCopy,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nheads = mO.shape[2]
        m_block = bidx % num_m_blocks
        head_idx = (bidx // num_m_blocks) % nheads
        batch_idx = bidx // num_m_blocks // nheads
        head_dim = mO.shape[3]
        rows_left = mO.shape[1] - m_block * self.block_m
        check_hdim = not self.config.exact_head_dim
        tile = (self.block_m, self.head_dim_padded)

        # ---- O and dO -> registers, 16 bytes a load; padded head-dim columns stay zero
        thr_copy = gmem_tiled_copy.get_slice(tidx)
        coords = cute.make_identity_tensor(tile)
        tOcO = thr_copy.partition_S(coords)
        t0OcO = gmem_tiled_copy.get_slice(0).partition_S(coords)
        pred_k = gcopy.head_dim_predicate(tOcO, head_dim)
        gO = cute.local_tile(mO[batch_idx, None, head_idx, None], tile, (m_block, 0))
        gdO = cute.local_tile(mdO[batch_idx, None, head_idx, None], tile, (m_block, 0))
        tOgO, tOgdO = thr_copy.partition_S(gO), thr_copy.partition_S(gdO)
        tOrO, tOrdO = cute.make_fragment_like(tOgO), cute.make_fragment_like(tOgdO)
        for src, dst in ((tOgO, tOrO), (tOgdO, tOrdO)):
            if cutlass.const_expr(check_hdim):
                dst.fill(0)
            gcopy.copy_rows(gmem_tiled_copy, src, dst, tOcO, t0OcO, pred_k, rows_left, True, check_hdim, False)
        if cutlass.const_expr(self.early_next):
            cute.arch.griddepcontrol_launch_dependents()

        # ---- dQaccum = 0 over the same rows, while the loads are in flight
        if cutlass.const_expr(mdQaccum is not None):
            thr_copy_accum = gmem_tiled_copy_accum.get_slice(tidx)
            gdQaccum = cute.local_tile(mdQaccum[batch_idx, None, head_idx, None], tile, (m_block, 0))
            tAgA = thr_copy_accum.partition_D(gdQaccum)
            tAcA = thr_copy_accum.partition_D(coords)
            zeros = cute.make_fragment_like(tAgA)
            zeros.fill(0.0)
            gcopy.copy_rows(
                gmem_tiled_copy_accum,
                zeros,
                tAgA,
                tAcA,
                gmem_tiled_copy_accum.get_slice(0).partition_D(coords),
                gcopy.head_dim_predicate(tAcA, head_dim),
                rows_left,
                True,
                check_hdim,
                False,
            )

        # ---- D = rowsum(dO * O): this thread's values of a row in fp32, then across the threads that share the
        # row (consecutive lanes); the one holding column 0 writes it (less dLSE), 0 in the rows past seqlen_q
        threads_per_row = self.head_dim_padded // (cute.size(tOrO, mode=[0]) * cute.size(tOrO, mode=[2]))
        gD = cute.local_tile(mD[batch_idx, head_idx, None], (self.block_m,), (m_block,))
        row_limit = rows_left - tOcO[0][0]
        rows = (self.block_m,)
        if cutlass.const_expr(self.config.dlse):
            gdLSE = cute.local_tile(mdLSE[batch_idx, head_idx, None], rows, (m_block,))
        if cutlass.const_expr(self.config.sink):
            gLSE = cute.local_tile(mLSE[batch_idx, head_idx, None], rows, (m_block,))
            gSinkGrad = cute.local_tile(mSinkGrad[batch_idx, head_idx, None], rows, (m_block,))
            sink = mSink[head_idx]
        for m in cutlass.range_constexpr(cute.size(tOrO, mode=[1])):
            products = tOrO[None, m, None].load().to(Float32) * tOrdO[None, m, None].load().to(Float32)
            d = products.reduce(cute.ReductionOp.ADD, Float32.zero, 0)
            d = cute.arch.warp_reduction_sum(d, threads_in_group=threads_per_row)
            row = t0OcO[0, m, 0][0]
            local_row = tOcO[0, m, 0][0]
            if tOcO[0][1] == 0 and row < row_limit:
                if cutlass.const_expr(self.config.dlse):
                    d -= gdLSE[local_row]
                if cutlass.const_expr(self.config.sink):
                    gSinkGrad[local_row] = self.sink_grad_share(sink, gLSE[local_row], d)
            if cutlass.const_expr(self.config.lse_log2):  # D and LSE * log2(e) over the padded rows
                padded_limit = mD.shape[2] - m_block * self.block_m - tOcO[0][0]
                if tOcO[0][1] == 0 and row < padded_limit:
                    inside = row < row_limit
                    gD[local_row] = d if inside else Float32(0.0)
                    row_in_head = m_block * self.block_m + local_row
                    self.store_lse_log2(mLSE, mLSElog2, batch_idx, head_idx, row_in_head, inside)
            elif tOcO[0][1] == 0 and row < row_limit:
                gD[local_row] = d

    @cute.jit
    def sink_grad_share(self, sink: Float32, lse: Float32, d: Float32) -> Float32:
        """-p * D, the row's share of its head's sink gradient, with p = exp(sink - LSE) the sink's probability in
        the row (LSE includes the sink, so p <= 1 wherever LSE is finite); 0 where p is NaN or +inf (a row with
        LSE = -inf: no key and a sink of -inf)."""
        p = cute.math.exp2((sink - lse) * LOG2_E, fastmath=False)
        share = Float32(0.0)
        if p < Float32.inf:
            share = -p * d
        return share

    @cute.jit
    def store_lse_log2(
        self, mLSE: cute.Tensor, mLSElog2: cute.Tensor, batch_idx: Int32, head_idx: Int32, row: Int32, inside
    ):
        """LSE * log2(e) of one row, +inf for a row that saw no key (LSE = -inf) or lies past seqlen_q; NaN and
        +inf as they are."""
        value = Float32.inf
        if inside:
            value = mLSE[batch_idx, head_idx, row] * Float32(math.log2(math.e))
        mLSElog2[batch_idx, head_idx, row] = Float32.inf if value == -Float32.inf else value
