"""scripts/ab_inprocess.py's `prepare`: an earlier commit's package, renamed, imports beside this one."""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_prepare_renames_every_import(tmp_path):
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    subprocess.run([sys.executable, "scripts/ab_inprocess.py", "prepare", "HEAD", str(tmp_path)], cwd=ROOT, check=True)
    package = tmp_path / "flashcute_base"
    sources = {path: path.read_text() for path in package.rglob("*.py")}
    assert package / "kernels" / "sm90" / "fwd.py" in sources
    for path, text in sources.items():
        assert not re.search(r"\bflashcute\.|^\s*(from|import) flashcute\b", text, flags=re.M), path
    sys.path.insert(0, str(tmp_path))
    try:
        base = importlib.import_module("flashcute_base.config")
        assert base.__file__.startswith(str(package))
        assert base.sm90_fwd_config(128, "bfloat16").head_dim_padded == 128
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name.startswith("flashcute_base")]:
            del sys.modules[name]
