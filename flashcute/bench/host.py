"""Host time: what a call costs the CPU where the GPU never holds it back, and first calls in fresh processes.

Small calls (decoding, short sequences, models with many layers) go as fast as the Python around the kernel, and a
program's first call as fast as its kernels load or compile. `flashcute bench` measures both for every backend it
times, beside the sweep, so that each change to the host path is held to figures taken in the same run.

- ``host_overheads``: microseconds a call, for a problem as small as can be (B=1, L=128, H=2), 200 calls back to
  back and a host clock stopped before synchronizing: the forward; the forward with inputs that require grad (the
  autograd graph is built); the forward inside ``torch.compile``; the backward alone.
- ``first_calls``: a fresh Python process per backend and cache state times the backend's import, its first
  forward and then its first forward and backward (inputs made, and CUDA up, before the clock starts). "cold" runs
  with an empty flashcute kernel cache, "warm" with the one the cold process filled. For flashcute's backends
  "fwd kernels" is the part of the first forward spent getting its kernels: compiling them (cold) or loading them
  from the disk cache (warm); the rest of a cold first forward is mostly CuTe DSL's import.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from flashcute.bench.backends import Backend
from flashcute.bench.grid import Shape
from flashcute.bench.inputs import make_inputs
from flashcute.bench.passes import make_step, run_pass
from flashcute.bench.timing import host_overhead_us, wall_ms

CALL_KINDS = ("fwd", "fwd with grad", "fwd compiled", "bwd")
FIRST_CALLS = ("import", "fwd", "fwd+bwd")
CACHE_STATES = ("cold", "warm")
FIRST_CALL_TIMEOUT_S = 600


def tiny(like: Shape) -> Shape:
    """like's dtype and head dims at the smallest problem: one sequence of 128, two heads."""
    return dataclasses.replace(like, causal=False, seqlen=128, batch=1, nheads=2)


def host_overheads(backends: list[Backend], like: Shape) -> dict[str, dict[str, float | str]]:
    """Per backend and CALL_KINDS kind: host microseconds a call, or why it could not be measured."""
    from flashcute.bench.runner import attempt

    shape = tiny(like)

    def overhead(backend: Backend, kind: str) -> float | str:
        pass_ = "bwd" if kind == "bwd" else "fwd"
        reason = backend.supports(shape, pass_)
        if reason:
            return reason

        def measure() -> float:
            fn = backend.build(shape)
            if kind == "fwd compiled":
                fn = torch.compile(fn)
            inputs = [make_inputs(shape, with_grad=kind in ("fwd with grad", "bwd"))]
            return host_overhead_us(make_step(fn, inputs, pass_))

        us, failure = attempt(backend, measure)
        return us if failure is None else failure[1]

    return {backend.name: {kind: overhead(backend, kind) for kind in CALL_KINDS} for backend in backends}


def first_calls(backends: list[Backend], like: Shape) -> dict[str, dict[str, float | str]]:
    """Per backend, "<state> <call>" for CACHE_STATES x FIRST_CALLS: seconds in a fresh process, or why not."""
    found = {}
    for backend in backends:
        found[backend.name] = {}
        with tempfile.TemporaryDirectory(prefix="flashcute-cold-cache-") as cache:
            for state in CACHE_STATES:
                for call, value in _first_call_process(backend.name, tiny(like), cache).items():
                    found[backend.name][f"{state} {call}"] = value
    return found


def _first_call_process(name: str, shape: Shape, cache: str) -> dict[str, float | str]:
    dims = [str(shape.headdim), str(shape.v_headdim)]
    command = [sys.executable, "-m", "flashcute.bench.host", name, shape.dtype, *dims]
    env = {**os.environ, "FLASHCUTE_CACHE_DIR": cache}
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=FIRST_CALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return dict.fromkeys(FIRST_CALLS, f"no result within {FIRST_CALL_TIMEOUT_S} s")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:200]
        return dict.fromkeys(FIRST_CALLS, why)
    return json.loads(lines[-1])


def first_call(name: str, shape: Shape) -> dict[str, float | str]:
    """In this (fresh) process: seconds to import the backend, its first forward, then its first forward and
    backward; a call that fails gives its reason instead."""
    plain = make_inputs(shape, with_grad=False)
    with_grad = make_inputs(shape, with_grad=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    from flashcute.bench.backends import registry

    backend = registry()[name]
    found: dict[str, float | str] = {}
    try:
        with backend.context():
            fn = backend.build(shape)
            found["import"] = time.perf_counter() - start
            found["fwd"] = wall_ms(lambda: fn(plain.q, plain.k, plain.v))[0] / 1e3
            kernels = kernel_seconds()
            if kernels:
                found["fwd kernels"] = kernels
            found["fwd+bwd"] = wall_ms(lambda: run_pass(fn, with_grad, "fwd+bwd"))[0] / 1e3
    except Exception as exc:  # what did not run is reported with its reason
        for call in FIRST_CALLS:
            found.setdefault(call, f"{type(exc).__name__}: {exc}"[:200])
    return found


def kernel_seconds() -> float:
    """Seconds flashcute's kernel cache has spent in this process getting kernels (compiling, or loading from disk);
    0 where no flashcute kernel was asked for."""
    from flashcute import compile_cache

    return sum(compile_cache.compile_seconds.values())


if __name__ == "__main__":
    name, dtype, headdim, headdim_v = sys.argv[1:]
    width = None if headdim_v == headdim else int(headdim_v)
    like = Shape(dtype=dtype, headdim=int(headdim), causal=False, seqlen=128, batch=1, nheads=2, headdim_v=width)
    print(json.dumps(first_call(name, like)))
