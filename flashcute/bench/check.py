"""Correctness before timing: a backend's output against the float64 specification, within design.md's budget.

A backend passes when its error (max abs and relative L2) is at most twice the error of the same attention
computed by plain PyTorch ops in the input precision, plus a small atol. To keep the float64 reference cheap on
big shapes the backend runs on the real shape and only a sample of it is compared: the first and last batch
element, the first and last head (batch and heads are independent, so the sample is a problem of its own). Of a
packed batch the sample is its first and last sequences, packed the same way, and the first and last head. With
fewer K/V heads than query heads the first and last of each still pair up (query head h reads K/V head
h // (nheads // nheads_k)). A paged cache is gathered into a contiguous one through its block table first. A
shape's score variants hold for the reference too: its softcap, and the sink logits and ALiBi slopes the backends
were given (backends.score_tensors) at the sampled heads, and v of its own head dim (the reference's out, dout and
dv are v's width).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from flashcute.bench.backends import score_tensors
from flashcute.bench.grid import Shape
from flashcute.bench.inputs import InputSet, block_table

ATOL = {"max_abs": 1e-3, "rel_l2": 1e-4}
"""Slack on top of twice the baseline's error, so that a baseline that happens to be nearly exact on a small
sample does not shrink the budget to nothing."""


def sample(t: torch.Tensor, lengths: tuple[int, ...] = ()) -> torch.Tensor:
    """(batch, seqlen, nheads, headdim) -> the first and last batch element and head; a packed (tokens, nheads,
    headdim) of sequences ``lengths`` -> the rows of its first and last sequences (`sampled_lengths`) and heads."""
    heads = sampled_heads(t.shape[-2])
    if lengths:
        ends = [t[: lengths[0]], t[len(t) - lengths[-1] :]] if len(lengths) > 1 else [t]
        return torch.cat(ends)[:, heads]
    batches = sorted({0, t.shape[0] - 1})
    return t[batches][:, :, heads]


def sampled_heads(nheads: int) -> list[int]:
    """The heads `sample` keeps: the first and last."""
    return sorted({0, nheads - 1})


def sampled_lengths(lengths: tuple[int, ...]) -> tuple[int, ...]:
    """The sequences `sample` keeps of a packed batch: its first and last."""
    return (lengths[0], lengths[-1]) if len(lengths) > 1 else lengths


def errors(got: torch.Tensor, expected: torch.Tensor) -> dict[str, float]:
    diff = got.double() - expected
    return {"max_abs": diff.abs().max().item(), "rel_l2": (diff.norm() / expected.norm()).item()}


@dataclass(frozen=True)
class Reference:
    """Float64 outputs on the sample, and for each tensor and metric the error a backend may have."""

    expected: dict[str, torch.Tensor]
    budget: dict[str, dict[str, float]]
    lengths: tuple[int, ...] = ()
    """The packed batch's sequence lengths, to sample a backend's tensors as the inputs were; empty when dense."""


def _outputs(
    attention, qkv: list[torch.Tensor], dout: torch.Tensor | None, shape: Shape, scores: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """out, and dq, dk, dv when dout is given, of attention(q, k, v) with the shape's causal and softcap and the
    ``scores`` keywords (learnable_sink, alibi_slopes)."""
    leaves = [t.detach().requires_grad_(dout is not None) for t in qkv]
    out = attention(*leaves, causal=shape.causal, softcap=shape.softcap, **scores)
    if dout is None:
        return {"out": out.detach()}
    dq, dk, dv = torch.autograd.grad(out, leaves, dout)
    return {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv}


def _per_sequence(attention: Callable[..., torch.Tensor], lengths: tuple[int, ...]) -> Callable[..., torch.Tensor]:
    """``attention`` over a packed (tokens, nheads, headdim) batch of sequences ``lengths``, one at a time."""

    def packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options) -> torch.Tensor:
        parts = zip(*(t.split(lengths) for t in (q, k, v)), strict=True)
        return torch.cat([attention(qs[None], ks[None], vs[None], **options)[0] for qs, ks, vs in parts])

    return packed


def contiguous_cache(t: torch.Tensor, shape: Shape) -> torch.Tensor:
    """A paged shape's cache (num_pages, page_size, nheads_k, headdim) as (batch, seqlen, nheads_k, headdim), its
    pages gathered through the block table; any other shape's k or v as it is."""
    if not shape.paged:
        return t
    return t[block_table(shape, device=t.device)].flatten(1, 2)


