"""Compiling kernels once: an in-memory cache keyed on the config dataclass, backed by an on-disk cache.

Kernels are compiled against symbolic ("fake") tensors: every size and stride is a run-time value, so one
compiled kernel serves every shape, stride and scalar argument, and nothing is ever recompiled because a runtime
value changed. The compiled function uses TVM-FFI, so it takes torch tensors directly and launches on the
caller's current CUDA stream.

The disk cache stores each compiled kernel as an object file (``export_to_c``) under a key made of the config,
the target architecture and a fingerprint of flashcute's kernel sources and the tool versions; a second process
loads it instead of compiling. ``FLASHCUTE_CACHE_DIR`` moves it (default ``~/.cache/flashcute``);
``FLASHCUTE_CACHE_DIR=off`` disables it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
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
# What a compiled kernel is made of: the device code, its build and its config (not the tooling beside them).
_KERNEL_SOURCES = ("kernels/common", "kernels/sm80", "kernels/sm90", "kernels/build.py", "config.py")
_lock = threading.Lock()
_memory: dict[tuple[str, Any], Callable] = {}
compile_seconds: dict[tuple[str, Any], float] = {}


def cache_dir() -> Path | None:
    setting = os.environ.get("FLASHCUTE_CACHE_DIR", "")
    if setting.lower() == "off":
        return None
    return Path(setting) if setting else Path.home() / ".cache" / "flashcute"


@functools.cache
def source_fingerprint() -> str:
    """Hash of the kernel sources, config.py and the tool versions: any change gives new cache entries."""
    digest = hashlib.sha256()
    paths = [p for source in _KERNEL_SOURCES for p in (_PACKAGE_DIR / source).glob("**/*.py")]
    paths += [_PACKAGE_DIR / source for source in _KERNEL_SOURCES if source.endswith(".py")]
    for path in sorted(paths):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    for dist in ("nvidia-cutlass-dsl", "apache-tvm-ffi"):
        try:
            digest.update(f"{dist}=={importlib.metadata.version(dist)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{dist} missing".encode())
    return digest.hexdigest()[:16]


def _entry_name(arch: str, config: Any) -> str:
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
        name = _entry_name(arch, config)
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
