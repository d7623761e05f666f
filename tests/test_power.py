"""`flashcute power`: parsing and summarizing nvidia-smi samples, flags and the refusal without a GPU (CPU); one short
loop (GPU)."""

import json

import pytest

from flashcute.tools.power import parse_samples, summarize
from tests.helpers import no_gpu, run_main


def test_samples_parse_and_drop_unreadable_lines():
    text = """2026/11/30 21:00:00.000, 699.51, 1530, 0x0000000000000004
2026/11/30 21:00:00.025, [N/A], 1530, 0x0000000000000004
garbage
2026/11/30 21:00:00.050, 702.10, 1545, 0x0000000000000000
"""
    assert parse_samples(text) == [
        {"watts": 699.51, "mhz": 1530.0, "reasons": 4},
        {"watts": 702.10, "mhz": 1545.0, "reasons": 0},
    ]


def test_summary_drops_the_ramp_and_prices_a_pflop():
    # a ramp of 2 low samples, then 8 at 700 W; calls of 2 ms after a slow first fifth
    samples = [{"watts": 100.0, "mhz": 500.0, "reasons": 0}] * 2
    samples += [{"watts": 700.0, "mhz": 1500.0, "reasons": 4}] * 8
    call_ms = [9.0] * 2 + [2.0] * 8
    summary = summarize(samples, call_ms, flop=1e12)
    assert summary["watts"] == 700.0 and summary["mhz"] == 1500.0 and summary["ms"] == 2.0
    assert summary["tflops"] == pytest.approx(500.0)  # 1e12 FLOP in 2 ms
    assert summary["joules_per_pflop"] == pytest.approx(700 * 2e-3 / 1e-3)  # 1.4 J for 1e-3 PFLOP
    assert summary["reasons"] == ["0x4"] and summary["samples"] == 8


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--dtype", "both"], "dtype 'both' is not one of bf16, fp16"),
        (["--dtype", "bf16,float32"], "dtype 'float32' is not one of bf16, fp16"),
        (["--causal", "both"], "causal 'both' is not one of"),
        (["--seqlen", "16k,0"], "'0' is not a positive size"),
    ],
)
def test_unknown_dtypes_masks_and_sizes_are_refused(capsys, flag, message):
    """--dtype, --causal and --seqlen take comma lists; a name outside them is an error, not a silent skip."""
    with pytest.raises(SystemExit) as exit_info:
        run_main(capsys, "power", *flag)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@no_gpu
def test_without_gpu_says_so(capsys, tmp_path):
    code, _, err = run_main(capsys, "power", "--out", str(tmp_path / "power.json"))
    assert code == 2 and "flashcute power: no CUDA GPU" in err
    assert not (tmp_path / "power.json").exists()


@pytest.mark.gpu
def test_a_short_loop_reads_power_and_clock(capsys, tmp_path):
    grid = ["--dtype", "bf16", "--headdim", "64", "--seqlen", "1k", "--batch", "2", "--nheads", "4"]
    argv = ["power", "--backends", "sdpa-flash", "--seconds", "0.5", "--repeats", "1", *grid]
    code, out, err = run_main(capsys, *argv, "--out", str(tmp_path / "power.json"))
    assert code == 0, err
    rows = json.loads((tmp_path / "power.json").read_text())
    assert [(row["backend"], row["headdim"], row["seqlen"]) for row in rows] == [("sdpa-flash", 64, 1024)]
    assert rows[0]["samples"] >= 1 and rows[0]["watts"] > 0 and rows[0]["mhz"] > 0 and rows[0]["tflops"] > 0
    assert "J/PFLOP" in out
