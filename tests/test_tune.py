"""`flashcute tune`: --try's parsing and the configs it gives (--dry-run, CPU), refusals (CPU), one short A/A run of
the heuristic's config against itself (GPU)."""

import json
import re

import pytest

from flashcute.kernels import launch, registry
from flashcute.kernels.sm90.config import sm90_fwd_config
from flashcute.reference import attention_same_precision
from flashcute.tools import tune
from tests.helpers import no_gpu, run_main, time_on_the_cpu


def dry_run(capsys, *argv: str) -> dict[str, str]:
    """The configs `flashcute tune --dry-run` prints for one group, by candidate name."""
    code, out, err = run_main(capsys, "tune", "--dry-run", "--headdim", "128", "--causal", "yes", *argv)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "bf16 · D=128 · causal on sm_90a"
    return dict(line.split() for line in lines[1:])


def test_each_try_is_one_candidate_of_the_heuristics_config(capsys):
    configs = dry_run(capsys, "--try", "block_n=176", "--try", "exp_in_place=true,k_descriptors=uniform")
    heuristic = sm90_fwd_config(128, "bfloat16", -1, 0)
    assert configs == {
        "heuristic": heuristic.label,
        "block_n=176": heuristic.label.replace("128x128s2", "128x176s2"),
        "exp_in_place=True,k_descriptors=uniform": heuristic.label.replace("lazy8", "lazy8e"),
    }


def test_values_parse_as_int_float_bool_or_string(capsys):
    assert dry_run(capsys, "--try", "exp_in_place=FALSE,dtype=bfloat16,block_m=128").keys() == {
        "heuristic",
        "exp_in_place=False,dtype=bfloat16,block_m=128",
    }
    code, _, err = run_main(capsys, "tune", "--dry-run", "--try", "block_n=1.5")
    assert code == 2 and "block_n takes a value of type int, got 1.5" in err
    code, _, err = run_main(capsys, "tune", "--dry-run", "--try", "exp_in_place=1")
    assert code == 2 and "exp_in_place takes a value of type bool, got 1" in err


def test_the_sm80_family_and_every_point_of_the_grid(capsys):
    code, out, _ = run_main(
        capsys, "tune", "--kernel", "sm80", "--dry-run", "--headdim", "64,256", "--try", "num_stages=1"
    )
    assert code == 0
    groups = [line for line in out.splitlines() if not line.startswith(" ")]
    assert groups == [f"bf16 · D={d} · {mask} on sm_90a" for d in (64, 256) for mask in ("non-causal", "causal")]
    assert len(re.findall(r"^  num_stages=1 +\S+w\ds1-", out, flags=re.M)) == 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--try", "bogus=1"], "Sm90FwdConfig has no field 'bogus'; its fields: dtype, head_dim_padded"),
    ],
)
def test_unknown_fields_are_refused(capsys, argv, message):
    code, _, err = run_main(capsys, "tune", *argv)
    assert code == 2 and message in err


def test_unknown_families_are_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_main(capsys, "tune", "--kernel", "sm70")
    assert exit_info.value.code == 2 and "invalid choice: 'sm70'" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["block_n", "block_n=", "=3", "block_n=1,block_n=2"])
def test_a_malformed_try_is_an_argparse_error(capsys, text):
    with pytest.raises(SystemExit) as exit_info:
        run_main(capsys, "tune", "--try", text)
    assert exit_info.value.code == 2 and "argument --try" in capsys.readouterr().err


def test_run_on_the_cpu_launches_each_candidate_through_the_familys_forward(monkeypatch, capsys, tmp_path):
    """The whole of `tune` on CPU inputs, the sm80 family's forward launcher a stand-in whose launches take 1.25 ms
    a call with the heuristic's two K/V stages and 1 ms with one, the reference 2 ms."""
    family = registry.family("sm80")
    launched, compiled = [], []

    def forward_launcher(device, dtype, head_dim, window_left, window_right, config):
        def launch(q, k, v, out, lse, softmax_scale, diag_offset):
            assert (softmax_scale, diag_offset, window_left) == (q.shape[-1] ** -0.5, 0, -1)
            launched.append(config)
            out.copy_(attention_same_precision(q, k, v, causal=window_right == 0))

        return launch

    def clock() -> float:
        ms = {2: 1.25, 1: 1.0}[launched[-1].num_stages] if launched else 2.0
        launched.clear()
        return ms

    monkeypatch.setattr(family, "forward_launcher", forward_launcher)
    monkeypatch.setattr(registry, "available", lambda device=None: ["sm80"])
    monkeypatch.setattr(launch, "device_arch", lambda device: "sm_80")
    monkeypatch.setattr(tune, "precompile", lambda configs, arch, jobs: compiled.extend((arch, c) for c in configs))
    time_on_the_cpu(monkeypatch, clock)
    grid = ["--headdim", "64", "--causal", "no,yes", "--seqlen", "64", "--batch", "2", "--nheads", "2"]
    argv = ["tune", "--kernel", "sm80", "--try", "num_stages=1", "--backends", "sdpa-math", *grid]
    code, stdout, err = run_main(capsys, *argv, "--out", str(tmp_path / "tune.json"))
    assert code == 0, err
    assert re.findall(r"\| num_stages=1/heuristic (\S+)$", stdout, flags=re.M) == ["1.250", "1.250"], stdout
    assert [(arch, c.num_stages, c.mask_right) for arch, c in compiled] == [
        ("sm_80", stages, causal) for causal in (False, True) for stages in (2, 1)
    ]
    saved = json.loads((tmp_path / "tune.json").read_text())
    assert saved["meta"]["tries"] == ["num_stages=1"]
    assert [(row["backend"], row["status"]) for row in saved["rows"]] == [
        (backend, "ok") for backend in ("heuristic", "num_stages=1", "sdpa-math")
    ] * 2
    assert saved["summary"]["num_stages=1/heuristic"]["median"] == pytest.approx(1.25)


@no_gpu
def test_without_gpu_says_so(capsys, tmp_path):
    code, _, err = run_main(capsys, "tune", "--try", "block_n=176", "--out", str(tmp_path / "tune.json"))
    assert code == 2 and "flashcute tune: no CUDA GPU" in err
    assert not (tmp_path / "tune.json").exists()


@pytest.mark.gpu
def test_the_heuristic_against_itself(capsys, tmp_path):
    """A candidate that replaces a field with the value it has: the same kernel twice, beside SDPA's flash backend."""
    from flashcute import available_kernels

    kernel, out = available_kernels()[0], tmp_path / "tune.json"
    grid = ["--dtype", "bf16", "--headdim", "64", "--causal", "no", "--seqlen", "1k", "--batch", "2", "--nheads", "4"]
    argv = ["tune", "--kernel", kernel, "--try", "dtype=bfloat16", "--backends", "sdpa-flash", "--rounds", "2"]
    code, stdout, err = run_main(capsys, *argv, *grid, "--out", str(out))
    assert code == 0, err
    assert "dtype=bfloat16/heuristic over 1 points" in stdout
    saved = json.loads(out.read_text())
    assert {row["backend"]: row["status"] for row in saved["rows"]} == {
        "heuristic": "ok",
        "dtype=bfloat16": "ok",
        "sdpa-flash": "ok",
    }
    assert 0.8 < saved["summary"]["dtype=bfloat16/heuristic"]["median"] < 1.25
