"""A PNG per (dtype, headdim, causal, variants): TFLOP/s against seqlen, a line per backend. A packed batch
has no one sequence length: a group that holds one gets a column per shape instead, a point per backend in each. So
does a group of decode shapes, in TB/s."""

from pathlib import Path

from flashcute.bench.grid import Shape, group_label, headdim_name, variant_names
from flashcute.bench.results import Results, Row, backend_names, by_group


def plot_group(rows: list[Row], title: str, colors: dict[str, str], path: Path) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed (Agg)

    shapes = list(dict.fromkeys(row.shape for row in rows))
    fig = Figure(figsize=(max(7.0, 1.1 * len(shapes)), 4.5), layout="constrained")  # room for a column's label
    ax = fig.add_subplot()
    by_shape = any(shape.packed or shape.decode for shape in shapes)
    x: dict[Shape, float] = {shape: i if by_shape else shape.seqlen for i, shape in enumerate(shapes)}
    for backend in backend_names(rows):
        timed = [row for row in rows if row.backend == backend and row.figure is not None]
        if not timed:
            continue
        wrong = any(row.status == "wrong" for row in timed)
        ax.plot(
            [x[row.shape] for row in timed],
            [row.figure for row in timed],
            color=colors[backend],
            marker="o",
            linestyle="none" if by_shape else ":" if wrong else "-",
            label=f"{backend} (wrong)" if wrong else backend,
        )
    if by_shape:
        ax.set_xlim(-0.5, len(shapes) - 0.5)
        ax.set_xticks(range(len(shapes)), [_tick(shape) for shape in shapes])
        ax.set_xlabel("decode step" if shapes[0].decode else "batch")
    else:
        ax.set_xscale("log", base=2)
        ax.set_xticks([x[shape] for shape in shapes], [shape.length_label for shape in shapes])
        ax.set_xlabel("sequence length")
    ax.set_ylabel(rows[0].unit)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.has_data():
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)


def _tick(shape: Shape) -> str:
    """A column's label: "L=packed 16..48\nB=3"; a decode shape's "Lq=1\nLk=32k\nB=8\npage 64", a field a line."""
    if not shape.decode:
        return f"L={shape.length_label}\nB={shape.batch}"
    lines = [*shape.length_label.split(" "), f"B={shape.batch}"]
    lines += [f"page {shape.page_size}"] if shape.paged else []
    return "\n".join(lines + (["causal"] if shape.causal else []))


def write_plots(results: Results, out_dir: Path) -> list[Path]:
    """One PNG per group in out_dir, named by pass, dtype, head dims, mask and score variants
    ("fwd_bf16_d192v128_causal_sink.png"); returns their paths."""
    gpu = results.meta.get("gpu", {}).get("name", "")
    colors = {backend: f"C{i % 10}" for i, backend in enumerate(backend_names(results.rows))}  # same in every plot
    paths = []
    for group, rows in by_group(results.rows).items():
        dtype, headdim, causal, (softcap, sink, alibi, headdim_v) = group
        pass_ = rows[0].pass_
        mask = "decode" if causal is None else "causal" if causal else "noncausal"
        variants = "".join(f"_{name.replace(' ', '')}" for name in variant_names((softcap, sink, alibi)))
        path = out_dir / f"{pass_}_{dtype}_{headdim_name(headdim, headdim_v)}_{mask}{variants}.png"
        plot_group(rows, f"{pass_} · {group_label(group)} · {gpu}".rstrip(" ·"), colors, path)
        paths.append(path)
    return paths
