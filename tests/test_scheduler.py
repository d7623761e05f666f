"""The Hopper kernel's tile order (kernels/common/scheduler.py), run on the CPU with Python ints."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flashcute.kernels.common.scheduler import (
    L2_BYTES,
    heads_per_section,
    persistent_tile,
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
    assert heads_per_section(4096, 128, power_of_two=False) == 25  # the persistent grid's sections
    assert heads_per_section(10**7, 256) == 1  # one head over L2 still makes a section


@given(st.integers(1, 1 << 20), st.sampled_from([32, 64, 96, 128, 192, 256]))
def test_heads_per_section_is_the_largest_power_of_two_that_fits(seqlen_k, head_dim):
    fit = max(L2_BYTES // (4 * head_dim) // seqlen_k, 1)
    section = heads_per_section(seqlen_k, head_dim)
    assert section & (section - 1) == 0 and section <= fit < 2 * section
    assert heads_per_section(seqlen_k, head_dim, power_of_two=False) == fit


@given(st.integers(1, 200), st.integers(1, 40))
def test_persistent_rounds_cover_every_tile_once(num_tiles, grid_size):
    taken = []
    for block in range(grid_size):
        round_idx = 0
        while (tile := persistent_tile(block, round_idx, grid_size)) < num_tiles:
            taken.append(tile)
            round_idx += 1
    assert sorted(taken) == list(range(num_tiles))


def test_snake_balances_sorted_lengths():
    """Tiles sorted longest first (length 64 down to 1), 8 blocks: the snake gives every block the same total."""
    lengths = list(range(64, 0, -1))
    totals = [sum(lengths[persistent_tile(b, r, 8)] for r in range(8)) for b in range(8)]
    assert len(set(totals)) == 1
