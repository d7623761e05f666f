"""What a sweep produces: one row per (backend, shape), the metadata, and their JSON form."""

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from flashcute.bench.grid import Group, Shape

STATUSES = ("ok", "wrong", "unsupported", "failed")
"""ok: timed and correct (or unchecked); wrong: timed but failed the check, left out of ratios;
unsupported: the backend cannot do this shape or pass; failed: it raised."""
DENSE_ENTRY_SUFFIX = "-func"
"""flashcute-<kernel>-func: a flashcute kernel through flash_attn_func where flashcute-<kernel> times another entry
point (flash_attn_with_kvcache on decode shapes). Tables compare flashcute-<kernel> against it, as against any
other backend."""
DETERMINISTIC_SUFFIX = "-deterministic"
"""flashcute-<kernel>-deterministic: a flashcute kernel with deterministic=True (the backward's dQ in a fixed order),
swept only where named (--backends). Tables compare flashcute-<kernel> against it, as against any other backend."""


@dataclass(frozen=True)
class Row:
    backend: str
    shape: Shape
    pass_: str
    status: str
    reason: str = ""
    ms: float | None = None
    first_call_ms: float | None = None
    errors: dict[str, dict[str, float]] | None = None
    """Errors against the float64 reference, on the row where the backend was checked."""
    rounds_ms: tuple[float, ...] | None = None
    """Each round's milliseconds, as the sweep timed them (ms is their median)."""

    @property
    def tflops(self) -> float | None:
        return None if self.ms is None else self.shape.flops(self.pass_) / (self.ms * 1e9)

    @property
    def tbps(self) -> float | None:
        """TB/s of K and V read: the figure of a decode step, which is bound by reading the cache; None for other
        shapes, whose reads are not what bounds them."""
        return None if self.ms is None or not self.shape.decode else self.shape.kv_bytes / (self.ms * 1e9)

    @property
    def figure(self) -> float | None:
        """What tables and plots show: TB/s for a decode shape, TFLOP/s otherwise (`unit`)."""
        return self.tbps if self.shape.decode else self.tflops

    @property
    def unit(self) -> str:
        return "TB/s" if self.shape.decode else "TFLOP/s"

    @property
    def spread(self) -> float | None:
        """(slowest - fastest) / median over the rounds, None with fewer than two: how far one reading can be
        trusted."""
        if not self.rounds_ms or len(self.rounds_ms) < 2:
            return None
        return (max(self.rounds_ms) - min(self.rounds_ms)) / statistics.median(self.rounds_ms)

    @property
    def key(self) -> tuple[str, str, Shape]:
        """Rows of two runs with the same key measure the same thing."""
        return (self.backend, self.pass_, self.shape)

    def to_dict(self) -> dict:
        fields = asdict(self)
        del fields["shape"], fields["pass_"]
        shape = asdict(self.shape)
        if shape["headdim_v"] is None:  # recorded only where v's head dim differs from q's
            del shape["headdim_v"]
        figures = {"tflops": self.tflops, "tbps": self.tbps}
        return {"backend": self.backend, "pass": self.pass_, **shape, **fields, **figures}

    @classmethod
    def from_dict(cls, data: dict) -> "Row":
        # rows saved before packed batches (decode shapes, sinks and ALiBi) were timed have no lengths (seqlen_q,
        # nheads_k, page_size; sink, alibi), whose defaults stand for them, as for headdim_v, saved only where v's
        # head dim differs; JSON gives lengths back as a list
        shape_fields = {name: data[name] for name in Shape.__dataclass_fields__ if name in data}
        shape = Shape(**{**shape_fields, "lengths": tuple(data.get("lengths", ()))})
        names = set(cls.__dataclass_fields__) - {"shape", "pass_", "rounds_ms"}
        rounds = tuple(data["rounds_ms"]) if data.get("rounds_ms") is not None else None  # (a list in JSON)
        row_fields = {name: data[name] for name in names if name in data}
        return cls(shape=shape, pass_=data["pass"], rounds_ms=rounds, **row_fields)


@dataclass
class Results:
    meta: dict = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    host_overhead_us: dict[str, dict[str, float | str]] = field(default_factory=dict)
    """Per backend and kind of call (bench.host.CALL_KINDS): host microseconds a call on a tiny problem, or why it
    could not be measured."""
    first_call_s: dict[str, dict[str, float | str]] = field(default_factory=dict)
    """Per backend, "<cache state> <call>" (bench.host.first_calls): seconds in a fresh process, or why not."""
    decode_graph: dict = field(default_factory=dict)
    """A --decode run's decode step in a CUDA graph (bench.graphs.decode_graph): {"shape": the shape's label, "us":
    {backend: {kind: microseconds a replay, or why not}}} for the kinds bench.graphs.GRAPH_KINDS; empty otherwise."""

    def to_dict(self) -> dict:
        rows = [row.to_dict() for row in self.rows]
        host = {"host_overhead_us": self.host_overhead_us, "first_call_s": self.first_call_s}
        return {"meta": self.meta, **host, "decode_graph": self.decode_graph, "rows": rows}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def save(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: Path) -> "Results":
        data = json.loads(Path(path).read_text())
        # runs saved before the kinds of call were told apart have one figure a backend, for the run's pass
        host = {
            backend: value if isinstance(value, dict) else {data["meta"].get("pass", "fwd"): value}
            for backend, value in data.get("host_overhead_us", {}).items()
        }
        rows = [Row.from_dict(row) for row in data["rows"]]
        return cls(data["meta"], rows, host, data.get("first_call_s", {}), data.get("decode_graph", {}))


def by_group(rows: list[Row]) -> dict[Group, list[Row]]:
    """Rows by Shape.group, (dtype, headdim, causal, variants) with causal None for decode, in the order of the
    sweep."""
    groups: dict[Group, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.shape.group, []).append(row)
    return groups


def flashcute_kernel(backend: str) -> str | None:
    """The kernel of a flashcute-<kernel> backend; None for any other backend, flashcute-<kernel>-func and
    flashcute-<kernel>-deterministic among them."""
    if not backend.startswith("flashcute-") or backend.endswith((DENSE_ENTRY_SUFFIX, DETERMINISTIC_SUFFIX)):
        return None
    return backend.removeprefix("flashcute-")


def backend_names(rows: list[Row]) -> list[str]:
    """Backends in the order the sweep ran them."""
    return list(dict.fromkeys(row.backend for row in rows))
