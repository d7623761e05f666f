"""Step 3's softcap (Gemma 2's logit capping): the score softmax_scale * q.k becomes softcap * tanh(score / softcap)
before the mask and the softmax.

The kernels hold S = Q K^T. With softcap c on, apply_softcap replaces S in place by t = tanh(S * softmax_scale / c),
and the softmax exponentiates c * t: its scale_log2 is c * log2(e) where it is softmax_scale * log2(e) without
(softcap_scales; the reference's resolve_scale_log2 says the same). Everything after, the mask included, is as
without softcap, and LSE = c * m + log l comes out in the score's units.

The backward recomputes t the same way, and the gradient of S picks up the derivative of the cap: with dZ = P (dP - D)
the gradient of the capped score z = c t, dS = softmax_scale * (1 - t^2) * dZ. The kernels apply softmax_scale at the
end as without softcap, so softcap_grad multiplies dZ by 1 - t^2, with t read back from the fp32 P the step already
holds (P = exp2(t * scale_log2 - LSE * log2 e), so t = (log2 P + LSE * log2 e) / scale_log2) rather than kept in a
second fragment of registers across the dP GEMM; where P is 0 (the key is masked, or too far below the row's max to
count), dS is 0 whatever t is. With an ALiBi bias as well, P no longer tells t (the bias sits between them), so
those kernels keep t in a fragment of its own from before the bias and take the derivative from it
(softcap_grad_kept).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from flashcute.kernels.common.layout import acc_rows_cols
from flashcute.kernels.common.softmax import LOG2_E


def softcap_scales(softmax_scale: Float32, softcap: Float32 | None) -> tuple[Float32, Float32 | None]:
    """(scale_log2, multiplier): the softmax's exp2 scale, and apply_softcap's multiplier (None without softcap)."""
    if cutlass.const_expr(softcap is None):
        return softmax_scale * LOG2_E, None
    return softcap * LOG2_E, softmax_scale / softcap


@cute.jit
def apply_softcap(acc_S: cute.Tensor, multiplier: Float32):
    """S = tanh(S * multiplier) in place, multiplier = softmax_scale / softcap (tanh.approx: one MUFU.TANH an
    element)."""
    acc_S.store(cute.math.tanh(acc_S.load() * multiplier, fastmath=True))


@cute.jit
def softcap_grad(acc_P: cute.Tensor, acc_dS: cute.Tensor, lse_log2: cute.Tensor, scale_log2: Float32):
    """dS *= 1 - t^2 in place, row by row, t = (log2 P + LSE * log2 e) / scale_log2 (``lse_log2`` per row of the
    fragment, as recompute_probs took it); 0 where P is 0."""
    p, ds = acc_rows_cols(acc_P), acc_rows_cols(acc_dS)
    inv_scale = cute.arch.rcp_approx(scale_log2)
    for r in cutlass.range_constexpr(cute.size(lse_log2)):
        for c in cutlass.range_constexpr(cute.size(p.shape[1])):
            ds[r, c] = _capped_grad(p[r, c], ds[r, c], lse_log2[r], inv_scale)


@cute.jit
def softcap_grad_t(acc_Pt: cute.Tensor, acc_dSt: cute.Tensor, sLSE: cute.Tensor, tScS: cute.Tensor, scale_log2):
    """softcap_grad for S^T (rows are keys, columns are queries), LSE * log2 e per column from the Q tile's (block_m,)
    shared-memory slice, as recompute_probs_t read it."""
    p, ds = acc_rows_cols(acc_Pt), acc_rows_cols(acc_dSt)
    inv_scale = cute.arch.rcp_approx(scale_log2)
    for c in cutlass.range_constexpr(cute.size(p.shape[1])):
        lse_log2 = sLSE[tScS[0, c][1]]
        for r in cutlass.range_constexpr(cute.size(p.shape[0])):
            ds[r, c] = _capped_grad(p[r, c], ds[r, c], lse_log2, inv_scale)


@cute.jit
def keep_t(acc_S: cute.Tensor) -> cute.Tensor:
    """A copy of the capped S (t) in a fragment of its own, for softcap_grad_kept, taken before a bias moves S."""
    acc_t = cute.make_fragment_like(acc_S)
    acc_t.store(acc_S.load())
    return acc_t


@cute.jit
def softcap_grad_kept(acc_t: cute.Tensor, acc_dS: cute.Tensor):
    """dS *= 1 - t^2 in place, t kept from apply_softcap (same fragment layout as dS); where P is 0, dS is 0
    already."""
    t = acc_t.load()
    acc_dS.store(acc_dS.load() * (1.0 - t * t))


@cute.jit
def _capped_grad(p: Float32, ds: Float32, lse_log2: Float32, inv_scale: Float32) -> Float32:
    t = (cute.math.log2(p, fastmath=True) + lse_log2) * inv_scale
    return Float32(0.0) if p == 0.0 else ds * (1.0 - t * t)
