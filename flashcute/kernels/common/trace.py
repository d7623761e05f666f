"""Tile records, a measuring aid (Sm90FwdConfig.trace_tiles; scripts/tile_cycles.py reads them).

With tracing, the Hopper forward's tile-counter tensor holds the counter at [0] and then, for tile number t, the
RECORD_WORDS int32 words at 1 + t * RECORD_WORDS: the SM that ran it, the SM clock (%clock) when the first consumer
warpgroup began the tile and when it had stored it, the global timer's low 32 bits (nanoseconds) at the same two
points, and 1. Differences of the 32-bit values are exact modulo 2^32; cycles over nanoseconds give the SM clock.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32

RECORD_WORDS = 6


def counter_words(num_tiles: int) -> int:
    """int32 words of the tile-counter tensor with tile records: the counter and a record a tile."""
    return 1 + num_tiles * RECORD_WORDS


def tile_start() -> tuple[Int32, Int32]:
    """(clock, global timer) now, for record_tile."""
    return cute.arch.clock(), cute.arch.globaltimer_lo()


@cute.jit
def record_tile(counter: cute.Tensor, tile_idx: Int32, start: tuple[Int32, Int32], writer: cutlass.Boolean):
    """Thread ``writer`` writes tile ``tile_idx``'s record: begun at ``start`` (tile_start), ended now."""
    clock_end, timer_end = tile_start()
    if writer:
        base = 1 + tile_idx * RECORD_WORDS
        counter[base] = cute.arch.smid()
        counter[base + 1] = start[0]
        counter[base + 2] = clock_end
        counter[base + 3] = start[1]
        counter[base + 4] = timer_end
        counter[base + 5] = Int32(1)
