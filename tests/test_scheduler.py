"""The Hopper kernel's tile order (kernels/common/scheduler.py), run on the CPU with Python ints."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flashcute.kernels.common.scheduler import L2_BYTES, heads_per_section, tile_coords


@given(st.integers(1, 9), st.integers(1, 7), st.integers(1, 5), st.integers(1, 12))
def test_every_tile_exactly_once_longest_first(num_m_blocks, nheads, batch, section):
    tiles = [tile_coords(i, num_m_blocks, nheads, batch, section) for i in range(num_m_blocks * nheads * batch)]
    assert sorted(tiles) == sorted((m, h, b) for m in range(num_m_blocks) for h in range(nheads) for b in range(batch))
    # inside each section the m_blocks never increase: the longest causal tiles go first
    size = min(section, nheads * batch)
    for start in range(0, len(tiles), size * num_m_blocks):
        m_blocks = [m for m, _, _ in tiles[start : start + size * num_m_blocks]]
        assert m_blocks == sorted(m_blocks, reverse=True)


def test_heads_per_section():
    assert heads_per_section(4096, 128) == L2_BYTES // (4096 * 512)  # 25 heads of 2 MB
    assert heads_per_section(10**7, 256) == 1  # one head over L2 still makes a section
