"""Compiling kernels once: an in-memory cache keyed on the config dataclass, backed by an on-disk cache.

Kernels are compiled against symbolic ("fake") tensors: every size and stride is a run-time value, so one
compiled kernel serves every shape, stride and scalar argument, and nothing is ever recompiled because a runtime
value changed. The compiled function uses TVM-FFI, so it takes torch tensors directly and launches on the
caller's current CUDA stream.

The disk cache stores each compiled kernel as a shared library: the object file of ``export_to_c`` linked by the C
compiler (``CC``, default ``cc``) against the CuTe DSL runtime, which TVM-FFI loads without importing CuTe DSL (tens
of milliseconds, where the import takes seconds); without a C compiler, as the object file, which CuTe DSL loads. A
second process loads an entry instead of compiling. ``FLASHCUTE_CACHE_DIR`` moves the cache (default
``~/.cache/flashcute``); ``FLASHCUTE_CACHE_DIR=off`` disables it. An entry's key is made of what changes the
generated code, and nothing else:

- the config: the dataclass's name and every field's value;
- the target architecture (``sm_80``, ``sm_90a``, ...);
- the code of the kernel sources: every ``*.py`` under ``flashcute/kernels/`` (the kernels, their builds, configs
  and heuristics) but the host side (``HOST_SIDE``: each family's launch contract and the tools around the kernels,
  which build none, so that a fix there reuses every cached kernel; tests/test_compile_cache.py holds them to it),
  each file as its syntax tree with the docstrings and other bare string statements dropped, together with its path
  in the package. Comments, docstrings and formatting leave the key as it is; a change to the code, or a file added,
  removed, renamed or moved, gives new entries;
- the versions of nvidia-cutlass-dsl and apache-tvm-ffi (and, through the form of its syntax trees, Python's minor
  version).

Stale entries are never read again, only left on disk; delete the folder to reclaim the space.

A kernel built in the process is written to the disk cache by a thread of its own while the call that asked for it
runs on (``wait_for_saves`` waits for those writes; the interpreter's exit does too).

``build_in_background`` builds kernels a process will soon need (the backward's, while a first training step's
forward builds its own) in a process of its own (compile_worker.py), which writes them to the disk cache: CuTe DSL
builds one kernel at a time in a process, and this way two builds overlap. ``get_compiled`` of such a kernel waits for
that process and loads its entry; where the process failed, it builds the kernel itself.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import dataclasses
import functools
import gc
import hashlib
import importlib.metadata
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_PACKAGE_DIR = Path(__file__).resolve().parent
_lock = threading.Lock()
_memory: dict[tuple[str, Any], Callable] = {}
compile_seconds: dict[tuple[str, Any], float] = {}
_built: dict[tuple[str, Any], Any] = {}  # CuTe DSL's objects of the kernels compiled in this process
_building: dict[tuple[str, Any], subprocess.Popen] = {}  # the background builds (build_in_background) by kernel
_saving: list[threading.Thread] = []  # the writes of kernels built here to the disk cache (_save_in_background)
_save_lock = threading.Lock()  # one write at a time
BACKGROUND_BUILD_TIMEOUT_S = 600
"""The longest get_compiled waits for a background build (a few seconds a kernel) before it builds the kernel itself."""


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


# The host side of flashcute/kernels (paths in the package): launch contracts, the registry and the tools that read
# or list kernels. They build no kernel and no kernel source imports them, so they are no part of the cache's key.
HOST_SIDE = (
    "kernels/launch.py",
    "kernels/registry.py",
    "kernels/variants.py",
    "kernels/sass.py",
    "kernels/common/prepost.py",
)


def is_host_side(relative: str) -> bool:
    """Whether the file at ``relative`` (its path in the package) is on the host side: HOST_SIDE, or a family's
    launch contract (its family.py)."""
    return relative in HOST_SIDE or relative.endswith("/family.py")


def kernel_sources(root: Path) -> list[tuple[str, Path]]:
    """(path relative to the package folder ``root``, path) of every kernel source under ``root/kernels``: the
    ``*.py`` files but the host side, sorted."""
    paths = ((p.relative_to(root).as_posix(), p) for p in (root / "kernels").rglob("*.py") if p.is_file())
    return sorted((relative, p) for relative, p in paths if not is_host_side(relative))


def fingerprint_tree(root: Path) -> str:
    """Hash of the code of the kernel sources under the package folder ``root`` (kernel_sources), each with its
    path relative to ``root``."""
    digest = hashlib.sha256()
    collecting = gc.isenabled()
    gc.disable()  # the syntax trees are tens of thousands of objects and no cycles: collecting would double the time
    try:
        for relative, path in kernel_sources(root):
            code = _code_of(path)
            digest.update(f"{relative}\0{len(code)}\0".encode() + code)
    finally:
        if collecting:
            gc.enable()
    return digest.hexdigest()


@functools.cache
def source_fingerprint() -> str:
    """Hash of the kernel sources' code and the tool versions: a change to either gives new cache entries.

    Parsing the sources takes a tenth of a second, which a process that only loads kernels should not pay: the
    result is kept in the cache folder under a hash of the sources' bytes and the tool versions, which is quick."""
    versions = []
    for dist in ("nvidia-cutlass-dsl", "apache-tvm-ffi"):
        try:
            versions.append(f"|{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"|{dist} missing")
    raw = hashlib.sha256("".join(versions).encode())
    for relative, path in kernel_sources(_PACKAGE_DIR):
        raw.update(f"{relative}\0".encode() + path.read_bytes())
    directory = cache_dir()
    memo = directory / "fingerprints" / raw.hexdigest()[:32] if directory else None
    if memo is not None and memo.is_file():
        return memo.read_text().strip()
    digest = hashlib.sha256(fingerprint_tree(_PACKAGE_DIR).encode())
    digest.update("".join(versions).encode())
    fingerprint = digest.hexdigest()[:16]
    if memo is not None:
        _write_atomically(memo, fingerprint.encode())
    return fingerprint


def _write_atomically(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    except OSError:  # a read-only cache folder: the memo is an optimisation
        pass


def entry_name(arch: str, config: Any) -> str:
    fields = json.dumps(dataclasses.asdict(config), sort_keys=True)
    key = hashlib.sha256(f"{type(config).__name__}|{arch}|{fields}|{source_fingerprint()}".encode()).hexdigest()
    return f"{type(config).__name__.lower()}_{arch}_{key[:24]}"


ENTRY_SUFFIXES = (".so", ".o")  # a shared library where a C compiler linked one, else the object file


def entries(directory: Path) -> list[Path]:
    """The cache entries in ``directory``."""
    if not directory.is_dir():
        return []
    return sorted(path for suffix in ENTRY_SUFFIXES for path in directory.glob(f"*{suffix}"))


@functools.cache
def _load_runtime_libraries() -> None:
    import cutlass.cute as cute

    for lib in cute.runtime.find_runtime_libraries(enable_tvm_ffi=True):
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)


def _load_from_disk(directory: Path, name: str) -> Callable | None:
    """The kernel of entry ``name``: a shared library through TVM-FFI alone, an object file through CuTe DSL."""
    library, obj = (directory / f"{name}{suffix}" for suffix in ENTRY_SUFFIXES)
    try:
        if library.exists():
            import tvm_ffi

            return tvm_ffi.load_module(str(library))[name]
        if obj.exists():
            import cutlass.cute as cute

            _load_runtime_libraries()
            return getattr(cute.runtime.load_module(str(obj), enable_tvm_ffi=True), name)
    except Exception:  # a stale, truncated or unlinkable file: recompile and overwrite it
        return None
    return None


def _link(obj: Path, library: Path) -> bool:
    """Link ``obj`` into the shared library ``library`` against the CuTe DSL runtime (found through its rpath)."""
    import cutlass.cute as cute

    flags = []
    for lib in map(Path, cute.runtime.find_runtime_libraries(enable_tvm_ffi=True)):
        name = lib.name.removeprefix("lib").removesuffix(".so")
        flags += [f"-L{lib.parent}", f"-l{name}", f"-Wl,-rpath,{lib.parent}"]
    command = [os.environ.get("CC", "cc"), "-shared", "-o", str(library), str(obj), *flags]
    try:
        return subprocess.run(command, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):  # no C compiler: the object file it is
        return False


def _save_to_disk(compiled: Any, directory: Path, name: str) -> None:
    """Write ``compiled`` into the cache folder as entry ``name``; where the folder cannot be made or written, or the
    export fails, nothing: the disk cache is an optimisation, and a missing entry only costs a compile next time."""
    stem = f"{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    obj, library = directory / f"{stem}.o", directory / f"{stem}.so"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        compiled.export_to_c(str(obj), function_name=name)
        if _link(obj, library):
            library.replace(directory / f"{name}.so")
        else:
            obj.replace(directory / f"{name}.o")
    except Exception:
        pass
    finally:
        for path in (obj, library):
            with contextlib.suppress(OSError):  # (not there, or no folder to be in)
                path.unlink(missing_ok=True)


def _save_in_background(compiled: Any, directory: Path, name: str) -> None:
    """_save_to_disk on a thread of its own, so that the call that built the kernel launches it without waiting
    for the export and the link (a fifth of a second of a first call; docs/benchmarking.md). The thread is no
    daemon: the interpreter's exit waits for it, so the entry is on disk for the next process."""

    def save() -> None:
        with _save_lock:
            _save_to_disk(compiled, directory, name)

    thread = threading.Thread(target=save, name=f"flashcute-save-{name}")
    thread.start()
    _saving.append(thread)


def wait_for_saves() -> None:
    """Return once every kernel this process has built so far is written to the disk cache."""
    while _saving:
        _saving.pop().join()


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's threads: no write to wait for, and a lock that no thread holds."""
    global _save_lock
    _saving.clear()
    _save_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _bare_function(compiled: Any) -> Callable:
    """The TVM-FFI function under a kernel compiled in this process, the same callable a disk-cache entry loads as:
    CuTe DSL's own wrapper rearranges keyword and default arguments in Python at every call, and every launch passes
    all arguments by position (None for the optional ones a variant leaves out)."""
    unwrap = getattr(compiled, "__tvm_ffi_object__", None)
    function = unwrap() if unwrap is not None else None
    return compiled if function is None else function


def build_in_background(arch: str, configs: list) -> None:
    """Start building those of ``configs``'s kernels for ``arch`` that are neither in memory, nor on disk, nor being
    built, in one new process (compile_worker.py) that writes them to the disk cache, and return at once. Nothing
    without a disk cache one can write to, and nothing where the process cannot be started (get_compiled then
    builds them here)."""
    directory = cache_dir()
    if directory is None or not writable(directory):  # (a process that cannot hand its kernels over: none)
        return
    with _lock:
        keys = [
            (arch, config) for config in configs if (arch, config) not in _memory and (arch, config) not in _building
        ]
        keys = [key for key in keys if not any((directory / f"{entry_name(*key)}{s}").exists() for s in ENTRY_SUFFIXES)]
        if not keys:
            return
        package = __name__.partition(".")[0]  # (flashcute, or the renamed copy of `flashcute compare`)
        # this package's files first, whatever folder the process starts in
        start = f"import sys; sys.path.insert(0, {str(_PACKAGE_DIR.parent)!r}); import {package}.compile_worker as w"
        env = dict(os.environ, FLASHCUTE_CACHE_DIR=str(directory))
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", f"{start}; w.main()"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
            )
            process.stdin.write(pickle.dumps((arch, [config for _, config in keys])))
            process.stdin.close()
        except OSError:  # no process, or one that died at once: get_compiled builds them
            return
        threading.Thread(target=process.wait, daemon=True).start()  # (reaped even if no call waits for it)
        _building.update(dict.fromkeys(keys, process))


