"""The backward's postprocess (sm_80 and newer): dQ = dQaccum * softmax_scale, cast to fp16 or bf16.

The dK/dV kernel adds dQ / softmax_scale across thread blocks with fp32 atomics into dQaccum; this kernel scales
and casts it. One thread block owns block_m rows of one (batch, head). Each thread owns 8 contiguous values of a
row per pass: two 16-byte fp32 loads become one 16-byte store of 8 fp16 or bf16 values, because the fp32 and the
16-bit tiled copies put every value on the same thread, so the conversion stays in registers.

Rows past seqlen_q and head-dim columns past the real head dim are neither read nor written.
"""

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Float32, Int32

from flashcute.kernels.common import copy as gcopy
from flashcute.kernels.common.dtypes import CUTLASS_DTYPES
from flashcute.kernels.common.limits import streaming_limits
from flashcute.kernels.common.prepost_config import BwdPostConfig


class FlashAttentionBackwardPostprocess:
    """dQ = dQaccum * softmax_scale in fp16 or bf16. Construct from a BwdPostConfig."""

    def __init__(self, config: BwdPostConfig):
        self.config = config
        self.dtype = CUTLASS_DTYPES[config.dtype]
        self.block_m = config.block_m
        self.head_dim_padded = config.head_dim_padded
        self.num_threads = config.num_warps * 32

    @staticmethod
    def can_implement(config: BwdPostConfig, arch: str) -> str | None:
        """None if the kernel can be built for ``config`` on target ``arch``, else the reason it cannot."""
        return streaming_limits(config, config.num_warps * 32)

    @cute.jit
    def __call__(
        self,
        mdQaccum: cute.Tensor,  # (batch, seqlen_q, nheads, head_dim) float32
        mdQ: cute.Tensor,  # (batch, seqlen_q, nheads, head_dim), the output
        softmax_scale: Float32,
        stream: cuda.CUstream,
    ):
        num_m_blocks = cute.ceil_div(mdQ.shape[1], self.block_m)
        values_per_thread = gcopy.COPY_BITS // self.dtype.width
        self.kernel(
            mdQaccum,
            mdQ,
            softmax_scale,
            num_m_blocks,
            gcopy.make_gmem_tiled_copy(Float32, self.head_dim_padded, self.num_threads, False, values_per_thread),
            gcopy.make_gmem_tiled_copy(self.dtype, self.head_dim_padded, self.num_threads, False),
        ).launch(grid=[num_m_blocks * mdQ.shape[2] * mdQ.shape[0], 1, 1], block=[self.num_threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(
        self,
        mdQaccum: cute.Tensor,
        mdQ: cute.Tensor,
        softmax_scale: Float32,
        num_m_blocks: Int32,
        gmem_tiled_copy_accum: cute.TiledCopy,
        gmem_tiled_copy: cute.TiledCopy,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nheads = mdQ.shape[2]
        m_block = bidx % num_m_blocks
        head_idx = (bidx // num_m_blocks) % nheads
        batch_idx = bidx // num_m_blocks // nheads
        head_dim = mdQ.shape[3]
        rows_left = mdQ.shape[1] - m_block * self.block_m
        check_hdim = not self.config.exact_head_dim
        tile = (self.block_m, self.head_dim_padded)
        coords = cute.make_identity_tensor(tile)

        # ---- dQaccum -> registers, two 16-byte loads a thread per pass
        thr_copy_accum = gmem_tiled_copy_accum.get_slice(tidx)
        gdQaccum = cute.local_tile(mdQaccum[batch_idx, None, head_idx, None], tile, (m_block, 0))
        tAgA = thr_copy_accum.partition_S(gdQaccum)
        tAcA = thr_copy_accum.partition_S(coords)
        tArA = cute.make_fragment_like(tAgA)
        gcopy.copy_rows(
            gmem_tiled_copy_accum,
            tAgA,
            tArA,
            tAcA,
            gmem_tiled_copy_accum.get_slice(0).partition_S(coords),
            gcopy.head_dim_predicate(tAcA, head_dim),
            rows_left,
            True,
            check_hdim,
            False,
        )

        # ---- dQ = dQaccum * softmax_scale, converted in registers, out with one 16-byte store a thread per pass
        thr_copy = gmem_tiled_copy.get_slice(tidx)
        gdQ = cute.local_tile(mdQ[batch_idx, None, head_idx, None], tile, (m_block, 0))
        tdQgdQ = thr_copy.partition_D(gdQ)
        tdQcdQ = thr_copy.partition_D(coords)
        tdQrdQ = cute.make_fragment_like(tdQgdQ)
        tdQrdQ.store((tArA.load() * softmax_scale).to(self.dtype))
        gcopy.copy_rows(
            gmem_tiled_copy,
            tdQrdQ,
            tdQgdQ,
            tdQcdQ,
            gmem_tiled_copy.get_slice(0).partition_D(coords),
            gcopy.head_dim_predicate(tdQcdQ, head_dim),
            rows_left,
            True,
            check_hdim,
            False,
        )
