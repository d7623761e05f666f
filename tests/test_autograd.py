"""The torch boundary without a GPU: fake (meta) kernels, autograd registration, torch.compile tracing."""

from __future__ import annotations

import math
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from flashcute.interface import eager_when_traced, flash_attn_func
from flashcute.reference import attention_ref


@pytest.fixture
def fake_mode():
    return FakeTensorMode()


def fake_cuda(mode: FakeTensorMode, *shape: int, dtype=torch.bfloat16) -> torch.Tensor:
    """A fake CUDA tensor: shape, dtype and device only, on a machine that may have no GPU."""
    return FakeTensor(mode, torch.empty(*shape, dtype=dtype, device="meta"), torch.device("cuda:0"))


def test_fake_kernels_propagate_shapes(fake_mode):
    with fake_mode:
        q, k, v = (fake_cuda(fake_mode, 2, n, h, 64) for n, h in ((128, 8), (96, 2), (96, 2)))
        out, lse = torch.ops.flashcute.fwd(q, k, v, 0.125, -32, -1, 0, "auto", 0.0, None, None)
        assert (out.shape, out.dtype, out.device.type) == (q.shape, q.dtype, "cuda")
        assert (lse.shape, lse.dtype) == ((2, 8, 128), torch.float32)
        for deterministic in (False, True):
            scalars = (0.125, -32, -1, 0, deterministic, "auto", 0.0)
            grads = torch.ops.flashcute.bwd(out, q, k, v, out, lse, *scalars, None, None, None)
            dq, dk, dv, dsink = grads
            assert (dq.shape, dk.shape, dv.shape, dsink.shape) == (q.shape, k.shape, v.shape, (0,))
            assert (dq.dtype, dk.dtype) == (q.dtype, k.dtype)
        sink = fake_cuda(fake_mode, 8, dtype=torch.float32)
        scalars = (0.125, -32, -1, 0, False, "auto", 0.0)
        for grads in (
            torch.ops.flashcute.bwd(out, q, k, v, out, lse, *scalars, sink, None, None),
            torch.ops.flashcute.bwd(
                out, q, k, v, out, lse, *scalars, alibi_slopes=None, dlse=None, learnable_sink=sink
            ),
        ):
            assert (grads[3].shape, grads[3].dtype) == ((8,), torch.float32)


def test_ops_have_no_python_autograd_layer():
    """Autograd is the autograd.Functions' (interface.py): the ops themselves carry no Python autograd kernel, which
    would cost every traced call more host time."""
    for op in ("fwd", "bwd", "varlen_fwd", "varlen_bwd"):
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"flashcute::{op}", "Autograd"), op


def test_ops_take_every_argument_by_position():
    """No argument of an op has a default: inductor's generated code passes an argument that has one by keyword,
    and the dispatcher's keyword handling costs every call of a compiled graph host time."""
    for op in ("fwd", "bwd", "varlen_fwd", "varlen_bwd"):
        schema = getattr(torch.ops.flashcute, op).default._schema
        assert not [a.name for a in schema.arguments if a.has_default_value()], schema


def traced_graphs(fake_mode, model) -> tuple:
    """``model`` compiled with fullgraph=True and run on fake CUDA q, k, v: its result and the FX graphs dynamo
    handed the backend."""
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    with fake_mode:
        q, k, v = (fake_cuda(fake_mode, 2, n, 4, 64) for n in (128, 96, 96))
        result = torch.compile(model, fullgraph=True, backend=capture)(q, k, v)
    return result, graphs


def test_torch_compile_traces_one_graph(fake_mode):
    """fullgraph=True: validation, dispatch and the op trace without a graph break."""

    def model(q, k, v):
        return flash_attn_func(q, k, v, causal=True).float().square().mean()

    loss, graphs = traced_graphs(fake_mode, model)
    assert loss.shape == ()
    assert len(graphs) == 1
    ops = [node.target for node in graphs[0].graph.nodes if node.op == "call_function"]
    assert torch.ops.flashcute.fwd.default in ops


def test_a_loss_of_the_lse_traces_one_graph(fake_mode):
    """fullgraph=True with the returned LSE in the loss (differentiable LSE, set_materialize_grads(False))."""

    def model(q, k, v):
        out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
        return out.float().mean() + lse.mean()

    _, graphs = traced_graphs(fake_mode, model)
    assert len(graphs) == 1


def test_gradcheck_of_the_spec():
    """The spec's own gradient, which the backward kernel is held to, agrees with finite differences."""
    q, k, v = (torch.randn(1, 5, 2, 8, dtype=torch.float64, requires_grad=True) for _ in "qkv")
    assert torch.autograd.gradcheck(lambda *t: attention_ref(*t, causal=True, window_size=(3, -1)), (q, k, v))