def writable(directory: Path) -> bool:
    """Whether ``directory`` is (or can be made) a folder this process can write into."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(directory, os.W_OK)


def _wait_for_background_build(key: tuple[str, Any]) -> None:
    """Wait for the background build of ``key``'s kernel, if one was started (up to BACKGROUND_BUILD_TIMEOUT_S)."""
    process = _building.pop(key, None)
    if process is None:
        return
    try:
        process.wait(BACKGROUND_BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()


def get_compiled(arch: str, config: Any, build: Callable[[], Any]) -> Callable:
    """The compiled kernel for (arch, config): from memory, else from disk (after the background build of it, if
    one was started), else ``build()`` (and saved)."""
    key = (arch, config)
    compiled = _memory.get(key)
    if compiled is not None:
        return compiled
    with _lock:
        if key in _memory:
            return _memory[key]
        start = time.perf_counter()
        _wait_for_background_build(key)
        name = entry_name(arch, config)
        directory = cache_dir()
        compiled = _load_from_disk(directory, name) if directory else None
        if compiled is None:
            built = build()
            if directory:
                _save_in_background(built, directory, name)
            _built[key] = built  # (its CUDA library unloads when it is collected)
            compiled = _bare_function(built)
        compile_seconds[key] = time.perf_counter() - start
        _memory[key] = compiled
        return compiled