def make_reference(inputs: InputSet, shape: Shape) -> Reference:
    from flashcute.reference import attention_ref, attention_same_precision

    exact, same_precision = attention_ref, attention_same_precision
    if shape.packed:
        lengths = sampled_lengths(shape.lengths)
        exact, same_precision = _per_sequence(exact, lengths), _per_sequence(same_precision, lengths)
    k, v = (contiguous_cache(t, shape) for t in (inputs.k, inputs.v))
    qkv = [sample(t, shape.lengths) for t in (inputs.q, k, v)]
    dout = None if inputs.dout is None else sample(inputs.dout, shape.lengths)
    heads = sampled_heads(inputs.q.shape[-2])
    scores = {name: t[heads] for name, t in score_tensors(shape, inputs.q.device).items()}
    expected = _outputs(exact, [t.double() for t in qkv], None if dout is None else dout.double(), shape, scores)
    baseline = _outputs(same_precision, qkv, dout, shape, scores)
    budget = {
        name: {metric: 2 * err + ATOL[metric] for metric, err in errors(baseline[name], expected[name]).items()}
        for name in expected
    }
    return Reference(expected, budget, shape.lengths)


def judge(got: dict[str, torch.Tensor], reference: Reference) -> tuple[dict[str, dict[str, float]], str]:
    """Each tensor's errors (with their budgets), and "" when all are within budget, else which are not.

    NaN errors fail: the comparison is written so that NaN is never within budget.
    """
    report, failures = {}, []
    for name, expected in reference.expected.items():
        err = errors(sample(got[name], reference.lengths), expected)
        budget = reference.budget[name]
        report[name] = {**err, **{f"{metric}_budget": value for metric, value in budget.items()}}
        failures += [f"{name} {m} {err[m]:.3g} > {budget[m]:.3g}" for m in err if not err[m] <= budget[m]]
    return report, "; ".join(failures)


def _verdict_key(backend: str, shape: Shape) -> tuple[object, ...]:
    """What one check answers for: a backend on a group's dense shapes, or on its packed ones (another entry point
    and other kernels), or on one decode shape (each takes its own path: query rows, mask, pages; and its reference
    is cheap, with a few query rows)."""
    return (backend, shape) if shape.decode else (backend, shape.group, shape.packed)


class Checker:
    """Checks each backend once per group (dtype, headdim, causal, variants) and layout (dense or packed), on
    the first such shape where the backend runs, the verdict then holding for the group's shapes of that layout; and
    on every decode shape."""

    def __init__(self) -> None:
        self._verdicts: dict[tuple[object, ...], str] = {}
        self._reference: tuple[Shape, Reference] | None = None

    def pending(self, backend: str, shape: Shape) -> bool:
        return _verdict_key(backend, shape) not in self._verdicts

    def check(
        self, backend: str, shape: Shape, inputs: InputSet, got: dict[str, torch.Tensor]
    ) -> dict[str, dict[str, float]]:
        report, failure = judge(got, self._reference_for(shape, inputs))
        self._verdicts[_verdict_key(backend, shape)] = failure and f"wrong (checked at {shape.size_label}): {failure}"
        return report

    def wrong(self, backend: str, shape: Shape) -> str:
        """Why the backend is wrong on this shape's group and layout, or "" if it is not known to be."""
        return self._verdicts.get(_verdict_key(backend, shape), "")

    def _reference_for(self, shape: Shape, inputs: InputSet) -> Reference:
        """The reference for the shape's inputs (the sweep makes one input rotation per shape)."""
        if self._reference is None or self._reference[0] != shape:
            self._reference = (shape, make_reference(inputs, shape))
        return self._reference[1]
