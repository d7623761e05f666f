"""A decode step's cost inside a CUDA graph, as a serving loop that replays one graph per token pays it.

`flashcute bench --decode` times, for each flashcute kernel it sweeps, two graphs on one decode shape: "step", one
flash_attn_with_kvcache call that appends a new key and value per sequence to the cache in place and then attends
(the call a decoder makes every token), and "attention", the same call with no new keys, attending to the same
keys. step / attention is what the append costs over the attention; the aim is at most report.GRAPH_STEP_TARGET.
"""

import statistics
from collections.abc import Callable
from functools import partial

import torch

from flashcute.bench.backends import Backend
from flashcute.bench.grid import Shape
from flashcute.bench.inputs import make_inputs
from flashcute.bench.results import flashcute_kernel
from flashcute.bench.runner import Settings, attempt, round_order
from flashcute.bench.timing import gpu_time_ms

GRAPH_KINDS = ("step", "attention")
WARMUP_CALLS = 3


def graph_shape(shapes: list[Shape]) -> Shape | None:
    """The shape the graphs are timed on: the grid's first decode shape with one query row and a contiguous cache."""
    return next((s for s in shapes if s.decode and s.q_seqlen == 1 and not s.paged), None)


def captured(call: Callable[[], object]) -> Callable[[], None]:
    """A CUDA graph holding one call(), as its replay. The call runs first on a side stream, as PyTorch's CUDA
    graph notes prescribe: kernels compile and the allocator settles there, outside the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_CALLS):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


def decode_calls(kernel: str, shape: Shape) -> dict[str, Callable[[], object]]:
    """GRAPH_KINDS' calls of flash_attn_with_kvcache with ``kernel`` on one input set of ``shape``. The step appends
    at position seqlen - 1 (the cache's last slot, the same on every replay) and so attends to seqlen keys; the
    attention alone is told the cache holds seqlen. Both take cache_seqlens as a device tensor, as a graph needs."""
    import flashcute

    inputs = make_inputs(shape, with_grad=False)
    new_size = (shape.batch, 1, shape.kv_heads, shape.headdim)
    k_new, v_new = (torch.randn(new_size, dtype=shape.torch_dtype, device="cuda") for _ in range(2))
    filled = torch.full((shape.batch,), shape.seqlen - 1, dtype=torch.int32, device="cuda")
    full = filled + 1

    def call(**kwargs: torch.Tensor) -> Callable[[], object]:
        return lambda: flashcute.flash_attn_with_kvcache(
            inputs.q, inputs.k, inputs.v, **kwargs, causal=shape.causal, kernel=kernel
        )

    return {"step": call(k=k_new, v=v_new, cache_seqlens=filled), "attention": call(cache_seqlens=full)}


def graph_us(kernel: str, shape: Shape, settings: Settings) -> dict[str, float]:
    """Microseconds a replay of each GRAPH_KINDS graph: the median of settings.rounds timings, the two graphs
    timed in turn (runner.round_order), so that both see the same clocks."""
    replays = {kind: captured(call) for kind, call in decode_calls(kernel, shape).items()}
    times: dict[str, list[float]] = {kind: [] for kind in replays}
    for round_idx in range(settings.rounds):
        for kind in round_order(list(replays), round_idx):
            times[kind].append(gpu_time_ms(replays[kind], settings.warmup_ms, settings.rep_ms) * 1e3)
    return {kind: statistics.median(values) for kind, values in times.items()}


def decode_graph(backends: list[Backend], shapes: list[Shape], settings: Settings) -> dict:
    """Results.decode_graph: {"shape": the shape's label, "us": {backend: {kind: µs, or why not}}} for each
    flashcute-<kernel> among ``backends``; {} when the grid has no shape for it or no flashcute kernel is swept."""
    shape = graph_shape(shapes)
    ours = [backend for backend in backends if flashcute_kernel(backend.name)]
    if shape is None or not ours:
        return {}
    us = {backend.name: _backend_graph_us(backend, shape, settings) for backend in ours}
    return {"shape": shape.label(), "us": us}


def _backend_graph_us(backend: Backend, shape: Shape, settings: Settings) -> dict[str, float | str]:
    """graph_us for a flashcute-<kernel> backend, or for each kind why it could not be measured."""
    reason = backend.supports(shape, "fwd")
    if reason:
        return dict.fromkeys(GRAPH_KINDS, reason)
    us, failure = attempt(backend, partial(graph_us, flashcute_kernel(backend.name), shape, settings))
    return us if failure is None else dict.fromkeys(GRAPH_KINDS, failure[1])
