"""Variant trees tt_X (flashcute copy + per-tile trace patch) from a checkout ROOT: mkvariants2.py ROOT [X ...]."""

import shutil
import subprocess
import sys
from pathlib import Path

S = Path(__file__).parent
SM = "flashcute/kernels/common/softmax.py"
FWD = "flashcute/kernels/sm90/fwd.py"
CFG = "flashcute/config.py"


def edit(tree, f, old, new):
    p = tree / f
    s = p.read_text()
    assert s.count(old) == 1, (tree, f, old)
    p.write_text(s.replace(old, new))


SUM = "row_sum_new = row_reduce(s[r, None], cute.ReductionOp.ADD, Float32.zero, self.chains)"
MAX = "row_reduce(s[r, None], cute.ReductionOp.MAX, row_max_prev, self.chains)"


def S1(t):
    edit(t, SM, SUM, SUM.replace("self.chains)", "1)"))


def S2(t):  # one chain from alpha * l (replaces the sum and the l update)
    edit(
        t,
        SM,
        """            row_sum_new = row_reduce(s[r, None], cute.ReductionOp.ADD, Float32.zero, self.chains)
            self.row_sum[r] = row_scale[r] * self.row_sum[r] + row_sum_new
""",
        """            acc = row_scale[r] * self.row_sum[r]
            for c in cutlass.range_constexpr(cute.size(s[r, None].shape)):
                acc = acc + s[r, c]
            self.row_sum[r] = acc
""",
    )


def A1(t):
    edit(
        t,
        SM,
        """            exps = cute.math.exp2(s[r, None].load() * self.scale_log2 - max_scaled, fastmath=True)
            row_scale[r] = cute.math.exp2(row_max_prev * self.scale_log2 - max_scaled, fastmath=True)
""",
        """            row_scale[r] = cute.math.exp2(row_max_prev * self.scale_log2 - max_scaled, fastmath=True)
            exps = cute.math.exp2(s[r, None].load() * self.scale_log2 - max_scaled, fastmath=True)
""",
    )


def M(n):
    return lambda t: edit(t, SM, MAX, MAX.replace("self.chains)", f"{n})"))


def E(t):
    edit(
        t,
        CFG,
        "rescale_o_early=bucket > 128 if rescale_o_early is None else rescale_o_early,",
        "rescale_o_early=True if rescale_o_early is None else rescale_o_early,",
    )


def T1(t):
    edit(
        t,
        FWD,
        """            softmax.rescale_o(mma.acc_O, mma.row_scale)  # the previous tile's alpha, while Q K^T runs
        pipes.v.consumer_wait(v_state)
        gemm(mma.tiled_mma_pv, mma.acc_O, mma.tOrP, mma.tOrVt[None, None, None, v_state.index], False, -1)
        self.pass_turn(wg)
""",
        """            softmax.rescale_o(mma.acc_O, mma.row_scale)  # the previous tile's alpha, while Q K^T runs
        self.pass_turn(wg)
        pipes.v.consumer_wait(v_state)
        gemm(mma.tiled_mma_pv, mma.acc_O, mma.tOrP, mma.tOrVt[None, None, None, v_state.index], False, -1)
""",
    )


def T2(t):
    edit(
        t,
        FWD,
        """        pipes.k.consumer_wait(state)
        self.take_turn(wg)
        gemm_steps(mma.tiled_mma_qk, acc_S, mma.tSrQ, self.key_steps(mma.tSrK, state.index), True, -1)
        if cutlass.const_expr(self.config.rescale_o_early):""",
        """        self.take_turn(wg)
        pipes.k.consumer_wait(state)
        gemm_steps(mma.tiled_mma_qk, acc_S, mma.tSrQ, self.key_steps(mma.tSrK, state.index), True, -1)
        if cutlass.const_expr(self.config.rescale_o_early):""",
    )


def VR(t):  # release V after P's conversion
    edit(
        t,
        FWD,
        """        pipes.v.consumer_release(v_state)
        store_probs(acc_S, mma.tOrP)
        if cutlass.const_expr(self.config.rescale_o_early):
            mma.row_scale.store(row_scale.load())
        else:
            softmax.rescale_o(mma.acc_O, row_scale)
        return state""",
        """        store_probs(acc_S, mma.tOrP)
        if cutlass.const_expr(self.config.rescale_o_early):
            mma.row_scale.store(row_scale.load())
        else:
            softmax.rescale_o(mma.acc_O, row_scale)
        pipes.v.consumer_release(v_state)
        return state""",
    )


V = {
    "a": [],
    "b": [S1],
    "h": [S2],
    "i": [S2, A1],
    "j": [S1, M(8)],
    "k": [S1, E],
    "l": [S1, T1],
    "m": [T1],
    "n": [S1, T2],
    "o": [S1, M(1)],
    "p": [S1, A1],
    "q": [S1, VR],
    "r": [S2, E],
    "s": [S1, M(2)],
}
root = Path(sys.argv[1])
names = sys.argv[2:] or list(V)
for x in names:
    t = S / f"tt_{x}"
    shutil.rmtree(t, ignore_errors=True)
    t.mkdir()
    shutil.copytree(root / "flashcute", t / "flashcute", ignore=shutil.ignore_patterns("__pycache__"))
    for fn in V[x]:
        fn(t)
    shutil.copy(S / "tiletrace_rt.py", t)
    subprocess.run([sys.executable, str(S / "ourtilepatch.py"), str(t)], check=True, capture_output=True)
print("built", names)
