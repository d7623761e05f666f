"""The kernels' tile skipping, run on the CPU and held to the spec's visibility mask.

TileInfo is the code the kernels trace (with Int32 sizes); given Python ints it runs here. For any lengths, tile
sizes, causal alignment and window: every K/V tile a Q tile needs is in its range (and vice versa for the
backward's range of Q tiles), and the tiles the main loop runs without a mask are wholly visible to every row.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flashcute.interface import kernel_window
from flashcute.kernels.common.tile_info import TileInfo
from flashcute.reference import visibility_mask
from flashcute.validation import validate_attention_args

windows = st.one_of(st.just(-1), st.integers(0, 300), st.just(2**31 - 1))
problems = st.fixed_dictionaries(
    {
        "seqlen_q": st.integers(1, 500),
        "seqlen_k": st.integers(1, 500),
        "block_m": st.sampled_from([16, 64, 128]),
        "block_n": st.sampled_from([16, 32, 64, 128]),
        "causal": st.booleans(),
        "causal_align": st.sampled_from(["bottom_right", "top_left"]),
        "window_size": st.tuples(windows, windows),
    }
)


def setup(p):
    shape = SimpleNamespace
    args = validate_attention_args(
        shape(shape=(1, p["seqlen_q"], 1, 8)),
        shape(shape=(1, p["seqlen_k"], 1, 8)),
        shape(shape=(1, p["seqlen_k"], 1, 8)),
        causal=p["causal"],
        causal_align=p["causal_align"],
        window_size=p["window_size"],
    )
    left, right = kernel_window(args)
    info = TileInfo(
        p["block_m"],
        p["block_n"],
        right >= 0,
        left >= 0,
        args.seqlen_q,
        args.seqlen_k,
        args.diagonal_offset,
        left,
        right,
    )
    visible = visibility_mask(args, np.arange(args.seqlen_q), np.arange(args.seqlen_k))
    return info, visible


def needed_tiles(block: np.ndarray, size: int) -> set[int]:
    """Indices of the size-wide slices of axis 1 of ``block`` holding at least one True."""
    return {n for n in range(-(-block.shape[1] // size)) if block[:, n * size : (n + 1) * size].any()}


@settings(max_examples=300, deadline=None)
@given(problems)
def test_forward_visits_every_needed_tile_and_masks_every_partial_one(p):
    info, visible = setup(p)
    bm, bn = p["block_m"], p["block_n"]
    for m_block in range(-(-p["seqlen_q"] // bm)):
        rows = visible[m_block * bm : (m_block + 1) * bm]
        n_min, n_max = info.n_block_range(m_block)
        assert n_min >= 0 and n_max <= -(-p["seqlen_k"] // bn)
        assert needed_tiles(rows, bn) <= set(range(n_min, n_max))
        if n_max <= n_min:
            continue
        left_end, right_start = info.masked_runs(m_block, n_min, n_max)
        assert n_min <= left_end <= right_start <= n_max - 1
        if not info.mask_left:
            assert left_end == n_min  # the kernel has no left-masked run then
        for n_block in range(left_end, right_start):  # run without any mask: every row sees every key
            assert (n_block + 1) * bn <= p["seqlen_k"]
            assert rows[:, n_block * bn : (n_block + 1) * bn].all()


@settings(max_examples=300, deadline=None)
@given(problems)
def test_backward_visits_every_q_tile_that_sees_a_kv_tile(p):
    info, visible = setup(p)
    bm, bn = p["block_m"], p["block_n"]
    for n_block in range(-(-p["seqlen_k"] // bn)):
        cols = visible[:, n_block * bn : (n_block + 1) * bn].T  # (keys, queries)
        m_min, m_max = info.m_block_range(n_block)
        assert m_min >= 0 and m_max <= -(-p["seqlen_q"] // bm)
        assert needed_tiles(cols, bm) <= set(range(m_min, m_max))


@settings(max_examples=300, deadline=None)
@given(problems)
def test_backward_masks_every_partial_q_tile(p):
    info, visible = setup(p)
    bm, bn = p["block_m"], p["block_n"]
    for n_block in range(-(-p["seqlen_k"] // bn)):
        m_min, m_max = info.m_block_range(n_block)
        if m_max <= m_min:
            continue
        free_start, free_end = info.masked_m_runs(n_block, m_min, m_max)
        assert m_min <= free_start <= free_end <= m_max
        for m_block in range(free_start, free_end):  # run without any mask: every real row sees every key
            assert (n_block + 1) * bn <= p["seqlen_k"]
            assert visible[m_block * bm : (m_block + 1) * bm, n_block * bn : (n_block + 1) * bn].all()


def walked_q_tiles(info: TileInfo, p):
    """(m_block, n_block_min, n_block_max) of each Q tile that visits a K/V tile."""
    for m_block in range(-(-p["seqlen_q"] // p["block_m"])):
        n_min, n_max = info.n_block_range(m_block)
        if n_max > n_min:
            yield m_block, n_min, n_max


@settings(max_examples=300, deadline=None)
@given(problems)
def test_hopper_forward_walk_visits_each_tile_once_masking_the_partial_ones(p):
    """TileInfo.visit_runs, the order the Hopper forward's producer loads and its consumers walk the K/V tiles."""
    info, visible = setup(p)
    bm, bn = p["block_m"], p["block_n"]
    for m_block, n_min, n_max in walked_q_tiles(info, p):
        walk = [(n_max - 1, True)]  # the first tile, always masked
        for first, count, masked, side, direction in info.visit_runs(m_block, n_min, n_max):
            assert side == 0 and direction == -1
            walk += [(first - i, masked) for i in range(count)]
        assert sorted(n for n, _ in walk) == list(range(n_min, n_max))
        rows = visible[m_block * bm : (m_block + 1) * bm]
        for n_block, masked in walk:
            if not masked:  # every row sees every key of the tile
                assert (n_block + 1) * bn <= p["seqlen_k"] and rows[:, n_block * bn : (n_block + 1) * bn].all()


