"""The disk cache's key, on the CPU: it follows the kernel sources' code, not their comments, docstrings or layout."""

from __future__ import annotations

import ast
import dataclasses
import shutil
import time
from pathlib import Path

import pytest

from flashcute import compile_cache
from flashcute.compile_cache import _code_of, entry_name, fingerprint_tree, source_fingerprint

PACKAGE_DIR = Path(compile_cache.__file__).resolve().parent

PROBE = '''"""A module the tests edit."""

import math

TILE = 128


class Tile:
    """A tile."""

    size: int = TILE
    """Its size."""

    def area(self, other):
        """Its area."""
        # a comment
        return self.size * other + math.floor(1.5)

    def nothing(self):
        pass
'''


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A small package: kernels/ with the probe module among others, and a module outside kernels/."""
    root = tmp_path / "flashcute"
    files = {
        "kernels/__init__.py": "",
        "kernels/common/__init__.py": '"""Shared pieces."""\n',
        "kernels/common/utils.py": "def ceil_div(a, b):\n    return (a + b - 1) // b\n",
        "kernels/sm80/__init__.py": "",
        "kernels/sm80/probe.py": PROBE,
        "kernels/sm90/__init__.py": "",
        "kernels/sm90/config.py": "import dataclasses\n\n\n@dataclasses.dataclass\nclass C:\n    n: int = 2\n",
        "cli.py": "def main():\n    return 0\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def _probe(package: Path) -> Path:
    return package / "kernels" / "sm80" / "probe.py"


def test_every_kernel_source_parses():
    paths = (PACKAGE_DIR / "kernels").rglob("*.py")
    assert [p for p in paths if _code_of(p).startswith(b"unparsed")] == []


def test_same_tree_same_key(package: Path, tmp_path: Path):
    key = fingerprint_tree(package)
    assert len(key) == 64
    assert fingerprint_tree(package) == key
    shutil.copytree(package, tmp_path / "elsewhere" / "flashcute")
    assert fingerprint_tree(tmp_path / "elsewhere" / "flashcute") == key  # where the package lies is no part of it


def test_real_tree_same_key(tmp_path: Path):
    copy = tmp_path / "copy" / "flashcute"
    shutil.copytree(PACKAGE_DIR / "kernels", copy / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    key = fingerprint_tree(copy)
    shutil.copytree(copy, tmp_path / "again" / "flashcute")  # a copy of the copy: the real tree may be edited meanwhile
    assert fingerprint_tree(tmp_path / "again" / "flashcute") == key
    with (copy / "kernels" / "__init__.py").open("a") as init:
        init.write("\n# a comment\n")
    assert fingerprint_tree(copy) == key


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("import math\n", "import math  # for floor\n"),
        ("    def area", "    # a new comment line, which moves every line below\n\n    def area"),
        ("        # a comment\n", ""),
        ("TILE = 128\n", "TILE = (\n    128\n)\n"),
        ("math.floor(1.5)", "math.floor( 1.5 )"),
    ],
    ids=["comment-added", "comment-line-added", "comment-removed", "reflowed", "spaces"],
)
def test_comments_and_layout_keep_the_key(package: Path, old: str, new: str):
    key = fingerprint_tree(package)
    _edit(_probe(package), old, new)
    assert fingerprint_tree(package) == key


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"""A module the tests edit."""', '"""A module the tests edit, and a longer docstring."""'),
        ('"""A module the tests edit."""\n', ""),
        ('"""A tile."""', "'''A tile,\n    over two lines.'''"),
        ('        """Its area."""\n', ""),
        ('    """Its size."""\n', '    """Its size in elements."""\n'),
        ("        pass\n", '        """Does nothing."""\n'),
        ("        pass\n", '        """Does nothing."""\n        pass\n'),
    ],
    ids=["module", "module-removed", "class", "method-removed", "attribute", "only-docstring", "docstring-added"],
)
def test_docstrings_keep_the_key(package: Path, old: str, new: str):
    key = fingerprint_tree(package)
    _edit(_probe(package), old, new)
    assert fingerprint_tree(package) == key


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("TILE = 128", "TILE = 64"),
        ("self.size * other", "self.size + other"),
        ("math.floor(1.5)", "math.ceil(1.5)"),
        ("def area(self, other)", "def area(self, other, scale=1)"),
        ("        pass\n", "        return None\n"),
        ("        # a comment\n", '        "a string that is " + "code"\n'),
    ],
    ids=["constant", "operator", "call", "signature", "statement", "expression"],
)
def test_code_changes_the_key(package: Path, old: str, new: str):
    key = fingerprint_tree(package)
    _edit(_probe(package), old, new)
    assert fingerprint_tree(package) != key


def test_code_anywhere_in_the_tree_changes_the_key(package: Path):
    key = fingerprint_tree(package)
    (package / "kernels" / "sm90" / "deeper").mkdir(parents=True)
    added = package / "kernels" / "sm90" / "deeper" / "extra.py"
    added.write_text('"""Only a docstring."""\n')
    with_file = fingerprint_tree(package)
    assert with_file != key  # a new file is a new module
    added.write_text("X = 1\n")
    assert fingerprint_tree(package) != with_file
    added.unlink()
    assert fingerprint_tree(package) == key


def test_other_files_do_not_count(package: Path):
    key = fingerprint_tree(package)
    (package / "tools.py").write_text("X = 1\n")
    (package / "cli.py").write_text("def main():\n    return 1\n")
    (package / "kernels" / "notes.md").write_text("# notes\n")
    (package / "kernels" / "sm80" / "probe.pyc").write_bytes(b"\0")
    assert fingerprint_tree(package) == key


def test_the_host_side_does_not_count(package: Path):
    """A family's launch contract and the shared host modules (compile_cache.HOST_SIDE): a fix there keeps every
    cached kernel."""
    key = fingerprint_tree(package)
    for relative in ("kernels/sm80/family.py", *compile_cache.HOST_SIDE):
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text("def launch(*args):\n    return args\n")
    assert fingerprint_tree(package) == key
    (package / "kernels" / "sm80" / "build.py").write_text("def compile(config):\n    return config\n")
    assert fingerprint_tree(package) != key


def _imports(tree: ast.AST) -> set[str]:
    """The modules a syntax tree imports, and for ``from M import N`` also M.N (N may be a module)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _module_of(relative: str) -> str:
    return "flashcute." + relative.removesuffix(".py").replace("/", ".")


