"""Step 1's order: which (m_block, head, batch) tile a thread block takes, longest first, in L2-sized sections.

The grid is one-dimensional (no 65535 limit on batch x heads), and the hardware starts thread blocks roughly in
index order. Two things follow from the order chosen here:
- Longest processing time first: under a causal mask the Q tiles at the end of the sequence visit the most K/V
  tiles, so block index 0 takes the last m_block. Long tiles start early and short ones fill the gaps at the end.
- L2 reuse: the (batch, head) pairs are cut into sections of ``section`` heads whose K and V fit in L2 together,
  and a section's tiles are handed out m_block-major, so the thread blocks running at one time read the K/V of a
  few heads, not of all of them.
The Hopper forward is persistent: a grid of one thread block per SM starts on tiles 0 .. G - 1 and each block
then claims the next tile in this order from a global counter as it finishes one, so longest first also holds
across blocks that run at different speeds.
The Hopper backward orders its (n_block, kv head, batch) tiles with the same tile_coords, n_block counted from
the first: there the first K/V tiles are seen by the most Q tiles. Its deterministic kernels without a mask also
rotate each K/V tile's walk over the Q tiles (rotated_place) where a head's K/V tiles all run at once, so that
they, which start side by side, do not all queue for the same Q tile's dQ.
Plain Python arithmetic, like TileInfo: Int32 values in a kernel, ints in tests/test_scheduler.py.
"""

from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
from cutlass import Int32

L2_BYTES = 50 * 1024 * 1024  # H100 and H200 both have 50 MB of L2


def heads_per_section(rows, bytes_per_row: int):
    """How many heads of ``rows`` rows of ``bytes_per_row`` bytes each (the forward: K and V, 4 * head_dim bytes a
    key; the backward: Q, dO and the float32 dQ accumulator, 8 * head_dim bytes a query) fit in L2 together, at
    least 1, rounded down to a power of two (FlashAttention's rule, which leaves room for what else passes through
    L2; sections that fill L2 to the brim read twice the DRAM bytes: docs/tuning-sm90.md, L2 sections). (Divides
    rather than multiplies, so a long sequence cannot overflow Int32.)"""
    fit = cutlass.max(L2_BYTES // bytes_per_row // rows, 1)
    for shift in (1, 2, 4, 8, 16):  # every bit below the highest set, then keep only the highest
        fit = fit | (fit >> shift)
    return fit - (fit >> 1)


def tile_divisors(num_m_blocks, nheads, batch, section, make=lambda divisor: divisor) -> SimpleNamespace:
    """What tile_coords divides by: the tiles of a section, the pairs of a full section and of the last one (the
    remainder of the pairs, or a full section), the number of heads. ``make`` wraps each divisor: on the host side
    of a kernel launch cute.FastDivmodDivisorV2, so that the kernel divides by multiply and shift (a run-time
    integer division is a reciprocal and a dozen fix-ups: eight of them took 216 SASS instructions a tile)."""
    num_pairs = nheads * batch
    section = cutlass.min(section, num_pairs)
    return SimpleNamespace(
        tiles=make(section * num_m_blocks),
        section=make(section),
        last=make(num_pairs - (num_pairs - 1) // section * section),
        nheads=make(nheads),
    )


def tile_coords(block_idx, num_m_blocks, nheads, batch, section, divisors: SimpleNamespace | None = None):
    """(m_block, head_idx, batch_idx) of thread block ``block_idx`` of num_m_blocks * nheads * batch.

    Sections of ``section`` (batch, head) pairs, in order; the last may be smaller. Inside a section, block index
    j takes m_block num_m_blocks - 1 - j // size of the pair j % size. Without ``divisors`` (tile_divisors) it
    divides by each run-time value as it comes; with them it divides by both section sizes and keeps the quotient
    of the one that applies (a select, not a branch).
    """
    num_pairs = nheads * batch
    section = cutlass.min(section, num_pairs)
    div = divisors or SimpleNamespace(tiles=section * num_m_blocks, nheads=nheads)
    section_idx, within = _divmod(block_idx, div.tiles)
    if divisors is None:
        rank, slot = _divmod(within, cutlass.min(section, num_pairs - section_idx * section))
    else:
        full = (section_idx + 1) * section <= num_pairs
        (rank, slot), (rank_last, slot_last) = _divmod(within, div.section), _divmod(within, div.last)
        rank, slot = _pick(full, rank, rank_last), _pick(full, slot, slot_last)
    batch_idx, head_idx = _divmod(section_idx * section + slot, div.nheads)
    return num_m_blocks - 1 - rank, head_idx, batch_idx


def _divmod(dividend, divisor):
    """(quotient, remainder) by an int, an Int32 or a cute.FastDivmodDivisorV2."""
    if isinstance(divisor, cute.FastDivmodDivisor):
        return divmod(dividend, divisor)
    return dividend // divisor, dividend % divisor


def _pick(cond, if_true, if_false):
    """if_true where cond holds, else if_false: a Python choice for bools, a select for run-time values."""
    if isinstance(cond, bool):
        return if_true if cond else if_false
    return Int32(cutlass.select_(cond, if_true, if_false))


ROTATION_SPAN = 32
"""The most K/V tiles of a head whose walks rotate in the deterministic backward: every Hopper GPU holds 32 of its
thread blocks at once (one an SM), so a head's tiles, which wait for each other, are all running (with 128-key
tiles a head up to 4k keys). A head with more walks its tiles from the first Q tile in launch order, which keeps
them a step apart instead (tests/test_scheduler.py steps both: rotated spans that wait for one another take up to
3x as long)."""


def rotates(num_n_blocks):
    """Whether a head of num_n_blocks K/V tiles rotates its walks (ROTATION_SPAN)."""
    return num_n_blocks <= ROTATION_SPAN


def rotation(n_block, num_m_blocks, num_n_blocks):
    """Where K/V tile n_block's walk starts among its num_m_blocks Q tiles (> 0): its place among the head's
    num_n_blocks tiles, wrapped, or the first Q tile where the head does not rotate."""
    return _pick(rotates(num_n_blocks), n_block % num_m_blocks, 0)


def rotated(r, start, num_m_blocks):
    """The r-th Q tile (0-based) of a walk that starts at Q tile ``start`` and wraps (both below num_m_blocks)."""
    q_tile = r + start
    return _pick(q_tile >= num_m_blocks, q_tile - num_m_blocks, q_tile)


def rotated_place(n_block, m_block, num_n_blocks, num_m_blocks):
    """K/V tile n_block's place among the num_n_blocks that add into Q tile m_block's dQ (of num_m_blocks, > 0)
    when every tile walks the Q tiles from its rotation on: in the order the walks reach the Q tile when they step
    together (then by n_block); where the head does not rotate, n_block (launch order).

    Tile l reaches Q tile u at step d(l) = (u - l) mod M; its place counts the tiles that reach u at an earlier
    step, N // M a step plus one for each of the N % M residues (u - e) mod M, e < d(l), below N % M, and those that
    reach it at the same step with a lower n_block."""
    m, n = num_m_blocks, num_n_blocks
    d = (m_block - n_block % m + m) % m
    full, rest = n // m, n % m
    # residues u, u - 1, ..., u - d + 1 (mod m) below rest: [u - d + 1, u] without wrapping, [m + u - d + 1, m) after
    low = cutlass.max(cutlass.min(m_block + 1, rest) - cutlass.max(m_block - d + 1, 0), 0)
    wrapped = cutlass.max(rest - (m + m_block - d + 1), 0)
    return _pick(rotates(n), full * d + low + wrapped + n_block // m, n_block)
