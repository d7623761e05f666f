"""The sweep: every backend on every shape, each row's failure caught and recorded as its reason."""

import dataclasses
import gc
import statistics
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import torch

from flashcute.bench.backends import Backend
from flashcute.bench.check import Checker
from flashcute.bench.grid import Shape
from flashcute.bench.inputs import InputSet, make_rotation
from flashcute.bench.passes import NoBackward, make_step, run_pass
from flashcute.bench.results import Row
from flashcute.bench.timing import gpu_time_ms, wall_ms

T = TypeVar("T")
UNSUPPORTED = (NoBackward, NotImplementedError, ValueError, TypeError)
"""Exceptions that mean "this backend does not do that" (flashcute validates arguments with ValueError/TypeError)."""
SDPA_REFUSALS = ("No available kernel", "No viable backend")
"""How SDPA says that the backend it was forced to use cannot run the inputs (CUDA, CPU)."""
MAX_REASON = 400


@dataclass(frozen=True)
class Settings:
    pass_: str = "fwd"
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    check: bool = True
    rounds: int = 1
    """How many times each backend of a shape is timed, in turn with the others, each round in round_order's order;
    a row keeps the median. The GPU's clock drifts with its temperature and idle spells, so one reading favors
    whichever backend the drift favors; alternating rounds give every backend the same conditions. At the power cap
    a reading also depends on what ran just before it (docs/benchmarking.md, Rounds in a balanced order):
    round_order gives every backend every predecessor in turn."""


def sweep(shapes: list[Shape], backends: list[Backend], settings: Settings) -> Iterator[Row]:
    """One row per (shape, backend), shape by shape. Inputs are made once per shape, only if a backend runs it."""
    checker = Checker() if settings.check else None
    for shape in shapes:
        sets: list[InputSet] = []
        measured: list[tuple[Backend, Row, Callable[[], object] | None]] = []
        for backend in backends:
            reason = backend.supports(shape, settings.pass_)
            if reason:
                measured.append((backend, Row(backend.name, shape, settings.pass_, "unsupported", reason), None))
                continue
            sets = sets or make_rotation(shape, with_grad=settings.pass_ != "fwd")
            measured.append((backend, *measure(backend, shape, sets, settings, checker)))
        ran = bool(sets)
        yield from more_rounds(measured, settings)
        del sets, measured
        if ran:  # (its inputs, outputs and timed steps freed before the next shape's; a shape no backend ran made none)
            gc.collect()
            torch.cuda.empty_cache()


def measure(
    backend: Backend, shape: Shape, sets: list[InputSet], settings: Settings, checker: Checker | None
) -> tuple[Row, Callable[[], object] | None]:
    """Build (compile), first call (timed on the host), check if the group's check is pending, then time. Returns the
    row and the timed step (None if the backend failed)."""

    def timed() -> tuple[Row, Callable[[], object]]:
        fn = backend.build(shape)
        first_ms, got = wall_ms(lambda: run_pass(fn, sets[0], settings.pass_))
        errors = None
        if checker and checker.pending(backend.name, shape):
            errors = checker.check(backend.name, shape, sets[0], got)
        del got
        step = make_step(fn, sets, settings.pass_)
        ms = gpu_time_ms(step, settings.warmup_ms, settings.rep_ms)
        wrong = checker.wrong(backend.name, shape) if checker else ""
        status = "wrong" if wrong else "ok"
        return Row(backend.name, shape, settings.pass_, status, wrong, ms, first_ms, errors), step

    result, failure = attempt(backend, timed)
    return result if failure is None else (Row(backend.name, shape, settings.pass_, *failure), None)


def round_order(items: list, round_idx: int) -> list:
    """The order of round ``round_idx`` (from 0) of timings taken in turn: row ``round_idx`` of a balanced Latin
    square (Williams' design: 0, 1, n-1, 2, n-2, ... shifted by the round), so that over n rounds (2n for an odd
    count n, the second n reversed) every item is timed right after every other one equally often.

    At the H200's 700 W cap a reading depends on what ran just before it: with the order as given and reversed in
    turn, an item's predecessor in the forward rounds never changed, and a sweep's candidate timed after
    flash-attn-4 read 1.3 % below another that one process alternating only the two found 1 % faster
    (docs/benchmarking.md, Rounds in a balanced order).
    """
    n = len(items)
    first = [0]
    for j in range(1, n):  # 0, 1, n-1, 2, n-2, ...
        first.append((j + 1) // 2 if j % 2 else n - j // 2)
    row = [items[(i + round_idx) % n] for i in first]
    return row[::-1] if n % 2 and (round_idx // n) % 2 else row


def more_rounds(measured: list[tuple[Backend, Row, Callable[[], object] | None]], settings: Settings) -> list[Row]:
    """settings.rounds - 1 more timings of every timed step, backend after backend in round_order's order of rounds
    1, 2, ...; each row's time becomes the median of its rounds (rounds_ms: each of them). A backend that fails in a
    later round keeps the rounds it finished."""
    times = {row.backend: [row.ms] for _, row, step in measured if step is not None}
    for round_idx in range(1, settings.rounds):
        for backend, row, step in round_order(measured, round_idx):
            if step is not None:
                ms, failure = attempt(backend, partial(gpu_time_ms, step, settings.warmup_ms, settings.rep_ms))
                if failure is None:
                    times[row.backend].append(ms)
    return [
        dataclasses.replace(row, ms=statistics.median(times[row.backend]), rounds_ms=tuple(times[row.backend]))
        if step is not None
        else row
        for _, row, step in measured
    ]


def attempt(backend: Backend, call: Callable[[], T]) -> tuple[T | None, tuple[str, str] | None]:
    """call() inside the backend's context: (its result, None), or (None, (status, reason)) if it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with backend.context():
                return call(), None
        except Exception as exc:  # every failure becomes the row's reason; the sweep goes on
            return None, classify(exc, [str(w.message) for w in caught])


def classify(exc: Exception, warning_messages: list[str]) -> tuple[str, str]:
    """("unsupported" or "failed", a one-line reason). SDPA explains why a forced backend refused in warnings."""
    if isinstance(exc, NoBackward):
        return "unsupported", _clip(str(exc))
    reason = f"{type(exc).__name__}: {_first_line(exc)}"
    if any(refusal in str(exc) for refusal in SDPA_REFUSALS):
        why = "; ".join(dict.fromkeys(_first_line(message) for message in warning_messages))
        return "unsupported", _clip(f"{reason} ({why})" if why else reason)
    return ("unsupported" if isinstance(exc, UNSUPPORTED) else "failed"), _clip(reason)


def _first_line(text: object) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


def _clip(text: str) -> str:
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"
