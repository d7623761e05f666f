# ruff: noqa: E501  (a measurement script, as it ran)
"""Build variant trees: v_X (plain) and tt_X (with the per-tile trace patch), X in b..g, from main's archive."""

import shutil
import subprocess
import sys
from pathlib import Path

S = Path(__file__).parent
HELPER = """@cute.jit
def rescale_o_if_changed(acc_O: cute.Tensor, row_scale: cute.Tensor):
    changed = row_scale[0] != Float32(1.0)
    for r in cutlass.range_constexpr(1, cute.size(row_scale)):
        changed = changed | (row_scale[r] != Float32(1.0))
    if changed:
        o = acc_rows_cols(acc_O)
        for r in cutlass.range_constexpr(cute.size(row_scale)):
            o[r, None].store(o[r, None].load() * row_scale[r])


class FlashAttentionForwardSm90"""


def edit(tree, f, old, new):
    p = tree / f
    s = p.read_text()
    assert s.count(old) == 1, (tree, old)
    p.write_text(s.replace(old, new))


SM = "flashcute/kernels/common/softmax.py"
FWD = "flashcute/kernels/sm90/fwd.py"
CFG = "flashcute/config.py"


def helper(tree):
    edit(tree, FWD, "class FlashAttentionForwardSm90", HELPER)
    edit(
        tree,
        FWD,
        "from flashcute.kernels.common.mask import AttentionMask\n",
        "from flashcute.kernels.common.layout import acc_rows_cols\nfrom flashcute.kernels.common.mask import AttentionMask\n",
    )


def early(tree):
    edit(
        tree,
        CFG,
        "rescale_o_early=bucket > 128 if rescale_o_early is None else rescale_o_early,",
        "rescale_o_early=True if rescale_o_early is None else rescale_o_early,",
    )


V = {
    "a": lambda t: None,
    "b": lambda t: edit(
        t,
        SM,
        "row_sum_new = row_reduce(s[r, None], cute.ReductionOp.ADD, Float32.zero, self.chains)",
        "row_sum_new = row_reduce(s[r, None], cute.ReductionOp.ADD, Float32.zero, 1)",
    ),
    "c": lambda t: edit(
        t,
        SM,
        "row_sum_new = row_reduce(s[r, None], cute.ReductionOp.ADD, Float32.zero, self.chains)",
        "row_sum_new = row_reduce(s[r, None], cute.ReductionOp.ADD, Float32.zero, 2)",
    ),
    "d": lambda t: edit(
        t,
        SM,
        "row_reduce(s[r, None], cute.ReductionOp.MAX, row_max_prev, self.chains)",
        "row_reduce(s[r, None], cute.ReductionOp.MAX, row_max_prev, 2)",
    ),
    "e": early,
    "f": lambda t: (
        helper(t),
        edit(
            t,
            FWD,
            """        else:
            softmax.rescale_o(mma.acc_O, row_scale)
        return state""",
            """        else:
            rescale_o_if_changed(mma.acc_O, row_scale)
        return state""",
        ),
    ),
    "g": lambda t: (
        early(t),
        helper(t),
        edit(
            t,
            FWD,
            "            softmax.rescale_o(mma.acc_O, mma.row_scale)  # the previous tile's alpha, while Q K^T runs",
            "            rescale_o_if_changed(mma.acc_O, mma.row_scale)  # the previous tile's alpha, while Q K^T runs",
        ),
    ),
}
root = Path(sys.argv[1])  # a checkout of main (its flashcute and scripts are copied)
for x, fn in V.items():
    for kind in ("v", "tt"):
        t = S / f"{kind}_{x}"
        shutil.rmtree(t, ignore_errors=True)
        t.mkdir()
        for sub in ("flashcute", "scripts"):
            shutil.copytree(root / sub, t / sub, ignore=shutil.ignore_patterns("__pycache__"))
        fn(t)
        if kind == "tt":
            shutil.copy(S / "tiletrace_rt.py", t)
            subprocess.run([sys.executable, str(S / "ourtilepatch.py"), str(t)], check=True, capture_output=True)
print("built", list(V))
