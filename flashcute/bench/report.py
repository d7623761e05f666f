"""Tables for people: TFLOP/s per backend (TB/s for decode shapes) with ratios of each flashcute kernel against
every other backend, per-backend overheads, a decode step in a CUDA graph, and the change against a saved run. All
markdown, readable in a terminal too."""

import math
import statistics
from collections.abc import Iterable

from flashcute.bench.grid import Shape, group_label, seqlen_label
from flashcute.bench.results import Results, Row, backend_names, by_group, flashcute_kernel

CELL = {"unsupported": "n/a", "failed": "error"}
PACKED_NOTE = (
    "L=packed a..b: one variable-length call over B sequences of a to b tokens, packed without padding; its FLOPs "
    "are summed over the sequences, so its TFLOP/s compares with the dense rows."
)
DECODE_NOTE = (
    "Decode tables: Lq new query rows per sequence attend to a cache of Lk keys (H = query heads / K/V heads; page: "
    "a paged cache's page size, blank for a contiguous one). Such a step is bound by reading the cache, so its "
    "figure is TB/s: the bytes of K and V (B · Lk · H_kv · D · element size · 2) over the time."
)
GRAPH_STEP_TARGET = 1.1
"""The most a decode step in a CUDA graph should cost over its attention alone (bench.graphs)."""


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    """Columns padded to equal width, so the markdown also reads as a plain-text table."""
    widths = [max(len(cells[i]) for cells in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(header), line(["-" * width for width in widths]), *map(line, body)])


def ratio_pairs(backends: list[str]) -> list[tuple[str, str]]:
    """(flashcute kernel, other backend) for each flashcute kernel against every other backend."""
    ours = [name for name in backends if flashcute_kernel(name)]
    return [(mine, other) for mine in ours for other in backends if other != mine]


def speedup(mine: Row | None, other: Row | None) -> float | None:
    """mine's TFLOP/s over other's (the same ratio as their TB/s); None unless both ran and passed the check."""
    if mine is None or other is None or mine.status != "ok" or other.status != "ok":
        return None
    return mine.tflops / other.tflops