def test_no_kernel_source_imports_the_host_side():
    """What the key leaves out cannot reach a kernel's code: no kernel source imports a host-side module (a
    constant there would change kernels while the key stays)."""
    host = {
        _module_of(p.relative_to(PACKAGE_DIR).as_posix())
        for p in (PACKAGE_DIR / "kernels").rglob("*.py")
        if compile_cache.is_host_side(p.relative_to(PACKAGE_DIR).as_posix())
    }
    assert {"flashcute.kernels.sm90.family", "flashcute.kernels.launch"} <= host
    for relative, path in compile_cache.kernel_sources(PACKAGE_DIR):
        assert not _imports(ast.parse(path.read_text())) & host, relative


def test_the_host_side_builds_no_kernel():
    """The host side calls the families' builds (kernel sources) but builds nothing itself: no symbolic problem,
    no compile, no CuTe DSL's cute."""
    building = {"SymbolicProblem", "compile_kernel", "optional_arguments", "make_fake_tensor"}
    for path in (PACKAGE_DIR / "kernels").rglob("*.py"):
        relative = path.relative_to(PACKAGE_DIR).as_posix()
        if not compile_cache.is_host_side(relative):
            continue
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not names & building, (relative, names & building)
        assert not {m for m in _imports(tree) if m.startswith("cutlass.cute")}, relative


@pytest.mark.parametrize(
    "destination",
    ["kernels/sm80/probe2.py", "kernels/sm90/probe.py", "kernels/probe.py", "kernels/common/deeper/probe.py"],
    ids=["renamed", "moved", "moved-up", "moved-down"],
)
def test_moving_a_file_changes_the_key(package: Path, destination: str):
    key = fingerprint_tree(package)
    target = package / destination
    target.parent.mkdir(parents=True, exist_ok=True)
    _probe(package).rename(target)
    assert fingerprint_tree(package) != key


def test_unparsable_file_still_follows_its_bytes(package: Path):
    broken = package / "kernels" / "sm80" / "broken.py"
    broken.write_text("def f(:\n")
    key = fingerprint_tree(package)
    broken.write_text("def f(:  # still broken\n")
    assert fingerprint_tree(package) != key


def test_fingerprint_is_cheap():
    start = time.process_time()
    fingerprint_tree(PACKAGE_DIR)
    assert time.process_time() - start < 1.0  # ~0.1 s for ~6k lines; a generous bound for a loaded CI machine


@dataclasses.dataclass(frozen=True)
class _Config:
    tile_m: int = 128
    tile_n: int = 64
    causal: bool = False


