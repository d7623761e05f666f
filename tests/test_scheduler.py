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
    assert heads_per_section(4096, 4 * 128) == 16  # ... rounded down to a power of two (the forward's K and V)
    assert heads_per_section(4096, 4 * 64) == 32  # 50 fit
    assert heads_per_section(10**7, 4 * 256) == 1  # one head over L2 still makes a section
    # the backward's Q, dO and float32 dQ accumulator: at 1k queries and D=128, 1 MB a head, 32 heads (as
    # flash-attn-4's backward takes); Q and dO alone (64 heads) overflowed L2 with the accumulator beside them
    assert heads_per_section(1024, 8 * 128) == 32


@given(st.integers(1, 1 << 20), st.sampled_from([32, 64, 96, 128, 192, 256]), st.sampled_from([4, 8]))
def test_heads_per_section_is_the_largest_power_of_two_that_fits(rows, head_dim, bytes_per_element):
    fit = max(L2_BYTES // (bytes_per_element * head_dim) // rows, 1)
    section = heads_per_section(rows, bytes_per_element * head_dim)
    assert section & (section - 1) == 0 and section <= fit < 2 * section


def _walk(n_block, num_m_blocks, num_n_blocks):
    """The Q tiles K/V tile n_block visits, in order, in the deterministic backward without a mask."""
    start = rotation(n_block, num_m_blocks, num_n_blocks)
    return [rotated(r, start, num_m_blocks) for r in range(num_m_blocks)]


def _run(num_n_blocks, num_m_blocks, slots, place, walk=_walk):
    """Time steps until every K/V tile of one head has added into every Q tile's dQ: tiles start in launch order
    as slots free up, each adds into one Q tile a step when the Q tile's counter has reached its place (None if
    no tile can move: a deadlock)."""
    walks = [walk(n, num_m_blocks, num_n_blocks) for n in range(num_n_blocks)]
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


def _in_launch_order(n_block, num_m_blocks, num_n_blocks):
    """Every walk from the first Q tile (the order of a head too large to rotate)."""
    return list(range(num_m_blocks))


@settings(deadline=None, max_examples=50)  # (a draw steps up to 80 x 40 walks in Python)
@given(st.integers(1, 80), st.integers(1, 40))
def test_rotated_place_is_one_order_that_follows_the_walks(num_n_blocks, num_m_blocks):
    """Every Q tile sees its K/V tiles in one order (places 0 .. N - 1): in a head that rotates, the order their
    walks reach the Q tile (then by n_block); in a larger one, launch order, every walk from the first Q tile."""
    walks = [_walk(n, num_m_blocks, num_n_blocks) for n in range(num_n_blocks)]
    for walk in walks:
        assert sorted(walk) == list(range(num_m_blocks))
    if num_n_blocks > ROTATION_SPAN:
        assert all(walk == list(range(num_m_blocks)) for walk in walks)
    for m in range(num_m_blocks):
        places = [rotated_place(n, m, num_n_blocks, num_m_blocks) for n in range(num_n_blocks)]
        arrivals = sorted(range(num_n_blocks), key=lambda n: (walks[n].index(m), n))
        assert [places[n] for n in arrivals] == list(range(num_n_blocks))


@settings(deadline=None, max_examples=40)
@given(st.integers(1, 3 * ROTATION_SPAN), st.integers(1, 24), st.sampled_from([ROTATION_SPAN, 132]))
def test_rotated_walks_never_deadlock_and_do_not_queue(num_n_blocks, num_m_blocks, slots):
    """With as many slots as a rotating head has tiles (the fewest a Hopper GPU has) or an H200's 132 SMs, every
    tile finishes, never later than walks all from the first Q tile in launch order; when a head's tiles rotate
    and are no more than its Q tiles, they step together without waiting: M steps, where those queue for M + N - 1."""
    n, m = num_n_blocks, num_m_blocks
    steps = _run(n, m, slots, lambda k, q: rotated_place(k, q, n, m))
    in_order = _run(n, m, slots, lambda k, q: k, walk=_in_launch_order)
    assert steps is not None and steps <= in_order
    if n <= min(m, ROTATION_SPAN):
        assert steps == m and in_order == m + n - 1


def test_heads_too_large_to_rotate_keep_launch_order():
    """Rotated walks of two spans that wait for one another, stepped on the H200's 132 SMs, took 128 steps for 64
    K/V tiles over 64 Q tiles, 512 for 128 and 2048 for 256, where walks from the first Q tile in launch order take
    127, 255 and 635: a head of more K/V tiles than ROTATION_SPAN keeps launch order."""
    for n in (ROTATION_SPAN + 1, 64, 256):
        assert [rotation(k, n, n) for k in range(n)] == [0] * n
        assert all(rotated_place(k, q, n, n) == k for k in range(n) for q in (0, n // 2, n - 1))
    assert [rotation(k, 40, ROTATION_SPAN) for k in range(ROTATION_SPAN)] == list(range(ROTATION_SPAN))
