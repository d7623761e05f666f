"""The Hopper kernel's tile order (kernels/common/scheduler.py), run on the CPU with Python ints."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flashcute.kernels.common.scheduler import (
    L2_BYTES,
    heads_per_section,
    tile_coords,
    tile_divisors,
)


@given(st.integers(1, 9), st.integers(1, 7), st.integers(1, 5), st.integers(1, 12), st.booleans())
def test_every_tile_exactly_once_longest_first(num_m_blocks, nheads, batch, section, precomputed):
    # precomputed: the divisors a kernel gets as arguments (tile_divisors), here as plain ints
    divisors = tile_divisors(num_m_blocks, nheads, batch, section) if precomputed else None
    count = num_m_blocks * nheads * batch
    tiles = [tile_coords(i, num_m_blocks, nheads, batch, section, divisors) for i in range(count)]
    assert sorted(tiles) == sorted((m, h, b) for m in range(num_m_blocks) for h in range(nheads) for b in range(batch))
    # inside each section the m_blocks never increase: the longest causal tiles go first
    size = min(section, nheads * batch)
    for start in range(0, len(tiles), size * num_m_blocks):
        m_blocks = [m for m, _, _ in tiles[start : start + size * num_m_blocks]]
        assert m_blocks == sorted(m_blocks, reverse=True)


def test_heads_per_section():
    assert L2_BYTES // (4096 * 512) == 25  # heads of 2 MB that fit ...
    assert heads_per_section(4096, 128) == 16  # ... rounded down to a power of two
    assert heads_per_section(4096, 64) == 32  # 50 fit
    assert heads_per_section(10**7, 256) == 1  # one head over L2 still makes a section


@given(st.integers(1, 1 << 20), st.sampled_from([32, 64, 96, 128, 192, 256]))
def test_heads_per_section_is_the_largest_power_of_two_that_fits(seqlen_k, head_dim):
    fit = max(L2_BYTES // (4 * head_dim) // seqlen_k, 1)
    section = heads_per_section(seqlen_k, head_dim)
    assert section & (section - 1) == 0 and section <= fit < 2 * section
