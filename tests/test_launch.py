"""The families' host-side launch steps that are plain torch, on the CPU."""

from __future__ import annotations

import math

import torch

from flashcute.kernels.sm90.family import padded_lse_log2


def test_padded_lse_log2_is_the_formula_it_replaces():
    """Bitwise the same as +inf padding and ``torch.where(lse == -inf, inf, lse * log2(e))``: finite values, a row
    that saw no key (-inf), an inf in K (+inf) and NaN; padded and not."""
    lse = torch.randn(2, 3, 37) * 20
    lse[0, 0, :4] = torch.tensor([-math.inf, math.inf, math.nan, 0.0])
    for rows in (37, 64):
        expected = torch.full((2, 3, rows), math.inf)
        expected[..., :37] = torch.where(lse == -math.inf, math.inf, lse * math.log2(math.e))
        got = padded_lse_log2(lse, rows)
        assert got.shape == expected.shape and torch.equal(got.isnan(), expected.isnan())
        assert torch.equal(got.nan_to_num(nan=7.0), expected.nan_to_num(nan=7.0))
