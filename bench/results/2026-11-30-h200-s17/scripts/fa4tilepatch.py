# ruff: noqa: E501  (a measurement script, as it ran)
"""Copy flash_attn from SRC to DST and record each CTA's entry, tile start and tile end (tiletrace_rt)."""

import shutil
import sys
from pathlib import Path

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
shutil.rmtree(dst / "flash_attn", ignore_errors=True)
shutil.copytree(src / "flash_attn", dst / "flash_attn")
shutil.copy(Path(__file__).with_name("tiletrace_rt.py"), dst / "tiletrace_rt.py")
f = dst / "flash_attn/cute/flash_fwd_sm90.py"
s = f.read_text()


def sub(old, new):
    global s
    assert s.count(old) == 1, (old, s.count(old))
    s = s.replace(old, new)


s = s.replace("from cutlass import pipeline\n", "from cutlass import pipeline\nimport tiletrace_rt as _tt\n", 1)
LIN = "(cute.arch.block_idx()[0] + cute.arch.grid_dim()[0] * (cute.arch.block_idx()[1] + cute.arch.grid_dim()[1] * cute.arch.block_idx()[2]))"
sub(
    """    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        # Prefetch tma descriptor
""",
    f"""    ):
        _tt.entry({LIN}, cute.arch.thread_idx()[0] == 128)
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        # Prefetch tma descriptor
""",
)
sub(
    """        work_tile = tile_scheduler.initial_work_tile_info()
        softmax = Softmax.create(""",
    """        work_tile = tile_scheduler.initial_work_tile_info()
        _tstamp = _tt.make()
        _tt.begin(_tstamp)
        softmax = Softmax.create(""",
)
# end of the consumer's tile loop (the second advance_to_next_work, in mma())
i = s.index(
    "            tile_scheduler.advance_to_next_work()\n            work_tile = tile_scheduler.get_current_work()\n\n    @cute.jit"
)
s = s[:i] + f"            _tt.end(_tstamp, {LIN}, tidx == 0)\n            _tt.begin(_tstamp)\n" + s[i:]
f.write_text(s)
print("patched", f)
