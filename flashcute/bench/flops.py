"""FLOP counts: the convention behind every TFLOP/s figure (design.md, "Performance method")."""

PASS_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
"""Work of each pass relative to the forward: the backward runs five matmuls to the forward's two."""
PASSES = tuple(PASS_FACTOR)
"""What a sweep can time: the forward, the backward alone (its forward outside the timing), or both."""


def attended_pairs(seqlen_q: int, seqlen_k: int, causal: bool) -> float:
    """The (query, key) pairs attention computes.

    Without a mask that is every pair. Under bottom-right causal masking (query i sees key j iff
    j <= i + seqlen_k - seqlen_q) it is counted as the area under that diagonal, so exactly half of the pairs
    when seqlen_q == seqlen_k, as flash-attention's benchmarks count it.
    """
    if not causal:
        return float(seqlen_q * seqlen_k)
    if seqlen_q <= seqlen_k:
        return seqlen_q * (seqlen_k - seqlen_q / 2)
    return seqlen_k * seqlen_k / 2


def attention_flops(
    batch: int,
    nheads: int,
    seqlen_q: int,
    seqlen_k: int,
    headdim: int,
    causal: bool,
    pass_: str = "fwd",
    headdim_v: int | None = None,
) -> float:
    """FLOPs of one pass: the forward is two matmuls per attended pair, Q Kᵀ of 2·headdim FLOPs and P V of
    2·headdim_v (v's head dim; None: headdim), so 2·batch·nheads·pairs·(headdim + headdim_v), which is
    4·batch·nheads·pairs·headdim when v has q's head dim. The backward counts PASS_FACTOR times the forward, as
    flash-attention's benchmarks count it with a v head dim of its own: its five matmuls (Q Kᵀ again, dO Vᵀ, Pᵀ dO,
    dS K, dSᵀ Q) are exactly 2.5 forwards only where the head dims agree (2·pairs·(3·headdim + 2·headdim_v) in all)."""
    pairs = attended_pairs(seqlen_q, seqlen_k, causal)
    headdim_v = headdim if headdim_v is None else headdim_v
    return 2.0 * batch * nheads * (headdim + headdim_v) * pairs * PASS_FACTOR[pass_]