def test_eager_calls_go_through_the_autograd_function(monkeypatch):
    """Outside torch.compile flash_attn_func takes the autograd.Function door (interface.EAGER_NOTE): one forward
    launch, then autograd's backward reaches one backward launch with the forward's scalars and its gradients
    reach q, k and v. CPU tensors and stand-in launches (the CUDA checks waved through), so it runs without a GPU."""
    from flashcute import interface

    calls = []

    def fake_fwd(q, k, v, out, lse, *scalars):
        calls.append(("fwd", scalars))
        out.copy_(q)
        lse.zero_()

    def forward_launcher(q, v, *call):
        calls.append(("lookup", call))
        return fake_fwd

    def fake_bwd(dout, q, k, v, out, lse, *scalars):
        calls.append(("bwd", scalars))
        return dout * 2, torch.ones_like(k), torch.zeros_like(v), torch.full_like(scalars[-3], 3)

    monkeypatch.setattr(interface, "validate_cuda_inputs", lambda q, k, v, args: (q, k, v))
    monkeypatch.setattr(interface, "_plans", {})  # plans made without the CUDA checks stay in this test
    monkeypatch.setattr(interface, "_forward_launcher", forward_launcher)
    monkeypatch.setattr(interface, "backward_grads", fake_bwd)
    monkeypatch.setattr(interface, "build_backward_ahead", lambda *call: calls.append(("ahead", call)))
    q, k, v = (torch.randn(2, n, 4, 64, dtype=torch.bfloat16, requires_grad=True) for n in (128, 96, 96))
    sink = torch.randn(4, requires_grad=True)
    out = flash_attn_func(q, k, v, causal=True, softmax_scale=0.5, softcap=3.0, learnable_sink=sink)
    assert type(out.grad_fn).__name__ == "FlashAttentionBackward"
    out.float().sum().backward()
    # the family's launch for the window, kernel and cap, launched with the scale, the diagonal and the cap; then
    # the backward with the forward's scalars; the sinks, the ALiBi slopes and the LSE's gradient (none here: no
    # loss used the LSE) behind the scalars
    fwd = (0.5, 96 - 128, -1, 0, "auto", 3.0)
    assert [name for name, _ in calls] == ["ahead", "lookup", "fwd", "bwd"]
    (_, ahead), (_, lookup), (_, launch), (_, bwd) = calls
    # the backward's kernels started building before the forward's (window, kernel, cap, no ALiBi, atomic dQ)
    assert ahead[0] is q and ahead[1] is v and ahead[2:] == (-1, 0, "auto", 3.0, None, False)
    assert lookup == (-1, 0, "auto", 3.0, sink, None)
    assert launch[:2] == (0.5, 96 - 128) and launch[3] == 3.0 and launch[4] is not None and launch[5] is None
    assert bwd[:-3] == (*fwd[:4], False, *fwd[4:]) and bwd[-3:] == (sink, None, None)
    assert torch.equal(q.grad, torch.full_like(q, 2)) and torch.equal(k.grad, torch.ones_like(k))
    assert torch.equal(v.grad, torch.zeros_like(v)) and torch.equal(sink.grad, torch.full_like(sink, 3))


def test_the_lse_gradient_reaches_the_backward(monkeypatch):
    """A loss of the returned LSE hands its gradient to the backward (as ``dlse``, D's share in
    prepost.preprocess), and a loss of the LSE alone hands zeros for dO; a loss of out alone hands no dlse."""
    from flashcute import interface

    received = []

    def fake_bwd(dout, q, k, v, out, lse, *scalars):
        received.append((dout, scalars[-1]))
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None

    stand_in_launches(monkeypatch)
    monkeypatch.setattr(interface, "backward_grads", fake_bwd)
    q, k, v = (torch.randn(1, 16, 2, 64, dtype=torch.bfloat16, requires_grad=True) for _ in "qkv")
    weight = torch.randn(1, 2, 16)
    out, lse = flash_attn_func(q, k, v, return_lse=True)
    assert lse.requires_grad
    ((out.float() * 2).sum() + (lse * weight).sum()).backward()
    out, lse = flash_attn_func(q, k, v, return_lse=True)
    (lse * weight).sum().backward()
    out, lse = flash_attn_func(q, k, v, return_lse=True)
    out.float().sum().backward()
    (dout, dlse), (dout_alone, dlse_alone), (_, no_dlse) = received
    assert torch.equal(dout, torch.full_like(dout, 2)) and torch.equal(dlse, weight)
    assert torch.equal(dout_alone, torch.zeros_like(dout_alone)) and torch.equal(dlse_alone, weight)
    assert no_dlse is None