def geomean(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return math.exp(statistics.fmean(map(math.log, present))) if present else None


def _cell(row: Row | None) -> str:
    if row is None:
        return ""
    if row.status in CELL:
        return CELL[row.status]
    return _figure(row) + (" ✗" if row.status == "wrong" else "")


def _figure(row: Row) -> str:
    """A timed row's figure: TFLOP/s to 0.1, TB/s (decode) to 0.01."""
    return f"{row.figure:.{2 if row.shape.decode else 1}f}"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _short(backend: str) -> str:
    return backend.removeprefix("flashcute-")


SIZE_COLUMNS = ["L", "B", "H"]
DECODE_SIZE_COLUMNS = ["Lq", "Lk", "B", "H", "page", "causal"]


def size_cells(shape: Shape) -> list[str]:
    """The cells that name a shape in its group's table, under SIZE_COLUMNS or for a decode shape
    DECODE_SIZE_COLUMNS."""
    if shape.decode:
        heads = f"{shape.nheads}/{shape.kv_heads}"
        page = str(shape.page_size) if shape.paged else ""
        return [str(shape.q_seqlen), seqlen_label(shape.seqlen), str(shape.batch), heads, page, _yes(shape.causal)]
    return [shape.length_label, str(shape.batch), str(shape.nheads)]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def group_table(rows: list[Row], backends: list[str], compared: list[str]) -> str:
    """One group's TFLOP/s (TB/s for decode shapes), a row per shape, then ratio columns among the `compared`
    backends and their geometric mean."""
    pairs = ratio_pairs(compared)
    cells = {(row.shape, row.backend): row for row in rows}
    shapes = list(dict.fromkeys(row.shape for row in rows))
    sizes = DECODE_SIZE_COLUMNS if shapes[0].decode else SIZE_COLUMNS
    header = [*sizes, *backends, *(f"{_short(mine)}/{other}" for mine, other in pairs)]
    ratios = [
        [speedup(cells.get((shape, mine)), cells.get((shape, other))) for mine, other in pairs] for shape in shapes
    ]
    body = [
        [
            *size_cells(shape),
            *(_cell(cells.get((shape, backend))) for backend in backends),
            *map(_ratio, shape_ratios),
        ]
        for shape, shape_ratios in zip(shapes, ratios, strict=True)
    ]
    if pairs:
        means = [geomean(column) for column in zip(*ratios, strict=True)]
        body.append(["geomean", *([""] * (len(sizes) - 1 + len(backends))), *map(_ratio, means)])
    return markdown_table(header, body)


def group_notes(rows: list[Row]) -> list[str]:
    """Why cells are n/a, error or ✗: one line per (backend, reason) with the lengths (decode: shapes) it applies
    to."""
    shapes: dict[tuple[str, str, str], list[Shape]] = {}
    for row in rows:
        if row.reason:
            shapes.setdefault((row.backend, row.status, row.reason), []).append(row.shape)
    return [f"- {backend} {status} ({_where(where)}): {reason}" for (backend, status, reason), where in shapes.items()]


def _where(shapes: list[Shape]) -> str:
    """Where a note applies: "L=1k, 2k"; for decode shapes "Lq=1 Lk=4k B=8 H=32/8; Lq=4 Lk=32k B=8 H=32/8 causal"."""
    if shapes[0].decode:
        return "; ".join(shape.size_label for shape in shapes)
    return "L=" + ", ".join(shape.length_label for shape in shapes)


def _seconds_or_reason(value: float | str | None, digits: int) -> str:
    return f"{value:.{digits}f}" if isinstance(value, float) else "n/a" if value is None else "✗"


def backend_table(results: Results, backends: list[str]) -> str:
    """Host microseconds a call on a tiny problem, per kind of call, and the sweep's first calls (compiles)."""
    kinds = list(dict.fromkeys(kind for value in results.host_overhead_us.values() for kind in value))
    body = []
    for backend in backends:
        firsts = [row.first_call_ms for row in results.rows if row.backend == backend and row.first_call_ms]
        overhead = results.host_overhead_us.get(backend, {})
        body.append(
            [
                backend,
                *(_seconds_or_reason(overhead.get(kind), 1) for kind in kinds),
                f"{statistics.median(firsts):.0f}" if firsts else "",
                f"{max(firsts):.0f}" if firsts else "",
            ]
        )
    header = ["backend", *(f"host µs/call: {kind}" for kind in kinds), "first call ms (median)", "(max)"]
    table = markdown_table(header, body)
    reasons = sorted(
        {f"- {backend} {kind}: {value}" for backend in backends for kind, value in _items(results, backend)}
    )
    return "\n".join([table, *reasons])


def _items(results: Results, backend: str):
    """(what, reason) for every host figure of ``backend`` that could not be measured."""
    for source in (results.host_overhead_us, results.first_call_s):
        yield from ((kind, v) for kind, v in source.get(backend, {}).items() if isinstance(v, str))


def first_call_table(results: Results, backends: list[str]) -> str:
    """Seconds of the import, first forward and first forward+backward in a fresh process, per cache state."""
    columns = list(dict.fromkeys(column for value in results.first_call_s.values() for column in value))
    body = [
        [backend, *(_seconds_or_reason(results.first_call_s[backend].get(c), 2) for c in columns)]
        for backend in backends
        if backend in results.first_call_s
    ]
    return markdown_table(["backend", *(f"{column} s" for column in columns)], body)


def _pairs(values: dict) -> str:
    return ", ".join(f"{name} {value}" for name, value in values.items() if value is not None)


def header_lines(meta: dict) -> list[str]:
    gpu = meta.get("gpu", {})
    lines = [f"# flashcute bench: {meta.get('pass', '')} on {gpu.get('name', 'unknown GPU')}", ""]
    details = [
        ("gpu", _pairs({key: value for key, value in gpu.items() if key not in ("name", "clocks")})),
        ("clocks (MHz, W)", _pairs(gpu.get("clocks") or {})),
        ("versions", _pairs(meta.get("versions", {}))),
        ("commit", meta.get("git")),
        ("date", meta.get("date")),
        ("command", meta.get("command")),
    ]
    lines += [f"- {name}: {value}" for name, value in details if value]
    return lines + [f"- skipped {name}: {why}" for name, why in meta.get("skipped_backends", {}).items()]


def graph_table(decode_graph: dict) -> str:
    """Results.decode_graph: microseconds a replay of each graph per backend, step / attention, and why a figure
    is missing."""
    body, reasons = [], []
    for backend, us in decode_graph["us"].items():
        step, attention = us.get("step"), us.get("attention")
        ratio = step / attention if isinstance(step, float) and isinstance(attention, float) else None
        body.append([backend, _seconds_or_reason(step, 1), _seconds_or_reason(attention, 1), _ratio(ratio)])
        reasons += [f"- {backend} {kind}: {value}" for kind, value in us.items() if isinstance(value, str)]
    header = ["backend", "step µs", "attention µs", "step / attention"]
    return "\n".join([markdown_table(header, body), *dict.fromkeys(reasons)])


def graph_intro(decode_graph: dict) -> str:
    return (
        f"One replay of a CUDA graph holding flash_attn_with_kvcache at {decode_graph['shape']}. step: the call "
        "that appends one new key and value per sequence to the cache, then attends; attention: the same call "
        f"without new keys, over as many keys. Target: step / attention <= {GRAPH_STEP_TARGET}."
    )


def render(results: Results) -> str:
    """The whole report: header, a TFLOP/s (decode: TB/s) table per group with notes, per-backend costs, and a
    decode run's graph figures."""
    backends = backend_names(results.rows)
    compared = backend_names([row for row in results.rows if row.status == "ok"])
    parts = header_lines(results.meta)
    units = " and ".join(dict.fromkeys(row.unit for row in results.rows)) or "TFLOP/s"
    parts += ["", f"{units}; ratios are flashcute's speedup (>1 is faster); ✗ = failed the correctness check."]
    if any(row.shape.packed for row in results.rows):
        parts.append(PACKED_NOTE)
    if any(row.shape.decode for row in results.rows):
        parts.append(DECODE_NOTE)
    for group, rows in by_group(results.rows).items():
        parts += ["", f"## {group_label(group)}", "", group_table(rows, backends, compared), *group_notes(rows)]
    parts += ["", "## Per backend", "", backend_table(results, backends)]
    if results.first_call_s:
        parts += ["", "## First calls in a fresh process", "", first_call_table(results, backends)]
    if results.decode_graph:
        graphs = graph_table(results.decode_graph)
        parts += ["", "## Decode step in a CUDA graph", "", graph_intro(results.decode_graph), "", graphs]
    return "\n".join(parts) + "\n"


def compare(old: Results, new: Results) -> str:
    """Each row timed in both runs: old and new TFLOP/s (decode: TB/s) and the change; then the geometric mean per
    backend."""
    before = {row.key: row for row in old.rows if row.figure is not None}
    pairs = [(before[row.key], row) for row in new.rows if row.figure is not None and row.key in before]
    body = [
        [row.backend, row.shape.label(), _figure(was), _figure(row), _change(row.figure / was.figure)]
        for was, row in pairs
    ]
    units = " or ".join(dict.fromkeys(row.unit for _, row in pairs)) or "TFLOP/s"
    run = f"{old.meta.get('date', 'the old run')} on {old.meta.get('gpu', {}).get('name', 'an unknown GPU')}"
    parts = [f"## Change against {run} ({len(pairs)} rows in both runs)", ""]
    parts.append(markdown_table(["backend", "shape", f"old {units}", f"new {units}", "change"], body))
    summary = [
        [backend, _change(geomean(row.figure / was.figure for was, row in pairs if row.backend == backend))]
        for backend in backend_names([row for _, row in pairs])
    ]
    parts += ["", markdown_table(["backend", "geomean change"], summary)]
    return "\n".join(parts) + "\n"


def _change(ratio: float | None) -> str:
    return "" if ratio is None else f"{(ratio - 1) * 100:+.1f}%"
