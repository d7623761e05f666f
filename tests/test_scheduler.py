"""The Hopper kernel's tile order (kernels/common/scheduler.py), run on the CPU with Python ints."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flashcute.kernels.common.scheduler import (
    L2_BYTES,
    ROTATION_SPAN,
    heads_per_section,
    rotated,
    rotated_place,
    rotation,
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


def _walk(n_block, num_m_blocks):
    """The Q tiles K/V tile n_block visits, in order, in the deterministic backward without a mask."""
    start = rotation(n_block, num_m_blocks)
    return [rotated(r, start, num_m_blocks) for r in range(num_m_blocks)]


def _run(num_n_blocks, num_m_blocks, slots, place, walk=_walk):
    """Time steps until every K/V tile of one head has added into every Q tile's dQ: tiles start in launch order
    as slots free up, each adds into one Q tile a step when the Q tile's counter has reached its place (None if
    no tile can move: a deadlock)."""
    walks = [walk(n, num_m_blocks) for n in range(num_n_blocks)]
    counters = [0] * num_m_blocks
    progress = [0] * num_n_blocks
    started, running, steps = 0, [], 0
    while any(p < num_m_blocks for p in progress):
        while started < num_n_blocks and len(running) < slots:
            running.append(started)
            started += 1
        moves = []
        for n in running:
            m = walks[n][progress[n]]
            if counters[m] == place(n, m):
                moves.append((n, m))
        if not moves:
            return None
        for n, m in moves:
            counters[m] += 1
            progress[n] += 1
        running = [n for n in running if progress[n] < num_m_blocks]
        steps += 1
    return steps


@settings(deadline=None, max_examples=50)  # (a draw steps up to 80 x 40 walks in Python)
@given(st.integers(1, 80), st.integers(1, 40))
def test_rotated_place_is_one_order_that_follows_the_walks(num_n_blocks, num_m_blocks):
    """Every Q tile sees its K/V tiles in one order (places 0 .. N - 1); spans go in launch order; inside a span, in
    the order their walks reach the Q tile (then by n_block)."""
    walks = [_walk(n, num_m_blocks) for n in range(num_n_blocks)]
    for walk in walks:
        assert sorted(walk) == list(range(num_m_blocks))
    for m in range(num_m_blocks):
        places = [rotated_place(n, m, num_n_blocks, num_m_blocks) for n in range(num_n_blocks)]
        assert sorted(places) == list(range(num_n_blocks))
        arrivals = sorted(range(num_n_blocks), key=lambda n: (n // ROTATION_SPAN, walks[n].index(m), n))
        assert [places[n] for n in arrivals] == list(range(num_n_blocks))


@settings(deadline=None, max_examples=40)
@given(st.integers(1, 3 * ROTATION_SPAN), st.integers(1, 24))
def test_rotated_walks_never_deadlock_and_do_not_queue(num_n_blocks, num_m_blocks):
    """With as many slots as a span (the fewest a Hopper GPU has), every tile finishes; when a head's tiles all
    run at once and are no more than its Q tiles, they step together without waiting: M steps, where walks that
    all start at the first Q tile, in launch order, queue for M + N - 1."""
    n, m = num_n_blocks, num_m_blocks
    steps = _run(n, m, ROTATION_SPAN, lambda k, q: rotated_place(k, q, n, m))
    assert steps is not None
    if n <= min(m, ROTATION_SPAN):
        assert steps == m
        assert _run(n, m, ROTATION_SPAN, lambda k, q: k, walk=lambda k, m: list(range(m))) == m + n - 1