def stand_in_launches(monkeypatch) -> list:
    """flash_attn_func on CPU tensors: the CUDA checks counted and waved through, launches that only fill the
    outputs, no backward built ahead, and an empty plan cache; returns the list that counts the checks."""
    from flashcute import interface

    checks = []

    def count_checks(q, k, v, args):
        checks.append(args)
        return q, k, v

    def fill(q, k, v, out, lse, *scalars):
        out.zero_(), lse.zero_()

    monkeypatch.setattr(interface, "validate_cuda_inputs", count_checks)
    monkeypatch.setattr(interface, "_forward_launcher", lambda *call: fill)  # the kernel's launch, either path
    monkeypatch.setattr(interface, "build_backward_ahead", lambda *call: None)  # (no kernel to build)
    monkeypatch.setattr(interface, "_plans", {})
    return checks


def test_eager_calls_unwrap_what_an_exited_transform_left(monkeypatch):
    """Eager calls enter autograd beneath autograd.Function.apply's Python layer (interface.eager_apply) and still
    do what that layer does outside functorch transforms: a tensor wrapped by a transform that has exited (here q,
    kept from inside torch.func.grad) reaches the launch and the saved tensors unwrapped; inside a transform the
    full apply runs, which refuses a Function without setup_context, as before."""
    from flashcute import interface

    stand_in_launches(monkeypatch)
    seen = []
    monkeypatch.setattr(interface, "_forward_launcher", lambda *call: lambda q, k, v, *rest: seen.append(q))
    leaked = []

    def loss(x):
        leaked.append(x)
        return x.sum()

    torch.func.grad(loss)(torch.randn(1, 16, 2, 32, dtype=torch.bfloat16))
    dead = leaked[0]
    assert torch._C._functorch.is_functorch_wrapped_tensor(dead)
    k, v = (torch.randn(1, 16, 2, 32, dtype=torch.bfloat16, requires_grad=True) for _ in "kv")
    out = flash_attn_func(dead, k, v)
    assert type(out.grad_fn).__name__ == "FlashAttentionBackward"
    assert not torch._C._functorch.is_functorch_wrapped_tensor(seen[0])
    assert not any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in out.grad_fn.saved_tensors[:3])
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda q: flash_attn_func(q, k, v).float().sum())(dead.detach().clone())


def test_a_signature_is_validated_once(monkeypatch):
    """A repeated call looks up its signature's plan instead of validating again; another stride, shape, dtype
    or option makes a new plan."""
    checks = stand_in_launches(monkeypatch)
    q, k, v = (torch.randn(2, 64, 4, 32, dtype=torch.bfloat16) for _ in "qkv")
    for _ in range(3):
        flash_attn_func(q, k, v, causal=True)
    assert len(checks) == 1
    flash_attn_func(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, causal=True)  # other strides
    flash_attn_func(q, k, v, causal=False)
    flash_attn_func(q[:, :32], k, v, causal=True)
    flash_attn_func(q, k, v, causal=True, softmax_scale=0.5)
    assert len(checks) == 5
    flash_attn_func(q, k, v, causal=True, softmax_scale=0.5)
    assert len(checks) == 5


def test_a_signature_looks_its_launch_up_once(monkeypatch):
    """The eager path without autograd keeps the family's launch with the signature's plan: the registry is asked
    once per signature, and each call still launches into new outputs."""
    from flashcute import interface

    stand_in_launches(monkeypatch)
    lookups, launches = [], []

    def forward_launcher(q, v, *call):
        lookups.append(call)
        return lambda q, k, v, out, lse, *scalars: launches.append((out, lse, scalars))

    monkeypatch.setattr(interface, "_forward_launcher", forward_launcher)
    q, k, v = (torch.randn(2, 64, 4, 32, dtype=torch.bfloat16) for _ in "qkv")
    outs = [flash_attn_func(q, k, v, causal=True, softcap=2.0) for _ in range(3)]
    flash_attn_func(q, k, v, window_size=(8, 8))
    assert lookups == [(-1, 0, "auto", 2.0, None, None), (8, 8, "auto", 0.0, None, None)]
    assert [o for o, _, _ in launches[:3]] == outs and len({id(o) for o in outs}) == 3
    assert all(scalars[:2] == (1 / math.sqrt(32), 0) and scalars[3] == 2.0 for _, _, scalars in launches[:3])


