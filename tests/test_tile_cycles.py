"""scripts/tile_cycles.py: its summary of tile records (CPU), and the records a traced Hopper launch leaves (GPU)."""

import math

import pytest
import torch

from flashcute.kernels.common.trace import RECORD_WORDS, counter_words
from tests.helpers import load_script


def test_summary_reads_wrapped_counters():
    tile_cycles = load_script("tile_cycles")
    # three tiles of 1000, 2000 and 3000 cycles at 2 GHz; the second one's clock and timer wrap past 2^32
    starts = [(10, 100), ((1 << 32) - 500, (1 << 32) - 200), (50, 400)]
    rows = [
        [sm, clock, (clock + cycles) % (1 << 32), timer, (timer + cycles // 2) % (1 << 32), 1]
        for sm, ((clock, timer), cycles) in enumerate(zip(starts, (1000, 2000, 3000), strict=True))
    ]
    summary = tile_cycles.summarize(torch.tensor(rows, dtype=torch.int64))
    assert summary["tiles"] == 3 and summary["cycles_median"] == 2000
    assert summary["clock_mhz"] == pytest.approx(2000)
    with pytest.raises(AssertionError, match="no record"):
        tile_cycles.summarize(torch.tensor([[*rows[0][:5], 0]], dtype=torch.int64))


@pytest.mark.gpu
def test_traced_launch_records_every_tile_and_keeps_the_output():
    import dataclasses

    from flashcute import compile_cache
    from flashcute.config import sm90_fwd_config
    from flashcute.interface import _num_sms, available_kernels, device_arch
    from flashcute.kernels.build import compile_fwd

    if "sm90" not in available_kernels(torch.device("cuda")):
        pytest.skip("needs the Hopper kernel")
    batch, seqlen, heads, d = 2, 1000, 3, 128
    q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
    arch = device_arch(q.device)
    outputs = []
    for traced in (False, True):
        config = dataclasses.replace(sm90_fwd_config(d, "bfloat16", causal=True), trace_tiles=traced)
        kernel = compile_cache.get_compiled(arch, config, lambda c=config: compile_fwd(c, arch))
        num_tiles = math.ceil(seqlen / config.block_m) * heads * batch
        counter = torch.zeros(counter_words(num_tiles) if traced else 1, dtype=torch.int32, device="cuda")
        out, lse = torch.full_like(q, float("nan")), torch.full((batch, heads, seqlen), float("nan"), device="cuda")
        grid = config.grid_limit(seqlen, _num_sms(torch.cuda.current_device()))
        kernel(q, k, v, out, lse, counter, 1 / math.sqrt(d), 0, -1, 0, grid)
        torch.cuda.synchronize()
        outputs.append((out, lse))
    assert torch.equal(outputs[0][0], outputs[1][0]) and torch.equal(outputs[0][1], outputs[1][1])
    summary = load_script("tile_cycles").summarize(counter[1:].view(num_tiles, RECORD_WORDS).cpu().long())
    assert summary["tiles"] == num_tiles and summary["cycles_median"] > 0
    assert 300 < summary["clock_mhz"] < 3000