def testentry_name_follows_each_field():
    base = entry_name("sm_90a", _Config())
    assert base.startswith("_config_sm_90a_")
    names = {
        base,
        entry_name("sm_90a", _Config(tile_m=64)),
        entry_name("sm_90a", _Config(tile_n=128)),
        entry_name("sm_90a", _Config(causal=True)),
        entry_name("sm_80", _Config()),
    }
    assert len(names) == 5


def testentry_name_is_stable():
    name = entry_name("sm_80", _Config(tile_n=32))
    assert entry_name("sm_80", _Config(tile_n=32)) == name
    source_fingerprint.cache_clear()  # computed afresh from the same files: the same key
    assert entry_name("sm_80", _Config(tile_n=32)) == name


def test_a_kernel_built_here_is_written_to_disk_while_the_call_goes_on(tmp_path: Path, monkeypatch):
    """get_compiled hands out a kernel it built before the kernel is on disk (the write takes a thread of its own);
    wait_for_saves returns once it is there, and the next lookup in a fresh process finds it."""
    import threading

    monkeypatch.setenv("FLASHCUTE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_cache, "_memory", {})
    monkeypatch.setattr(compile_cache, "_built", {})
    release = threading.Event()

    class Built:
        def export_to_c(self, path: str, function_name: str) -> None:
            assert release.wait(60)  # the export waits until the caller has its kernel
            Path(path).write_bytes(b"an object file")

    monkeypatch.setattr(compile_cache, "_link", lambda obj, library: False)  # (kept as the object file)
    config = _Config(tile_m=16)
    kernel = compile_cache.get_compiled("sm_80", config, Built)
    assert isinstance(kernel, Built) and not compile_cache.entries(tmp_path)  # handed out, not yet written
    release.set()
    compile_cache.wait_for_saves()
    assert [path.name for path in compile_cache.entries(tmp_path)] == [f"{entry_name('sm_80', config)}.o"]


def test_a_cache_folder_that_cannot_be_made_costs_only_the_disk_entry(tmp_path: Path, monkeypatch):
    """A cache folder that cannot be made (here: under a regular file; a read-only home alike) leaves the kernel in
    memory: get_compiled hands it out, its write to disk gives up quietly (no exception on the writing thread), and
    the next lookup of it in the process finds it in memory."""
    import threading

    blocker = tmp_path / "a file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("FLASHCUTE_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(compile_cache, "_memory", {})
    monkeypatch.setattr(compile_cache, "_built", {})
    raised = []
    monkeypatch.setattr(threading, "excepthook", raised.append)
    exports = []

    class Built:
        def export_to_c(self, path: str, function_name: str) -> None:
            exports.append(path)

    config = _Config(tile_m=24)
    kernel = compile_cache.get_compiled("sm_80", config, Built)
    compile_cache.wait_for_saves()
    assert isinstance(kernel, Built) and raised == [] and exports == []
    assert compile_cache.get_compiled("sm_80", config, lambda: pytest.fail("built again")) is kernel


def _every_kind_of_launch(kernel: str) -> list:
    """Outputs of a call of each kind that family ``kernel`` serves (the forward, dense and packed; the backward,
    atomic and deterministic, with its preprocess and postprocess; split-KV decoding with its combine, with and
    without sinks), small bf16 problems at head dim 64; each with whether it is bitwise reproducible (dQ added
    with atomics is not)."""
    import torch

    import flashcute

    generator = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, grad=False):
        t = torch.randn(*shape, generator=generator, device="cuda", dtype=torch.bfloat16)
        return t.requires_grad_(grad)

    results = []
    q, k, v = randn(2, 200, 4, 64, grad=True), randn(2, 300, 2, 64, grad=True), randn(2, 300, 2, 64, grad=True)
    for deterministic in (False, True):
        out = flashcute.flash_attn_func(q, k, v, causal=True, deterministic=deterministic, kernel=kernel)
        dq, dk, dv = torch.autograd.grad(out.float().square().sum(), (q, k, v))
        results += [(out, True), (dq, deterministic), (dk, True), (dv, True)]
    cu_seqlens_q = torch.tensor([0, 70, 200], dtype=torch.int32, device="cuda")
    cu_seqlens_k = torch.tensor([0, 130, 300], dtype=torch.int32, device="cuda")
    packed = (q.flatten(0, 1)[:200], k.flatten(0, 1)[:300], v.flatten(0, 1)[:300], cu_seqlens_q, cu_seqlens_k, 130, 170)
    out = flashcute.flash_attn_varlen_func(*packed, causal=True, kernel=kernel)
    dq, dk, dv = torch.autograd.grad(out.float().square().sum(), packed[:3])
    results += [(out, True), (dq, False), (dk, True), (dv, True)]
    with torch.no_grad():
        k_cache, v_cache = randn(2, 4096, 2, 64), randn(2, 4096, 2, 64)
        sink = torch.randn(4, generator=generator, device="cuda")
        for learnable_sink in (None, sink):
            out, lse = flashcute.flash_attn_with_kvcache(
                q[:, :1], k_cache, v_cache, cache_seqlens=4000, learnable_sink=learnable_sink, return_lse=True,
                kernel=kernel,
            )  # fmt: skip
            results += [(out, True), (lse, True)]
    return results