@pytest.mark.parametrize(
    "bad, error",
    [
        ({"causal": 1}, "causal must be a bool"),
        ({"window_size": (True, 0)}, "window_size must be"),
        ({"window_size": (-1, -2)}, "window_size must be"),
        ({"softmax_scale": True}, "softmax_scale must be"),
        ({"softmax_scale": float("nan")}, "softmax_scale must be"),
        ({"return_lse": 1}, "return_lse must be a bool"),
        ({"deterministic": "yes"}, "deterministic must be a bool"),
        ({"causal_align": "top"}, "causal_align must be one of"),
        ({"kernel": ["sm80"]}, "kernel must be a str"),
    ],
)
def test_a_cached_signature_still_rejects_bad_options(monkeypatch, bad, error):
    """Options that compare equal to a cached call's (1 == True, (True, 0) == (1, 0)) or that the cached call
    never had still get the full validation and its error."""
    stand_in_launches(monkeypatch)
    q, k, v = (torch.randn(1, 16, 2, 32, dtype=torch.bfloat16) for _ in "qkv")
    flash_attn_func(q, k, v, causal=True, window_size=(1, 0), softmax_scale=1.0)
    with pytest.raises((TypeError, ValueError), match=error):
        flash_attn_func(q, k, v, **{"causal": True, "window_size": (1, 0), "softmax_scale": 1.0, **bad})


def test_compiled_forward_and_backward_go_through_the_ops(monkeypatch):
    """Under torch.compile (a real compile on the CPU, stand-in launches) the forward graph calls flashcute::fwd
    once, the backward graph flashcute::bwd once, with the forward's scalars; the gradients reach q, k, v and the
    learnable sinks (from the stand-in's rows of their gradient for LSE = 0 and D = 1: -exp(sink - LSE) D, summed
    over batch and rows: dsink = -2 * rows * exp(sink))."""
    from flashcute import interface

    calls = stand_in_launches(monkeypatch)
    calls.clear()

    def fake_bwd(dout, q, k, v, out, lse, *scalars, softcap, alibi, dlse, sink):
        assert dlse is None or not dlse.any()  # no loss used the LSE (the traced backward materializes zeros)
        calls.append(("bwd", (*scalars, softcap)))
        return dout * 2, torch.ones_like(k), torch.zeros_like(v), -sink.exp()[:, None].expand_as(lse)

    family = SimpleNamespace(backward=fake_bwd)  # what launch_bwd, the op's implementation, launches
    monkeypatch.setattr(interface.registry, "backward_family", lambda *args, **kwargs: family)
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=capture, bw_compiler=capture)
    attend = torch.compile(
        lambda q, k, v, sink: flash_attn_func(q, k, v, causal=True, softmax_scale=0.5, learnable_sink=sink),
        backend=backend,
    )
    q, k, v = (torch.randn(2, n, 4, 64, dtype=torch.bfloat16, requires_grad=True) for n in (128, 96, 96))
    sink = torch.randn(4, requires_grad=True)
    attend(q, k, v, sink).float().sum().backward()
    assert torch.allclose(sink.grad, -2 * 128 * sink.detach().exp())
    targets = [[n.target for n in g.graph.nodes if n.op == "call_function"] for g in graphs]
    assert [t.count(torch.ops.flashcute.fwd.default) for t in targets] == [1, 0]
    assert [t.count(torch.ops.flashcute.bwd.default) for t in targets] == [0, 1]
    assert [c for c in calls if isinstance(c, tuple)] == [("bwd", (0.5, 96 - 128, -1, 0, False, 0.0))]
    assert torch.equal(q.grad, torch.full_like(q, 2)) and torch.equal(k.grad, torch.ones_like(k))


def test_the_api_imports_without_dynamo():
    """torch.compiler.disable imports torch._dynamo (about a second); the API's import must not pay it."""
    code = "import sys, flashcute\n"
    code += "for name in flashcute._API:\n    getattr(flashcute, name)\n"
    code += "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines()[-1] == "[]"


def test_eager_when_traced_runs_eagerly_under_compile(monkeypatch):
    seen, disables = [], []
    disable = torch.compiler.disable
    monkeypatch.setattr(torch.compiler, "disable", lambda fn: disables.append(fn) or disable(fn))

    def inner(x):
        seen.append(torch.compiler.is_compiling())
        return x * 3

    wrapped = eager_when_traced(inner)
    assert wrapped(torch.ones(2)).tolist() == [3.0, 3.0] and seen == [False]
    compiled = torch.compile(lambda x: wrapped(x + 1) - 1, backend="eager")
    assert compiled(torch.ones(2)).tolist() == [5.0, 5.0]
    assert seen == [False, False]  # run, not traced
    assert compiled(torch.ones(2)).tolist() == [5.0, 5.0] and seen == [False] * 3
    assert disables == [inner]  # wrapped once, at the first traced call
    with pytest.raises(torch._dynamo.exc.Unsupported):  # fullgraph: the eager call is a graph break
        torch.compile(lambda x: wrapped(x + 1), backend="eager", fullgraph=True)(torch.zeros(2))
