"""Compiling kernels once: an in-memory cache keyed on the config dataclass, backed by an on-disk cache.

Kernels are compiled against symbolic ("fake") tensors: every size and stride is a run-time value, so one
compiled kernel serves every shape, stride and scalar argument, and nothing is ever recompiled because a runtime
value changed. The compiled function uses TVM-FFI, so it takes torch tensors directly and launches on the
caller's current CUDA stream.

The disk cache stores each compiled kernel as an object file (``export_to_c``); a second process loads it instead
of compiling. ``FLASHCUTE_CACHE_DIR`` moves it (default ``~/.cache/flashcute``); ``FLASHCUTE_CACHE_DIR=off``
disables it. An entry's key is made of what changes the generated code, and nothing else:

- the config: the dataclass's name and every field's value;
- the target architecture (``sm_80``, ``sm_90a``, ...);
- the code of the kernel sources: every ``*.py`` under ``flashcute/kernels/`` (the kernels, their builds, configs
  and heuristics), each file as its syntax tree with the docstrings
  and other bare string statements dropped, together with its path in the package. Comments, docstrings and
  formatting leave the key as it is; a change to the code, or a file added, removed, renamed or moved, gives new
  entries;
- the versions of nvidia-cutlass-dsl and apache-tvm-ffi (and, through the form of its syntax trees, Python's minor
  version).

Stale entries are never read again, only left on disk; delete the folder to reclaim the space.
"""

from __future__ import annotations

import ast
import ctypes
import dataclasses
import functools
import gc
import hashlib
import importlib.metadata
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_PACKAGE_DIR = Path(__file__).resolve().parent
_lock = threading.Lock()
_memory: dict[tuple[str, Any], Callable] = {}
compile_seconds: dict[tuple[str, Any], float] = {}


def cache_dir() -> Path | None:
    setting = os.environ.get("FLASHCUTE_CACHE_DIR", "")
    if setting.lower() == "off":
        return None
    return Path(setting) if setting else Path.home() / ".cache" / "flashcute"


def _is_bare_string(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def _drop_docstrings(statements: list[ast.stmt]) -> list[ast.stmt]:
    """The statements without those that are a bare string (docstrings, attribute docstrings: none of them is code),
    in place in every nested body; a nested body that was only such strings becomes ``pass``."""
    kept = [statement for statement in statements if not _is_bare_string(statement)]
    for statement in kept:
        blocks = [statement, *getattr(statement, "handlers", ()), *getattr(statement, "cases", ())]
        for block in blocks:
            for field in ("body", "orelse", "finalbody"):
                body = getattr(block, field, None)
                if body:
                    setattr(block, field, _drop_docstrings(body) or [ast.Pass()])
    return kept


def _code_of(path: Path) -> bytes:
    """The file's code: its syntax tree without docstrings or positions (comments never reach the tree)."""
    source = path.read_bytes()
    try:
        tree = ast.parse(source, filename=str(path))
    except (SyntaxError, ValueError):  # not Python that runs: its bytes, so that the key still follows it
        return b"unparsed\0" + source
    tree.body = _drop_docstrings(tree.body)
    return ast.dump(tree, include_attributes=False).encode()


def fingerprint_tree(root: Path) -> str:
    """Hash of the code of the kernel sources under the package folder ``root``: every ``*.py`` under
    ``root/kernels``, each with its path relative to ``root``."""
    paths = [p for p in (root / "kernels").rglob("*.py") if p.is_file()]
    digest = hashlib.sha256()
    collecting = gc.isenabled()
    gc.disable()  # the syntax trees are tens of thousands of objects and no cycles: collecting would double the time
    try:
        for relative, path in sorted((p.relative_to(root).as_posix(), p) for p in paths):
            code = _code_of(path)
            digest.update(f"{relative}\0{len(code)}\0".encode() + code)
    finally:
        if collecting:
            gc.enable()
    return digest.hexdigest()


@functools.cache
def source_fingerprint() -> str:
    """Hash of the kernel sources' code and the tool versions: a change to either gives new cache entries."""
    digest = hashlib.sha256(fingerprint_tree(_PACKAGE_DIR).encode())
    for dist in ("nvidia-cutlass-dsl", "apache-tvm-ffi"):
        try:
            digest.update(f"|{dist}=={importlib.metadata.version(dist)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"|{dist} missing".encode())
    return digest.hexdigest()[:16]


def entry_name(arch: str, config: Any) -> str:
    fields = json.dumps(dataclasses.asdict(config), sort_keys=True)
    key = hashlib.sha256(f"{type(config).__name__}|{arch}|{fields}|{source_fingerprint()}".encode()).hexdigest()
    return f"{type(config).__name__.lower()}_{arch}_{key[:24]}"


@functools.cache
def _load_runtime_libraries() -> None:
    import cutlass.cute as cute

    for lib in cute.runtime.find_runtime_libraries(enable_tvm_ffi=True):
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)


def _load_from_disk(path: Path, name: str) -> Callable | None:
    if not path.exists():
        return None
    import cutlass.cute as cute

    _load_runtime_libraries()
    try:
        return getattr(cute.runtime.load_module(str(path), enable_tvm_ffi=True), name)
    except Exception:  # a stale or truncated file: recompile and overwrite it
        return None


def _save_to_disk(compiled: Any, path: Path, name: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.o")
    try:
        compiled.export_to_c(str(tmp), function_name=name)
        tmp.replace(path)
    except Exception:  # the disk cache is an optimisation; an export failure only costs a compile next time
        tmp.unlink(missing_ok=True)


def get_compiled(arch: str, config: Any, build: Callable[[], Any]) -> Callable:
    """The compiled kernel for (arch, config): from memory, else from disk, else ``build()`` (and saved)."""
    key = (arch, config)
    compiled = _memory.get(key)
    if compiled is not None:
        return compiled
    with _lock:
        if key in _memory:
            return _memory[key]
        start = time.perf_counter()
        name = entry_name(arch, config)
        directory = cache_dir()
        path = directory / f"{name}.o" if directory else None
        compiled = _load_from_disk(path, name) if path else None
        if compiled is None:
            built = build()
            if path:
                _save_to_disk(built, path, name)
            compiled = built
        compile_seconds[key] = time.perf_counter() - start
        _memory[key] = compiled
        return compiled
