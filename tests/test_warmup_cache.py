"""`flashcute warmup` and `flashcute cache` through the command line, on the CPU (a target named with --arch)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from flashcute.compile_cache import entries
from flashcute.kernels.variants import all_variants
from tests.helpers import run_main


def test_warmup_lists_what_a_typical_llm_uses(capsys):
    code, out, _ = run_main(capsys, "warmup", "--arch", "sm_90a", "--dry-run")
    labels = [line.split()[1] for line in out.splitlines()]
    assert code == 0 and len(labels) == len(set(labels))
    for family, kind in (("sm90", "forward"), ("sm90bwd", "backward")):
        assert {lb for lb in labels if lb.startswith(f"{family}-bfloat16-")}, kind
    head_dims = {part for lb in labels for part in lb.split("-") if part.startswith("d") and part[1:].isdigit()}
    assert all("bfloat16" in lb for lb in labels) and head_dims == {"d64", "d128"}
    assert not any(lb.startswith(("dq-", "bwdnodq-")) for lb in labels)  # no deterministic kernels unless asked
    code, out, _ = run_main(capsys, "warmup", "--arch", "sm_90a", "--dry-run", "--deterministic", "--kernels", "sm80")
    assert any(line.split()[1].startswith("dq-") for line in out.splitlines())
    assert not any(line.split()[1].startswith("sm90") for line in out.splitlines())


def test_warmup_value_adds_the_pairs_of_head_dims_models_use(capsys):
    flags = ("warmup", "--arch", "sm_90a", "--dry-run", "--headdim", "192", "--causal", "yes", "--value")
    code, out, _ = run_main(capsys, *flags)
    labels = [line.split()[1] for line in out.splitlines()]
    assert code == 0
    # the forward's on both families (the Hopper one runs it), the backward's on the sm80 family
    assert {lb.split("-")[0] for lb in labels if "d192v128" in lb} == {"sm90", "bfloat16", "bwd"}
    _, plain, _ = run_main(capsys, *flags[:-1])
    assert not any("v128" in line for line in plain.splitlines())


def test_warmup_paged_adds_the_forward_over_a_paged_cache(capsys):
    flags = ("warmup", "--arch", "sm_90a", "--dry-run", "--headdim", "128", "--causal", "no", "--pass", "fwd")
    code, out, _ = run_main(capsys, *flags, "--paged")
    paged = [lb for lb in (line.split()[1] for line in out.splitlines()) if "-paged" in lb]
    assert code == 0
    # pages of 16, 64 and 256 rows read in boxes of 16, 64 and 128 rows (the D=128 K/V tile's), each by the
    # heuristic's tiles and by those for short queries (decoding's split-KV walks)
    boxes = sorted((lb.rpartition("-paged")[2], lb.split("-")[3]) for lb in paged)
    assert boxes == sorted((box, tile) for box in ("16", "64", "128") for tile in ("128x128s2", "64x128s2"))
    assert all(lb.startswith("sm90-") and "-packed-" in lb for lb in paged)
    _, plain, _ = run_main(capsys, *flags)
    assert "-paged" not in plain


def test_warmup_all_is_every_variant(capsys):
    code, out, _ = run_main(capsys, "warmup", "--arch", "sm_80", "--all", "--dry-run")
    assert code == 0 and len(out.splitlines()) == len(all_variants("sm_80"))


def test_warmup_without_a_gpu_needs_a_target(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU gives the target")
    code, _, err = run_main(capsys, "warmup")
    assert code == 2 and "--arch" in err


def test_warmup_refuses_a_cache_folder_it_cannot_write(capsys, monkeypatch, tmp_path):
    """A cache folder that cannot be made (under a regular file) is named before anything compiles."""
    blocker = tmp_path / "a file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("FLASHCUTE_CACHE_DIR", str(blocker / "cache"))
    code, out, err = run_main(capsys, "warmup", "--arch", "sm_80", "--headdim", "64", "--pass", "fwd")
    assert code == 2 and str(blocker / "cache") in err and "FLASHCUTE_CACHE_DIR" in err and out == ""


def test_cache_off(capsys, monkeypatch):
    monkeypatch.setenv("FLASHCUTE_CACHE_DIR", "off")
    code, out, _ = run_main(capsys, "cache")
    assert code == 0 and "off" in out


@pytest.mark.compile
def test_warmup_fills_the_cache_and_cache_shows_and_clears_it(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHCUTE_CACHE_DIR", str(tmp_path))
    flags = ("--arch", "sm_80", "--headdim", "64", "--causal", "no", "--pass", "fwd", "--kernels", "sm80")
    code, out, _ = run_main(capsys, "warmup", *flags, "--jobs", "1")
    assert code == 0 and "[1/1] bfloat16-d64-" in out and "1 variants for sm_80" in out
    assert len(entries(tmp_path)) == 1
    assert_loads_without_cute_dsl(entries(tmp_path)[0])
    (tmp_path / "fwdconfig_sm_80_000000000000000000000000.o").write_bytes(b"left by older code")
    code, out, _ = run_main(capsys, "cache")
    assert code == 0 and f"{tmp_path}: 2 entries" in out and "1 of them stale" in out
    assert [line.split() for line in out.splitlines()[2:]] == [["fwdconfig", "sm_80", "1", "1"]]
    code, out, _ = run_main(capsys, "cache", "--clear", "--stale")
    assert "deleted 1 stale entries" in out and len(entries(tmp_path)) == 1
    code, out, _ = run_main(capsys, "cache", "--clear")
    assert "deleted 1 entries" in out and not entries(tmp_path)


def assert_loads_without_cute_dsl(entry) -> None:
    """Where a C compiler links entries, a fresh process loads ``entry`` as a TVM-FFI function without importing
    CuTe DSL (what makes a first call from a filled cache quick)."""
    if not shutil.which(os.environ.get("CC", "cc")):
        assert entry.suffix == ".o"
        return
    assert entry.suffix == ".so"
    script = (
        "import sys, pathlib; from flashcute import compile_cache; "
        f"kernel = compile_cache._load_from_disk(pathlib.Path({str(entry.parent)!r}), {entry.stem!r}); "
        "assert type(kernel).__name__ == 'Function', kernel; "
        "assert not any(m.startswith('cutlass') for m in sys.modules), 'imported CuTe DSL'"
    )
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "CUTE_DSL_ARCH": "sm_80"})