@pytest.mark.gpu
def test_kernels_loaded_from_the_disk_cache_run_as_compiled(kernel, monkeypatch):
    """Every kind of launch runs with the kernel a new process would load from the disk cache (a shared library's
    TVM-FFI function, which takes every argument by position) as with the one compiled or loaded first: bitwise, or
    within a rounding of bf16 for dQ added with atomics."""
    import torch

    from flashcute import interface
    from flashcute.kernels import launch, registry

    directory = compile_cache.cache_dir()
    if directory is None:
        pytest.skip("FLASHCUTE_CACHE_DIR=off: no disk cache")
    first = _every_kind_of_launch(kernel)  # compiled and saved, or loaded (then the same check already ran)
    memos = [(compile_cache, "_memory"), (launch, "_by_device"), (registry, "_forward_launchers")]
    for module, name in [*memos, (interface, "_plans")]:
        monkeypatch.setattr(module, name, {})
    second = _every_kind_of_launch(kernel)
    for arch, config in compile_cache._memory:
        name = entry_name(arch, config)
        assert any((directory / f"{name}{suffix}").exists() for suffix in compile_cache.ENTRY_SUFFIXES), name
    assert len(first) == len(second)
    for i, ((a, exact), (b, _)) in enumerate(zip(first, second, strict=True)):
        if exact:
            assert torch.equal(a, b), f"output {i} differs"
        else:
            torch.testing.assert_close(a, b, rtol=2**-7, atol=1e-3, msg=f"output {i} differs")


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_a_first_training_step_builds_its_backward_beside_its_forward(kernel, packed, tmp_path, monkeypatch):
    """A signature's first forward on inputs that require grad (flash_attn_func's, flash_attn_varlen_func's) starts
    building the backward's kernels in another process (compile_cache.build_in_background); the backward then loads
    exactly those from the disk cache and builds none of them here, and its gradients are those of the same kernels
    built in this process."""
    import torch

    import flashcute
    from flashcute import interface
    from flashcute.kernels import launch, registry

    def new_process_state(cache: str) -> None:
        monkeypatch.setenv("FLASHCUTE_CACHE_DIR", cache)
        for module, name in [(compile_cache, "_memory"), (compile_cache, "_built"), (compile_cache, "_building")]:
            monkeypatch.setattr(module, name, {})
        for module, name in [(launch, "_by_device"), (registry, "_forward_launchers"), (interface, "_plans")]:
            monkeypatch.setattr(module, name, {})
        monkeypatch.setattr(interface, "_varlen_backward_built", set())

    def step() -> list:
        if packed:
            cu_seqlens = torch.tensor([0, 70, 200], dtype=torch.int32, device="cuda")
            tokens = (t[0] for t in (q, k, v))
            out = flashcute.flash_attn_varlen_func(
                *tokens, cu_seqlens, cu_seqlens, 130, 130, causal=True, kernel=kernel
            )
        else:
            out = flashcute.flash_attn_func(q, k, v, causal=True, kernel=kernel)
        ahead = list(compile_cache._building)
        return [ahead, out, *torch.autograd.grad(out.float().square().sum(), (q, k, v))]

    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(1, 200, 2, 64, generator=generator, device="cuda", dtype=torch.bfloat16).requires_grad_()
        for _ in range(3)
    )
    new_process_state(str(tmp_path))
    ahead, *background = step()
    assert ahead, "no backward kernel was built ahead"
    assert all(key in compile_cache._memory and key not in compile_cache._built for key in ahead)
    new_process_state("off")  # no disk cache: every kernel built here
    none_ahead, *here = step()
    assert none_ahead == []
    for name, a, b in zip(("out", "dq", "dk", "dv"), background, here, strict=True):
        if name == "dq":  # (added by atomics)
            torch.testing.assert_close(a, b, rtol=2**-7, atol=1e-3)
        else:
            assert torch.equal(a, b), f"{name} differs"
