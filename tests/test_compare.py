"""`flashcute compare`: prepare an earlier commit's package beside this one (CPU, needs git); run's flags, refusals
and its whole course with stand-ins for the kernels (CPU); a short A/A run of this tree against its renamed copy,
forward and backward (GPU)."""

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flashcute.bench.grid import Shape
from flashcute.bench.results import Row
from flashcute.reference import attention_same_precision
from flashcute.tools.compare import renamed
from flashcute.tools.side_by_side import point_lines
from tests.helpers import no_gpu, run_main, time_on_the_cpu

ROOT = Path(__file__).resolve().parents[1]


def git_head() -> str:
    result = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip("not a git checkout")
    return result.stdout.strip()


def flashcute(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m flashcute ARGV...` in a process of its own, so that flashcute_base stays out of this one."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "flashcute", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, str]:
    """DIR with flashcute_base from HEAD, and HEAD's hash."""
    head = git_head()
    out = tmp_path_factory.mktemp("base")
    result = flashcute("compare", "prepare", "HEAD", str(out), cwd=out)
    assert result.returncode == 0, result.stderr
    assert head[:12] in result.stdout
    return out, head


@pytest.fixture(scope="module")
def this_tree(tmp_path_factory) -> Path:
    """DIR with flashcute_base renamed from this checkout's package as it is on disk, as `compare prepare` renames
    a commit's (the GPU host has no git): `compare run` on it is an A/A run."""
    out = tmp_path_factory.mktemp("this-tree")
    for path in (ROOT / "flashcute").rglob("*.py"):
        target = out / "flashcute_base" / path.relative_to(ROOT / "flashcute")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(renamed(path.read_text()))
    (out / "flashcute_base" / "COMMIT").write_text("this tree\n")
    return out


def test_prepare_renames_every_import(prepared):
    out, head = prepared
    package = out / "flashcute_base"
    sources = {path: path.read_text() for path in package.rglob("*.py")}
    assert package / "__init__.py" in sources and package / "interface.py" in sources
    for path, text in sources.items():
        assert not re.search(r"\bflashcute(\.|::)|^\s*(from|import) flashcute\b", text, flags=re.M), path
    assert (package / "COMMIT").read_text().strip() == head


def test_the_prepared_package_imports_beside_flashcute(prepared):
    out, _ = prepared
    code = (
        "import sys, torch, flashcute_base, flashcute_base.interface as base\n"
        "print(flashcute_base.__file__)\n"
        "print(callable(base.flash_attn_func), hasattr(torch.ops.flashcute_base, 'fwd'))\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'flashcute'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(out)}
    result = subprocess.run([sys.executable, "-c", code], cwd=out, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    path, api, flashcute_modules = result.stdout.splitlines()
    assert Path(path) == out / "flashcute_base" / "__init__.py"
    assert api == "True True"  # its torch.library ops live under their own namespace
    assert flashcute_modules == "[]"  # nothing of it imports this checkout's package


def test_prepare_refuses_an_unknown_revision(tmp_path, capsys):
    git_head()
    code, _, err = run_main(capsys, "compare", "prepare", "no-such-revision", str(tmp_path))
    assert code == 2 and "no package of 'no-such-revision'" in err
    assert not (tmp_path / "flashcute_base").exists()


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (["--pass", "sideways"], "argument --pass: invalid choice"),
        (["--kernel", "sm70"], "argument --kernel: invalid choice"),
        (["--causal", "maybe"], "causal 'maybe' is not one of"),
        (["--rounds", "0"], "argument --rounds: invalid"),
    ],
)
def test_run_refuses_malformed_flags(tmp_path, capsys, flag, message):
    with pytest.raises(SystemExit) as exit_info:
        run_main(capsys, "compare", "run", str(tmp_path), str(tmp_path / "out.json"), *flag)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_run_needs_a_prepared_directory(tmp_path):
    result = flashcute("compare", "run", str(tmp_path), str(tmp_path / "out.json"), cwd=tmp_path)
    assert result.returncode == 2
    assert "no flashcute_base in" in result.stderr and "flashcute compare prepare REV" in result.stderr


@pytest.fixture(scope="module")
def base_interface(this_tree):
    """flashcute_base.interface of the renamed copy, imported in this process once (its torch.library ops are
    defined once a process) and taken out again after the module's tests."""
    path = list(sys.path)
    sys.path.insert(0, str(this_tree))
    yield importlib.import_module("flashcute_base.interface")
    sys.path[:] = path  # also undoes the path that `compare run` adds
    for name in [name for name in sys.modules if name.split(".")[0] == "flashcute_base"]:
        del sys.modules[name]


@pytest.mark.parametrize(("pass_", "deterministic"), [("fwd", False), ("bwd", False), ("bwd", True)])
def test_run_on_the_cpu_prints_each_point_and_the_spread(
    this_tree, base_interface, monkeypatch, capsys, pass_, deterministic
):
    """The whole of `compare run` on CPU inputs, each tree's flash_attn_func a stand-in that takes 1 ms a call in
    this tree and 1.1 ms in the earlier one, the reference 2 ms: new/base reads 1.1 at every point. With
    --deterministic both trees, not the reference, are called with deterministic=True."""
    from flashcute import interface

    out = this_tree
    ran: list[str] = []
    modes: set[tuple[str, bool]] = set()

    def stand_in(tree: str):
        def flash_attn_func(q, k, v, causal: bool, kernel: str, deterministic: bool = False):
            ran.append(f"{tree} {kernel}")
            modes.add((tree, deterministic))
            return attention_same_precision(q, k, v, causal=causal)

        return flash_attn_func

    def clock() -> float:
        ms = {"new sm80": 1.0, "base sm80": 1.1}.get(ran[-1] if ran else "the reference", 2.0)
        ran.clear()
        return ms

    # (flashcute's API names are bound on first use: patch the package as well as the module it takes them from)
    for package in (interface, importlib.import_module("flashcute")):
        monkeypatch.setattr(package, "flash_attn_func", stand_in("new"), raising=False)
        monkeypatch.setattr(package, "available_kernels", lambda: ["sm80"], raising=False)
    for package in (base_interface, importlib.import_module("flashcute_base")):
        monkeypatch.setattr(package, "flash_attn_func", stand_in("base"), raising=False)
    time_on_the_cpu(monkeypatch, clock)
    grid = [
        "--dtype",
        "bf16",
        "--headdim",
        "32",
        "--causal",
        "no,yes",
        "--seqlen",
        "64",
        "--batch",
        "2",
        "--nheads",
        "2",
    ]
    flags = ["--kernel", "sm80", "--reference", "sdpa-math", "--pass", pass_, "--rounds", "1", *grid]
    flags += ["--deterministic"] if deterministic else []
    code, stdout, err = run_main(capsys, "compare", "run", str(out), str(out / "cpu.json"), *flags)
    assert code == 0, err
    assert modes == {("new", deterministic), ("base", deterministic)}
    ratios = re.findall(r"\| new/base (\S+)  new/sdpa-math (\S+)  base/sdpa-math (\S+)$", stdout, flags=re.M)
    assert ratios == [("1.100", "2.000", "1.818")] * 2, stdout
    assert "new/base over 2 points: min 1.100  median 1.100  max 1.100" in stdout
    saved = json.loads((out / "cpu.json").read_text())
    assert saved["meta"]["base"] == "this tree" and saved["meta"]["pass"] == pass_
    assert saved["meta"]["deterministic"] == deterministic
    assert [(row["backend"], row["pass"], row["status"]) for row in saved["rows"]] == [
        (backend, pass_, "ok") for backend in ("new", "base", "sdpa-math")
    ] * 2
    assert saved["summary"]["new/base"] == pytest.approx({"points": 2, "min": 1.1, "median": 1.1, "max": 1.1})


def test_a_point_shows_how_far_its_rounds_spread():
    """Each backend's TFLOP/s, then (with several rounds) (slowest - fastest) / median of its rounds' times."""
    shape = Shape("bf16", 128, True, 1024, 16, 16)
    rows = (
        Row("new", shape, "bwd", "ok", ms=2.0, rounds_ms=(2.0, 1.8, 2.2)),
        Row("base", shape, "bwd", "ok", ms=2.0),
        Row("fa4", shape, "bwd", "failed", reason="RuntimeError: no"),
    )
    line, note = point_lines(rows, {("new", "base"): 1.0}).splitlines()
    tflops = shape.flops("bwd") / 2e9
    assert line == f"{shape.label()} | new {tflops:.1f} (20%)  base {tflops:.1f}  fa4 failed | new/base 1.000"
    assert note == "  fa4 failed: RuntimeError: no"


@no_gpu
def test_run_without_gpu_says_so(this_tree):
    out = this_tree
    result = flashcute("compare", "run", str(out), str(out / "out.json"), "--pass", "bwd", "--headdim", "128", cwd=out)
    assert result.returncode == 2 and "flashcute compare run: no CUDA GPU" in result.stderr
    assert not (out / "out.json").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_run_times_both_trees_and_the_reference(this_tree, pass_):
    from flashcute import available_kernels

    out = this_tree
    # B = 8, H = 32: calls long enough (about 0.1 ms) that the GPU, not the host, sets their time
    flags = ["--kernel", available_kernels()[0], "--pass", pass_, "--rounds", "3", "--dtype", "bf16", "--headdim", "64"]
    flags += ["--causal", "yes", "--seqlen", "2k"]
    result = flashcute("compare", "run", str(out), str(out / f"{pass_}.json"), *flags, cwd=out)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"new/base over 1 points: min \S+  median \S+  max \S+", result.stdout), result.stdout
    saved = json.loads((out / f"{pass_}.json").read_text())
    assert saved["meta"]["base"] == "this tree" and saved["meta"]["pass"] == pass_
    statuses = {row["backend"]: row["status"] for row in saved["rows"]}
    assert statuses["new"] == statuses["base"] == "ok"
    assert 0.8 < saved["summary"]["new/base"]["median"] < 1.25  # the same kernels
