import sys
from pathlib import Path

f = Path(sys.argv[1]) / "flashcute/kernels/sm90/fwd.py"
s = f.read_text()


def sub(old, new):
    global s
    assert s.count(old) == 1, (old, s.count(old))
    s = s.replace(old, new)


sub(
    "from flashcute.kernels.common.epilogue import store_lse\n",
    "from flashcute.kernels.common.epilogue import store_lse\nimport tiletrace_rt as _tt\n",
)
sub(
    """    ):
        cfg = self.config
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            for atom in (tma_Q, tma_K, tma_V, tma_O):""",
    """    ):
        _tt.entry(cute.arch.block_idx()[0], cute.arch.thread_idx()[0] == 128)
        cfg = self.config
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp_idx == 0:
            for atom in (tma_Q, tma_K, tma_V, tma_O):""",
)
sub(
    """            row_scale=cute.make_rmem_tensor(cute.size(softmax.row_max), Float32),  # alpha, for rescale_o_early
""",
    """            row_scale=cute.make_rmem_tensor(cute.size(softmax.row_max), Float32),  # alpha, for rescale_o_early
            tstamp=_tt.make(),
""",
)
sub(
    """        tile = self.tile_at(tiles, tile_idx)
        mma.acc_O.fill(0.0)""",
    """        _tt.begin(mma.tstamp)
        tile = self.tile_at(tiles, tile_idx)
        mma.acc_O.fill(0.0)""",
)
sub(
    """            pipes.q.consumer_release(q_state)  # O has left Q's shared memory
        q_state.advance()""",
    """            pipes.q.consumer_release(q_state)  # O has left Q's shared memory
        _tt.end(mma.tstamp, tile_idx, cute.arch.thread_idx()[0] == 128)
        q_state.advance()""",
)
f.write_text(s)
print("patched", f)
