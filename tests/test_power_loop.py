"""scripts/power_loop.py: parsing and summarizing nvidia-smi samples (CPU), one short loop (GPU)."""

import pytest

from tests.helpers import load_script


def test_samples_parse_and_drop_unreadable_lines():
    power_loop = load_script("power_loop")
    text = """2026/11/30 21:00:00.000, 699.51, 1530, 0x0000000000000004
2026/11/30 21:00:00.025, [N/A], 1530, 0x0000000000000004
garbage
2026/11/30 21:00:00.050, 702.10, 1545, 0x0000000000000000
"""
    samples = power_loop.parse_samples(text)
    assert samples == [
        {"watts": 699.51, "mhz": 1530.0, "reasons": 4},
        {"watts": 702.10, "mhz": 1545.0, "reasons": 0},
    ]


def test_summary_drops_the_ramp_and_prices_a_pflop():
    power_loop = load_script("power_loop")
    # a ramp of 2 low samples, then 8 at 700 W; calls of 2 ms after a slow first fifth
    samples = [{"watts": 100.0, "mhz": 500.0, "reasons": 0}] * 2
    samples += [{"watts": 700.0, "mhz": 1500.0, "reasons": 4}] * 8
    call_ms = [9.0] * 2 + [2.0] * 8
    summary = power_loop.summarize(samples, call_ms, flop=1e12)
    assert summary["watts"] == 700.0 and summary["mhz"] == 1500.0 and summary["ms"] == 2.0
    assert summary["tflops"] == pytest.approx(500.0)  # 1e12 FLOP in 2 ms
    assert summary["joules_per_pflop"] == pytest.approx(700 * 2e-3 / 1e-3)  # 1.4 J for 1e-3 PFLOP
    assert summary["reasons"] == ["0x4"] and summary["samples"] == 8


@pytest.mark.parametrize("option", [["--dtype", "both"], ["--causal", "both"], ["--dtype", "bf16,float32"]])
def test_unknown_dtypes_and_masks_are_refused(option, monkeypatch, capsys):
    """--dtype and --causal take comma-separated lists; a name outside them is an error, not a silent skip."""
    power_loop = load_script("power_loop")
    monkeypatch.setattr("sys.argv", ["power_loop.py", *option])
    with pytest.raises(SystemExit) as exc:
        power_loop.main()
    assert exc.value.code == 2
    assert "--dtype takes bf16, fp16 and --causal no, yes" in capsys.readouterr().err


@pytest.mark.gpu
def test_a_short_loop_reads_power_and_clock():
    from flashcute.bench.backends import registry
    from flashcute.bench.grid import Shape

    power_loop = load_script("power_loop")
    rows = power_loop.measure_point([registry()["sdpa-flash"]], Shape("bf16", 64, False, 1024, 2, 4), 0.5, 1)
    assert len(rows) == 1 and rows[0]["backend"] == "sdpa-flash"
    assert rows[0]["samples"] >= 1 and rows[0]["watts"] > 0 and rows[0]["mhz"] > 0 and rows[0]["tflops"] > 0
