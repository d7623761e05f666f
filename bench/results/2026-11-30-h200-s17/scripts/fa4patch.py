"""Copy flash_attn from SRC site to DST and add clock stamps to FlashAttentionForwardSm90's overlapped step."""

import shutil
import sys
from pathlib import Path

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
shutil.rmtree(dst / "flash_attn", ignore_errors=True)
shutil.copytree(src / "flash_attn", dst / "flash_attn")
shutil.copy(Path(__file__).with_name("fa4trace_rt.py"), dst / "fa4trace_rt.py")
f = dst / "flash_attn/cute/flash_fwd_sm90.py"
s = f.read_text()


def sub(old, new, count=1):
    global s
    assert s.count(old) == count, (old, s.count(old))
    s = s.replace(old, new)


s = s.replace("from cutlass import pipeline\n", "from cutlass import pipeline\nfrom fa4trace_rt import Trace\n", 1)
sub(
    """        work_tile = tile_scheduler.initial_work_tile_info()
        softmax = Softmax.create(""",
    """        work_tile = tile_scheduler.initial_work_tile_info()
        self._trace = Trace(warp_group_idx, tidx % 128 == 0)
        softmax = Softmax.create(""",
)
body_start = s.index("    def mma_one_n_block_intrawg_overlap(")
body_end = s.index("    def mma_init(self):")
b = s[body_start:body_end]


def bsub(old, new):
    global b
    assert b.count(old) == 1, old
    b = b.replace(old, new)


bsub(
    """        smem_pipe_read.advance()
        pipeline_k.consumer_wait(""",
    """        smem_pipe_read.advance()
        self._trace.stamp(0)
        pipeline_k.consumer_wait(""",
)
bsub(
    """        self.warp_scheduler_barrier_sync()
        # S = Q @ K.T""",
    """        self.warp_scheduler_barrier_sync()
        self._trace.stamp(1)
        # S = Q @ K.T""",
)
bsub(
    """        mma_pv_fn(B_idx=smem_pipe_read_v.index, wg_wait=-1)
        self.warp_scheduler_barrier_arrive()
        warpgroup.wait_group(1)
""",
    """        mma_pv_fn(B_idx=smem_pipe_read_v.index, wg_wait=-1)
        self._trace.stamp(2)
        self.warp_scheduler_barrier_arrive()
        warpgroup.wait_group(1)
        self._trace.stamp(3)
""",
)
bsub(
    """        warpgroup.wait_group(0)
        pipeline_v.consumer_release(smem_pipe_read_v)
""",
    """        warpgroup.wait_group(0)
        self._trace.stamp(4)
        pipeline_v.consumer_release(smem_pipe_read_v)
""",
)
bsub(
    """            cute.arch.sync_warp()  # Only need syncwarp since each warp is using its own P values for MmaPV
        return smem_pipe_read""",
    """            cute.arch.sync_warp()  # Only need syncwarp since each warp is using its own P values for MmaPV
        self._trace.stamp(5)
        self._trace.flush()
        return smem_pipe_read""",
)
s = s[:body_start] + b + s[body_end:]
f.write_text(s)
print("patched", f)