@settings(max_examples=300, deadline=None)
@given(problems)
def test_alibi_sides_split_the_free_run_at_the_diagonal(p):
    """visit_runs with sides (ALiBi's linear form): the same tiles (the producer loads them in the walk's order),
    each free tile of side +1 holding only keys at or before every row's diagonal key i + diag_offset, of side -1
    only keys at or after it, the rows past seqlen_q included (the kernel biases them too), the exact form
    only on the few tiles the diagonal crosses, and each side walked away from the diagonal (where the bias
    falls, so that the kept max rarely moves)."""
    info, _ = setup(p)
    bm, bn = p["block_m"], p["block_n"]
    for m_block, n_min, n_max in walked_q_tiles(info, p):
        plain = [
            (first - i, masked)
            for first, count, masked, _, _ in info.visit_runs(m_block, n_min, n_max)
            for i in range(count)
        ]
        sided = [
            (first + direction * i, masked, side)
            for first, count, masked, side, direction in info.visit_runs(m_block, n_min, n_max, True)
            for i in range(count)
        ]
        assert sorted(n for n, _, _ in sided) == sorted(n for n, _ in plain)
        # a tile masked without sides is masked with them; under a right mask the free tiles are all left of it
        assert {n for n, masked in plain if masked} <= {n for n, masked, _ in sided if masked}
        assert not info.mask_right or all(side == 1 for _, masked, side in sided if not masked)
        # the exact form only where the diagonal runs through the tile: at most the tiles a block_m span touches
        assert sum(1 for _, masked, side in sided if not masked and side == 0) <= -(-bm // bn) + 1
        # the free walk moves away from the diagonal: across it first, then each side outwards
        free = [(n, side) for n, masked, side in sided if not masked]
        sides = [side for _, side in free]
        assert sides == sorted(sides, key=lambda side: abs(side))
        for outwards in (-1, 1):
            walked = [n for n, side in free if side == outwards]
            assert walked == sorted(walked, reverse=outwards > 0)
        diagonal = np.arange(m_block * bm, (m_block + 1) * bm)[:, None] + info.diag_offset
        for n_block, masked, side in sided:
            keys = np.arange(n_block * bn, (n_block + 1) * bn)[None, :]
            assert side == 0 or not masked
            if side > 0:
                assert (keys <= diagonal).all()
            if side < 0:
                assert (keys >= diagonal).all()
