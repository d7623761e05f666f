"""Clocks: GPU time per call (CUDA events, median), first-call wall time, host overhead per call."""

import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def gpu_time_ms(step: Callable[[], object], warmup_ms: float, rep_ms: float) -> float:
    """Median GPU milliseconds per call, after warmup_ms of warm-up, over about rep_ms of repeats."""
    try:
        from triton.testing import do_bench
    except ImportError:
        return _event_time_ms(step, warmup_ms, rep_ms)
    return do_bench(step, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def _event_time_ms(step: Callable[[], object], warmup_ms: float, rep_ms: float) -> float:
    """do_bench's method without triton: estimate the call time, warm up, then time each call between events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        step()
    end.record()
    end.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        step()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(max(1, int(rep_ms / estimate_ms)))
    ]
    for begin, finish in events:
        begin.record()
        step()
        finish.record()
    torch.cuda.synchronize()
    return statistics.median(begin.elapsed_time(finish) for begin, finish in events)


def wall_ms(call: Callable[[], T]) -> tuple[float, T]:
    """Wall milliseconds of one call until the GPU is done with it (a first call includes compiling)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3, result


def host_overhead_us(step: Callable[[], object], calls: int = 200) -> float:
    """Host microseconds per call: a host clock around many asynchronous launches of a problem too small
    for the GPU to be the bottleneck, stopped before synchronizing."""
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6
