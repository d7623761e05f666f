"""flashcute walkthrough: the seed's worked example printed from the tiled reference's trace."""

import argparse
import re

import pytest

from flashcute import walkthrough


@pytest.fixture
def run_walkthrough(capsys):
    def run(*argv: str) -> tuple[int, str, str]:
        parser = argparse.ArgumentParser()
        walkthrough.add_arguments(parser)
        code = walkthrough.run(parser.parse_args(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def section(output: str, title: str) -> str:
    """The part of the output under the run whose title line starts with `title`."""
    runs = output.split("=" * 80 + "\n")
    (match,) = [run for run in runs if run.startswith(title)]
    return match


def table(output: str, title: str) -> list[list[str]]:
    """Cells (without row labels) of the first table whose title line contains `title`."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if title in line)
    rows = []
    for line in lines[start + 2 :]:  # skip the title and the column header
        if not line.startswith("    "):
            break
        rows.append(line.split()[1:])
    return rows


def vector(output: str, title: str) -> str:
    return next(line for line in output.splitlines() if line.startswith(title)).rsplit("]: ", 1)[1]


def test_seed_example_round_by_round(run_walkthrough):
    code, out, err = run_walkthrough()
    assert code == 0 and err == ""
    main = section(out, "No mask")
    assert "arithmetic: exact (Fractions)" in main and "scale_log2 = s * log2(e) = 1" in out
    assert table(main, "(Fig. 5)") == [["0", "1", "2", "0"], ["1", "0", "1", "2"]]
    assert table(main, "E0 = ") == [["1/2", "1"], ["1", "1/2"]] and "(Fig. 6)" in main
    assert vector(main, "l0 = ") == "3/2, 3/2"
    assert table(main, "U0 = ") == [["1/2", "1"], ["1", "1/2"]] and "(Fig. 8)" in main
    assert vector(main, "m1 = ") == "2, 2" and vector(main, "alpha = exp2((m - m1)") == "1/2, 1/2"
    assert table(main, "(Fig. 7)") == [["1", "1/4"], ["1/2", "1"]]
    assert table(main, "(Fig. 9)") == [["3/2", "1"], ["5/2", "1/2"]]
    assert table(main, "(Fig. 10)") == [["7/4", "3/2"], ["3", "3/4"]]
    assert vector(main, "l1 = ") == "2, 9/4"
    assert table(main, "(Fig. 12)") == [["7/8", "3/4"], ["4/3", "1/3"]]
    assert "[finalize]: ln 8, ln 9" in main


def test_each_table_names_its_kernel_step(run_walkthrough):
    _, out, _ = run_walkthrough()
    for step in ("n_block_range", "gemm_qk", "online_softmax", "rescale_o", "gemm_pv", "finalize", "apply_mask"):
        assert f"[{step}" in out or f", {step}" in out, step
    for figure in range(2, 13):
        assert f"Fig. {figure}" in out, figure


def test_top_left_causal_variant_skips_the_second_tile(run_walkthrough):
    _, out, _ = run_walkthrough()
    causal = section(out, "Causal, top-left")
    assert table(causal, "(Fig. 11)") == [["0", "-inf", "-inf", "-inf"], ["1", "0", "-inf", "-inf"]]
    assert "skips tile 1 (keys 2..3) whole" in causal
    assert "round 1" not in causal and "apply_mask ran" in causal
    assert table(causal, "O = U / l") == [["1", "0"], ["2/3", "1/3"]] and "ln 1, ln 3" in causal


def test_bottom_right_only_when_asked(run_walkthrough):
    _, out, _ = run_walkthrough("--causal", "bottom_right")
    assert "Causal, bottom-right" in out and "No mask" not in out and "top-left" not in out
    assert table(out, "(Fig. 11)") == [["0", "1", "2", "-inf"], ["1", "0", "1", "2"]]


def test_custom_inputs(run_walkthrough):
    code, out, _ = run_walkthrough("--q", "1,0", "--k", "0,0;0,0;1,1", "--v", "1,2;3,4;1/2,0", "--block-n", "1")
    assert code == 0 and "round 2: K/V tile n_block = 2, keys 2" in out
    main = section(out, "No mask")
    assert table(main, "(Fig. 12)") == [["5/4", "3/2"]]  # scores 0, 0, 1 -> weights 1/4, 1/4, 1/2
    assert "[finalize]: ln 4" in main


def test_random_inputs_with_small_tiles(run_walkthrough):
    code, out, _ = run_walkthrough("--random", "7", "--seqlen-q", "3", "--seqlen-k", "5", "--block-m", "2")
    assert code == 0
    assert "Q tile m_block = 1: queries 2" in out and "arithmetic: exact" in out
    errors = re.findall(r"max \|O - O_ref\| = (\S+), max \|LSE - LSE_ref\| = (\S+)", out)
    assert len(errors) == 2 and all(float(error) < 1e-12 for pair in errors for error in pair)


def test_float_when_exact_is_impossible(run_walkthrough):
    code, out, _ = run_walkthrough("--scale", "0.5")
    assert code == 0 and "arithmetic: float64 (not exact: exact mode needs softmax_scale" in out
    assert table(section(out, "No mask"), "(Fig. 12)") == [["0.8981", "0.6859"], ["1.245", "0.3775"]]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--q", "1,x"], "--q must be a matrix"),
        (["--k", "1,0;1"], "--k rows must all have the same number of entries"),
        (["--q", "1,0,0"], "k headdim (k.shape[3]) must equal q's (3), got 2"),
        (["--random", "1", "--v", "1,0"], "--random cannot be combined"),
        (["--random", "1", "--seqlen-k", "0"], "--seqlen-k must be >= 1, got 0"),
        (["--scale", "big"], "--scale must be a number, 'ln2' or 'default', got 'big'"),
        (["--block-n", "0"], "block_n must be an int >= 1, got 0"),
    ],
)
def test_bad_input_is_reported(run_walkthrough, argv, message):
    code, out, err = run_walkthrough(*argv)
    assert code == 2 and out == "" and message in err


def test_summary_is_the_exact_answer():
    text = walkthrough.summary()
    assert "O   = [[7/8, 3/4], [4/3, 1/3]]" in text and "LSE = [ln 8, ln 9]" in text
