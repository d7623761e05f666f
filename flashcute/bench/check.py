"""Correctness before timing: a backend's output against the float64 specification, within design.md's budget.

A backend passes when its error (max abs and relative L2) is at most twice the error of the same attention
computed by plain PyTorch ops in the input precision, plus a small atol. To keep the float64 reference cheap on
big shapes the backend runs on the real shape and only a sample of it is compared: the first and last batch
element, the first and last head (batch and heads are independent, so the sample is a problem of its own).
"""

from dataclasses import dataclass

import torch

from flashcute.bench.grid import Shape
from flashcute.bench.inputs import InputSet

ATOL = {"max_abs": 1e-3, "rel_l2": 1e-4}
"""Slack on top of twice the baseline's error, so that a baseline that happens to be nearly exact on a small
sample does not shrink the budget to nothing."""


def sample(t: torch.Tensor) -> torch.Tensor:
    """(batch, seqlen, nheads, headdim) -> the first and last batch element and head."""
    batches = sorted({0, t.shape[0] - 1})
    heads = sorted({0, t.shape[2] - 1})
    return t[batches][:, :, heads]


def errors(got: torch.Tensor, expected: torch.Tensor) -> dict[str, float]:
    diff = got.double() - expected
    return {"max_abs": diff.abs().max().item(), "rel_l2": (diff.norm() / expected.norm()).item()}


@dataclass(frozen=True)
class Reference:
    """Float64 outputs on the sample, and for each tensor and metric the error a backend may have."""

    expected: dict[str, torch.Tensor]
    budget: dict[str, dict[str, float]]


def _outputs(attention, qkv: list[torch.Tensor], dout: torch.Tensor | None, causal: bool) -> dict[str, torch.Tensor]:
    """out, and dq, dk, dv when dout is given, of attention(q, k, v, causal=causal)."""
    leaves = [t.detach().requires_grad_(dout is not None) for t in qkv]
    out = attention(*leaves, causal=causal)
    if dout is None:
        return {"out": out.detach()}
    dq, dk, dv = torch.autograd.grad(out, leaves, dout)
    return {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv}


def make_reference(inputs: InputSet, causal: bool) -> Reference:
    from flashcute.reference import attention_ref, attention_same_precision

    qkv = [sample(t) for t in (inputs.q, inputs.k, inputs.v)]
    dout = None if inputs.dout is None else sample(inputs.dout)
    expected = _outputs(attention_ref, [t.double() for t in qkv], None if dout is None else dout.double(), causal)
    baseline = _outputs(attention_same_precision, qkv, dout, causal)
    budget = {
        name: {metric: 2 * err + ATOL[metric] for metric, err in errors(baseline[name], expected[name]).items()}
        for name in expected
    }
    return Reference(expected, budget)


def judge(got: dict[str, torch.Tensor], reference: Reference) -> tuple[dict[str, dict[str, float]], str]:
    """Each tensor's errors (with their budgets), and "" when all are within budget, else which are not.

    NaN errors fail: the comparison is written so that NaN is never within budget.
    """
    report, failures = {}, []
    for name, expected in reference.expected.items():
        err = errors(sample(got[name]), expected)
        budget = reference.budget[name]
        report[name] = {**err, **{f"{metric}_budget": value for metric, value in budget.items()}}
        failures += [f"{name} {m} {err[m]:.3g} > {budget[m]:.3g}" for m in err if not err[m] <= budget[m]]
    return report, "; ".join(failures)


class Checker:
    """Checks each backend once per (dtype, headdim, causal) group, on the group's first shape where the backend
    runs; the verdict then holds for the whole group."""

    def __init__(self) -> None:
        self._verdicts: dict[tuple[str, tuple], str] = {}
        self._reference: tuple[Shape, Reference] | None = None

    def pending(self, backend: str, shape: Shape) -> bool:
        return (backend, shape.group) not in self._verdicts

    def check(
        self, backend: str, shape: Shape, inputs: InputSet, got: dict[str, torch.Tensor]
    ) -> dict[str, dict[str, float]]:
        report, failure = judge(got, self._reference_for(shape, inputs))
        self._verdicts[(backend, shape.group)] = failure and f"wrong (checked at L={shape.seqlen}): {failure}"
        return report

    def wrong(self, backend: str, shape: Shape) -> str:
        """Why the backend is wrong on this shape's group, or "" if it is not known to be."""
        return self._verdicts.get((backend, shape.group), "")

    def _reference_for(self, shape: Shape, inputs: InputSet) -> Reference:
        """The reference for the shape's inputs (the sweep makes one input rotation per shape)."""
        if self._reference is None or self._reference[0] != shape:
            self._reference = (shape, make_reference(inputs, shape.causal))
        return self._reference[1]
