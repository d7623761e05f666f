"""What one timed call does for each pass: forward, backward (after a forward outside the timing), or both."""

import itertools
from collections.abc import Callable
from functools import partial

import torch

from flashcute.bench.inputs import InputSet

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(q, k, v) -> out, all (batch, seqlen, nheads, headdim), or (tokens, nheads, headdim) for a packed shape (whose
sequence bounds the function holds), or for a decode shape q and its cache (whose block table the function holds),
as inputs.InputSet lays them out; out has q's shape."""


class NoBackward(Exception):
    """The backend's output cannot be differentiated (yet)."""


def backward(out: torch.Tensor, inputs: InputSet, retain_graph: bool = False) -> dict[str, torch.Tensor]:
    """dq, dk, dv for the output gradient inputs.dout."""
    if out.grad_fn is None:
        raise NoBackward("no backward: its output does not require grad")
    try:
        dq, dk, dv = torch.autograd.grad(out, (inputs.q, inputs.k, inputs.v), inputs.dout, retain_graph=retain_graph)
    except NotImplementedError as exc:
        raise NoBackward(f"no backward: {exc}") from exc
    except RuntimeError as exc:
        # A torch.library custom op with no registered autograd formula fails this way when differentiated.
        if "no autograd formula" not in str(exc):
            raise
        raise NoBackward(f"no backward: {exc}") from exc
    return {"dq": dq, "dk": dk, "dv": dv}


def run_pass(fn: AttentionFn, inputs: InputSet, pass_: str) -> dict[str, torch.Tensor]:
    """One whole pass (forward, and backward unless pass_ is "fwd"): the tensors the correctness check compares."""
    out = fn(inputs.q, inputs.k, inputs.v)
    if pass_ == "fwd":
        return {"out": out}
    return {"out": out, **backward(out, inputs)}


def make_step(fn: AttentionFn, sets: list[InputSet], pass_: str) -> Callable[[], object]:
    """A zero-argument call that runs the pass on the next input set in turn.

    For "bwd" the forward of every set runs here, once, and each step replays only the backward.
    """
    if pass_ == "bwd":
        calls = [partial(backward, fn(s.q, s.k, s.v), s, retain_graph=True) for s in sets]
    else:
        calls = [partial(run_pass, fn, s, pass_) for s in sets]
    order = itertools.cycle(calls)
    return lambda: next(order)()
