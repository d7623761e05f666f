"""The PyTorch boundary: validation, dispatch to a compiled kernel, the torch.library custom ops and autograd.

``flash_attn_func`` validates everything before any launch, then allocates the outputs and launches the compiled
kernel on the current CUDA stream. Its gradient comes from ``FlashAttention``, a ``torch.autograd.Function``, which
launches directly in eager mode and, when dynamo traces it under ``torch.compile``, calls the custom ops
``flashcute::fwd`` and ``flashcute::bwd``; they have fake (meta) implementations, so a model using them traces
with ``fullgraph=True`` (EAGER_NOTE says why eager calls skip the ops). ``flash_attn_varlen_func`` is built the same
way on the ops ``flashcute::varlen_fwd`` and ``flashcute::varlen_bwd``.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from flashcute import compile_cache, splitkv
from flashcute.kernels import registry
from flashcute.kernels.common import prepost
from flashcute.kernels.launch import DENSE, device_arch, dtype_name, num_sms
from flashcute.validation import (
    AttentionArgs,
    aligned_rows,
    pads_head_dims,
    validate_attention_args,
    validate_cuda_inputs,
    validate_varlen_args,
    validate_varlen_values,
)


def available_kernels(device: torch.device | None = None) -> list[str]:
    """Names of the flashcute kernel families the given (default: current) CUDA device runs, fastest first (the
    default picks the first); [] without a GPU."""
    return registry.available(device)


def kernel_window(args: AttentionArgs) -> tuple[int, int]:
    """The window as the kernels take it: a side at least seqlen_q + seqlen_k wide hides no key, so it becomes
    -1 (unbounded). Same mask, and no int32 overflow in the kernel's index arithmetic for huge windows."""
    unbounded = args.seqlen_q + args.seqlen_k
    return tuple(-1 if side >= unbounded else side for side in (args.window_left, args.window_right))


def launch_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    diag_offset: int,
    window_left: int,
    window_right: int,
    kernel: str = "auto",
    softcap: float = 0.0,
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> None:
    """Launch a forward kernel ("auto": the fastest family the device runs) into given outputs (validated inputs
    only; tests use it to poison outputs); ``softcap`` > 0 caps the scores; ``learnable_sink`` (nheads,) joins
    every row's denominator; ``alibi_slopes`` (nheads,) or (batch, nheads) bias the scores."""
    launch = _forward_launcher(q, v, window_left, window_right, kernel, softcap, learnable_sink, alibi_slopes)
    _run_forward(launch, q, k, v, out, lse, softmax_scale, diag_offset, softcap, learnable_sink, alibi_slopes)


def _forward_launcher(q, v, window_left, window_right, kernel, softcap, learnable_sink, alibi_slopes):
    """The family's launch for such a call (registry.forward_launcher)."""
    name = None if kernel == "auto" else kernel
    # packed, softcap, sink, alibi, v's head dim (the registry reads q's as "the same")
    flags = (False, softcap > 0, learnable_sink is not None, alibi_slopes is not None, v.shape[-1])
    return registry.forward_launcher(q.device, dtype_name(q), q.shape[-1], window_left, window_right, name, *flags)


def _run_forward(launch, q, k, v, out, lse, softmax_scale, diag_offset, softcap, learnable_sink, alibi_slopes) -> None:
    """launch_fwd's launch, through a family's ``launch`` made for the call."""
    sink = None if learnable_sink is None else kernel_sink(learnable_sink)
    alibi = None if alibi_slopes is None else kernel_alibi(alibi_slopes, q.shape[0], q.shape[2])
    if (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16:  # (one test a call)
        q, k, v = aligned_inputs(q, k, v)
    launch(q, k, v, out, lse, softmax_scale, diag_offset, DENSE, softcap, sink, alibi)


def aligned_inputs(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors, each one that does not start on a 16-byte boundary (the kernels' 128-bit loads) copied to one
    that does: inputs the kernels only read, of any layout (validate_cuda_inputs), as PyTorch's attention takes
    them. The copy happens where the kernels launch, on real tensors (fake ones, traced, have no address)."""
    return tuple(t if t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format) for t in tensors)


def kernel_sink(learnable_sink: torch.Tensor | None) -> torch.Tensor | None:
    """Learnable sinks as the kernels read them: contiguous float32, no autograd history (a copy only where the
    given tensor is not that already)."""
    if learnable_sink is None:
        return None
    if learnable_sink.dtype != torch.float32 or not learnable_sink.is_contiguous():
        learnable_sink = learnable_sink.float().contiguous()
    return learnable_sink.detach()


def kernel_alibi(alibi_slopes: torch.Tensor | None, batch: int, nheads: int) -> torch.Tensor | None:
    """ALiBi slopes as the kernels read them: (batch, nheads) float32 with contiguous rows (a (nheads,) tensor is
    the same row for every sequence), no autograd history."""
    if alibi_slopes is None:
        return None
    slopes = alibi_slopes.detach()
    if slopes.dtype != torch.float32:
        slopes = slopes.float()
    return slopes.expand(batch, nheads).contiguous()


def readable(name: str, t: torch.Tensor) -> torch.Tensor:
    """``t`` as the kernels read it, rows and start (validation.aligned_rows, aligned_inputs): itself where it fits,
    else a copy; for a tensor whose layout no signature fixed (autograd's dO, a KV cache call's q)."""
    return aligned_inputs(aligned_rows(name, t))[0]


def backward_grads(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    diag_offset: int,
    window_left: int,
    window_right: int,
    deterministic: bool,
    kernel: str = "auto",
    softcap: float = 0.0,
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    dlse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The backward pass; returns (dq, dk, dv, dsink), the first three shaped like q, k, v, dsink like
    ``learnable_sink`` (None without). ``kernel``, ``softcap``, ``learnable_sink`` and ``alibi_slopes`` as in
    launch_fwd; a family whose backward does not cover the head dim or the deterministic mode hands it to the next one
    the device runs. The sinks change only the LSE that the backward reads, so its kernels are the same with or without,
    but for the preprocess, which also gives each row's share of the sinks' gradient (prepost.preprocess, summed by
    prepost.sink_grad); the ALiBi slopes get no gradient (flash_attn's convention). ``dlse``, shaped like lse: the
    gradient of the returned LSE, where a loss uses it (prepost.preprocess: it joins through D).

    dQ is added across K/V tiles by fp32 atomics (or TMA reduce-adds) by default; ``deterministic`` computes it in
    a kernel that adds in a fixed order, bitwise reproducible."""
    dout = readable("dout", dout)  # (autograd hands over whatever layout the loss made)
    name = None if kernel == "auto" else kernel
    family = registry.backward_family(q.device, name, q.shape[-1], deterministic, head_dim_v=v.shape[-1])
    if (q.data_ptr() | k.data_ptr() | v.data_ptr() | out.data_ptr()) % 16:  # (dout: readable)
        q, k, v, out = aligned_inputs(q, k, v, out)
    scalars = (softmax_scale, diag_offset, window_left, window_right)
    alibi = None if alibi_slopes is None else kernel_alibi(alibi_slopes, q.shape[0], q.shape[2])
    scores = {"softcap": softcap, "alibi": alibi, "dlse": dlse, "sink": kernel_sink(learnable_sink)}
    dq, dk, dv, sink_rows = family.backward(dout, q, k, v, out, lse, *scalars, deterministic, **scores)
    return dq, dk, dv, None if learnable_sink is None else prepost.sink_grad(sink_rows, learnable_sink.dtype)


def build_backward_ahead(
    q: torch.Tensor,
    v: torch.Tensor,
    window_left: int,
    window_right: int,
    kernel: str,
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    deterministic: bool,
    packed: bool = False,
) -> None:
    """Start building, in the background, the kernels that the backward of such a forward will run where they are
    not built yet (compile_cache.build_in_background), so that a first training step builds them while its forward
    builds and runs its own. ``kernel``, ``softcap``: backward_grads's."""
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    name = None if kernel == "auto" else kernel
    try:
        family = registry.backward_family(q.device, name, head_dim, deterministic, packed, head_dim_v=head_dim_v)
    except (ValueError, StopIteration):  # no family runs it: the backward says so, if it comes
        return
    call = (head_dim, head_dim_v, dtype_name(q), window_left, window_right, deterministic, packed, softcap > 0)
    configs = family.backward_kernels(*call, alibi_slopes is not None)
    compile_cache.build_in_background(device_arch(q.device), configs)


def launch_bwd(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """backward_grads as the op ``bwd`` returns it, dsink an empty float32 tensor where there is no sink (an op
    returns a tensor either way)."""
    dq, dk, dv, dsink = backward_grads(*args, **kwargs)
    return dq, dk, dv, _or_empty(dsink, dq)


def _or_empty(dsink: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """``dsink``, or an empty float32 tensor on ``like``'s device where there is none."""
    return like.new_empty(0, dtype=torch.float32) if dsink is None else dsink


def forward_outputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *options) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse), newly allocated, from the forward kernel (validated inputs only); ``options`` are launch_fwd's
    after lse: softmax_scale, diag_offset, window_left, window_right, kernel, softcap, learnable_sink,
    alibi_slopes."""
    out, lse = _new_outputs(q, v)
    launch_fwd(q, k, v, out, lse, *options)
    return out, lse


def _new_outputs(q: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's out (q's shape at v's head dim, contiguous) and lse (batch, nheads, seqlen_q) float32, empty."""
    batch, seqlen_q, nheads, headdim = q.shape
    if v.shape[-1] == headdim:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)  # (half torch.empty's host time)
    else:
        out = q.new_empty((batch, seqlen_q, nheads, v.shape[-1]))
    return out, q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)


# The custom ops, defined with torch.library below the autograd layer (no Python autograd kernel of their own: an
# op of torch.library.custom_op with register_autograd costs two more Python layers a call, 60 -> 47 us a call of a
# compiled graph on the CPU, docs/benchmarking.md, Host overhead). Autograd is the autograd.Functions' below: in
# eager mode they launch directly, and under torch.compile, where dynamo traces them, they call these ops, whose
# fake implementations let a model trace with fullgraph=True.
# The namespace is the package's name: "flashcute", or the renamed copy's that `flashcute compare` imports beside it.
_NAMESPACE = __name__.partition(".")[0]
_LIB = torch.library.Library(_NAMESPACE, "DEF")
_OPS = getattr(torch.ops, _NAMESPACE)


def _define_op(schema: str, impl, fake) -> None:
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    _LIB.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{_NAMESPACE}::{name}", fake, lib=_LIB)


def _fwd_fake(q, k, v, *options, **scores):
    batch, seqlen_q, nheads, _ = q.shape
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    return out, q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)


def _grads(q, k, v, learnable_sink):
    dsink = q.new_empty(0, dtype=torch.float32) if learnable_sink is None else learnable_sink.new_empty(q.shape[2])
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsink


def _bwd_fake(dout, q, k, v, out, lse, *scalars, softcap=0.0, learnable_sink=None, alibi_slopes=None, dlse=None):
    """scalars: softmax_scale .. kernel, then softcap, learnable_sink, alibi_slopes and dlse where given by
    position."""
    learnable_sink = scalars[7] if len(scalars) > 7 else learnable_sink
    return _grads(q, k, v, learnable_sink)


# No argument has a default: inductor passes one that has by keyword, which costs every call of a compiled graph the
# dispatcher's keyword handling (docs/benchmarking.md, Host overhead).
_SCORES = "float softcap, Tensor? learnable_sink, Tensor? alibi_slopes"
_define_op(
    "fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, SymInt diag_offset, SymInt window_left, "
    f"SymInt window_right, str kernel, {_SCORES}) -> (Tensor, Tensor)",
    forward_outputs,
    _fwd_fake,
)
_define_op(
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float softmax_scale, SymInt diag_offset, "
    f"SymInt window_left, SymInt window_right, bool deterministic, str kernel, {_SCORES}, Tensor? dlse) -> "
    "(Tensor, Tensor, Tensor, Tensor)",
    launch_bwd,
    _bwd_fake,
)


class FlashAttention(torch.autograd.Function):
    """flash_attn_func's differentiable door: the forward and backward launches directly in eager mode (the
    ops' dispatch would cost more host time a call than the rest of a call, EAGER_NOTE), the custom ops when
    dynamo traces it under torch.compile."""

    @staticmethod
    def forward(ctx, q, k, v, learnable_sink, alibi_slopes, options):
        """``options``: softmax_scale, diag_offset, window_left, window_right, kernel, softcap, deterministic, and
        the call's CallPlan (None when dynamo traces it), in one tuple (apply looks at each argument it is given:
        one tuple costs it less than eight); ``learnable_sink`` (nheads,) or None, differentiable; ``alibi_slopes``
        or None, constants."""
        scalars, deterministic, plan = options[:-2], options[-2], options[-1]
        if plan is None:
            out, lse = _OPS.fwd.default(q, k, v, *scalars, learnable_sink, alibi_slopes)
        else:
            if plan.backward_built_for is not deterministic:  # a signature's first differentiable call in this mode
                plan.backward_built_for = deterministic
                build_backward_ahead(q, v, *scalars[2:], alibi_slopes, deterministic)
            out, lse = plan.forward(q, k, v, learnable_sink, alibi_slopes)
        ctx.save_for_backward(q, k, v, out, lse, learnable_sink, alibi_slopes)
        ctx.scalars = (*scalars[:4], deterministic, *scalars[4:])  # backward_grads' order
        ctx.set_materialize_grads(False)  # an output no loss uses gets None: an unused LSE costs nothing
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, learnable_sink, alibi_slopes = ctx.saved_tensors
        backward = _OPS.bwd.default if torch.compiler.is_compiling() else backward_grads
        dout = torch.zeros_like(out) if dout is None else dout  # (a loss of the LSE alone)
        scores = (learnable_sink, alibi_slopes, dlse)
        dq, dk, dv, dsink = backward(dout, q, k, v, out, lse, *ctx.scalars, *scores)
        return dq, dk, dv, None if learnable_sink is None else dsink, None, None


# EAGER_NOTE: a custom op's dispatch costs more host time a call than an autograd.Function's and the rest of a call
# together (docs/benchmarking.md, Host overhead), so eager calls launch from Python and only traced calls go through
# the ops.


def eager_apply(function: type[torch.autograd.Function]):
    """``function.apply(q, k, v, sink, alibi, *rest)`` for eager calls (``rest`` holds no tensor), less the Python
    layer's generic work: outside functorch transforms autograd.Function.apply only unwraps each tensor argument
    left from an exited transform (a generator over the arguments) and calls the C++ apply beneath; this unwraps the
    five tensor slots itself and calls the same C++ apply (docs/benchmarking.md, Host overhead). Inside a transform,
    the full apply."""
    c_apply = super(torch.autograd.Function, function).apply
    unwrap = torch._C._functorch.unwrap_if_dead

    def apply(q, k, v, sink, alibi, *rest):
        if torch._C._are_functorch_transforms_active():
            return function.apply(q, k, v, sink, alibi, *rest)
        sink = sink if sink is None else unwrap(sink)
        alibi = alibi if alibi is None else unwrap(alibi)
        return c_apply(unwrap(q), unwrap(k), unwrap(v), sink, alibi, *rest)

    return apply


_attention_apply = eager_apply(FlashAttention)


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    deterministic: bool = False,
    causal_align: str = "bottom_right",
    kernel: str | None = None,
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Exact attention, FlashAttention-style, for CUDA fp16/bf16 tensors; differentiable in q, k, v (and
    learnable_sink).

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim), nheads % nheads_k == 0;
    a batch or a length of 0 launches nothing. Head dims up to 256; one that is not a multiple of 8 runs on
    zero-padded copies (as in flash_attn). v's head dim may differ from q's and k's (DeepSeek-style (192, 128)): up
    to q's head-dim bucket (32, 64, 96, 128, 192, 256), out then has v's. Any layout: tensors whose rows the
    kernels cannot read where they lie (validate_cuda_inputs) are read from a contiguous copy.
    softmax_scale defaults to 1/sqrt(headdim). causal=True masks keys j > i + seqlen_k - seqlen_q (bottom-right,
    flash_attn's convention) or, with causal_align="top_left", keys j > i (the seed's rule). window_size=(left,
    right) keeps keys within [i + offset - left, i + offset + right]; -1 (or None) means unbounded. A query that
    sees no key gets O = 0 and LSE = -inf. softcap > 0 caps each score (Gemma 2): softcap * tanh(score / softcap)
    takes the place of score = softmax_scale * q.k before the mask and the softmax; 0 (the default) leaves scores as
    they are.
    learnable_sink, a float tensor (nheads,) on q's device (flash-attn-4's convention, gpt-oss): one logit per query
    head that joins every row's softmax denominator, exp(sink) beside the exp(score) of the keys, with no value
    (O = sum_j exp(s_j) v_j / (exp(sink) + sum_j exp(s_j))); LSE includes it, a row that sees no key gets O = 0 and
    LSE = sink, and the sink receives a gradient. alibi_slopes, float32 (nheads,) or (batch, nheads) on q's device
    (flash_attn's convention, MPT/BLOOM): the score of query i and key j gets -slope * |i + seqlen_k - seqlen_q - j|
    after the softcap (top-left alignment: -slope * |i - j|); the slopes are constants (no gradient), and not read
    on the host (a non-finite slope gives NaN outputs).
    Returns out (batch, seqlen_q, nheads, v's headdim), and with return_lse also
    lse (batch, nheads, seqlen_q), float32, natural log (differentiable, as flash-attn-4's: a loss may use it; an
    unused LSE costs the backward nothing). The backward adds dQ with fp32
    atomics by default; ``deterministic=True`` computes dQ in a separate kernel that adds in a fixed order, so
    gradients are bitwise reproducible (slower). The forward is deterministic either way.
    ``kernel`` picks a kernel by name (see ``available_kernels``); the default picks the fastest for the device.
    Under ``torch.autocast("cuda")`` float32 inputs are cast to the autocast dtype.
    """
    compiling = torch.compiler.is_compiling()
    options = (softmax_scale, causal, window_size, softcap, causal_align, kernel, learnable_sink, alibi_slopes)
    key = None if compiling else _signature(q, k, v, *options)
    plan = _plans.get(key) if key is not None else None
    if plan is None:
        plan = _plan(q, k, v, *options)
        if key is not None and not plan.casts:
            if len(_plans) >= MAX_PLANS:
                _plans.clear()
            _plans[key] = plan
    if type(deterministic) is not bool or type(return_lse) is not bool:
        for name, flag in (("deterministic", deterministic), ("return_lse", return_lse)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
    q, k, v = plan.inputs(q, k, v)
    if plan.detour is not None:
        scores = {"softcap": softcap, "learnable_sink": learnable_sink, "alibi_slopes": alibi_slopes}
        options = {"causal": causal, "window_size": window_size, "causal_align": causal_align, **scores}
        if plan.detour == "empty":
            if kernel is not None:
                registry.pick(q.device, kernel)  # (a name the device does not run is still refused)
            return _nothing_to_compute(q, k, v, return_lse, plan.args.softmax_scale, **options)
        options |= {"deterministic": deterministic, "kernel": kernel}
        return padded_call(flash_attn_func, q, k, v, return_lse, plan.args.softmax_scale, **options)
    sink, alibi = learnable_sink, alibi_slopes
    if torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad or (sink is not None and sink.requires_grad)
    ):
        if compiling:
            out, lse = FlashAttention.apply(q, k, v, sink, alibi, (*plan.scalars, deterministic, None))
        else:
            out, lse = _attention_apply(q, k, v, sink, alibi, (*plan.scalars, deterministic, plan))
    elif plan.key_range is not None and not compiling:
        out, lse = _split_kv(q, k, v, plan, sink)
    elif compiling:
        out, lse = _OPS.fwd.default(q, k, v, *plan.scalars, sink, alibi)
    else:
        out, lse = plan.forward(q, k, v, sink, alibi)
    return (out, lse) if return_lse else out


class CallPlan:
    """What one signature of flash_attn_func decides, once: the validated arguments resolved to the kernels'
    scalars (softmax_scale, diag_offset, window_left, window_right, kernel, softcap), whether the inputs need new
    strides (validate_cuda_inputs' row views) or a cast (autocast), so that a repeated call only looks its plan up."""

    __slots__ = (
        "args",
        "backward_built_for",
        "casts",
        "detour",
        "key_range",
        "launch",
        "restrides",
        "scalars",
        "split",
    )

    def __init__(
        self,
        args: AttentionArgs,
        scalars: tuple,
        restrides: bool,
        casts: bool,
        key_range: tuple[int, int, int] | None,
        detour: str | None,
    ):
        self.args, self.scalars, self.restrides, self.casts = args, scalars, restrides, casts
        self.key_range, self.detour, self.split, self.launch = key_range, detour, None, None
        self.backward_built_for = None  # the deterministic mode build_backward_ahead last ran for

    def forward(self, q, k, v, learnable_sink, alibi_slopes) -> tuple[torch.Tensor, torch.Tensor]:
        """forward_outputs for this signature's inputs, through the family's launch that its first call looked up
        (the eager paths, with and without autograd: a repeated call skips the registry's key and lookup)."""
        softmax_scale, diag_offset, window_left, window_right, kernel, softcap = self.scalars
        launch = self.launch
        if launch is None:
            scores = (softcap, learnable_sink, alibi_slopes)
            launch = self.launch = _forward_launcher(q, v, window_left, window_right, kernel, *scores)
        out, lse = _new_outputs(q, v)
        _run_forward(launch, q, k, v, out, lse, softmax_scale, diag_offset, softcap, learnable_sink, alibi_slopes)
        return out, lse

    def inputs(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k and v as the kernels take them: cast under autocast, rows re-strided where validation said so."""
        if self.casts:
            q, k, v = (t.to(torch.get_autocast_dtype("cuda")) for t in (q, k, v))
        if self.restrides or self.casts:
            q, k, v = validate_cuda_inputs(q, k, v, self.args)
        return q, k, v


# The plans of the signatures seen so far. A program makes a few kinds of calls; one whose shapes change at every
# call (a growing sequence) would fill it, so it starts over past MAX_PLANS.
_plans: dict[tuple, CallPlan] = {}
MAX_PLANS = 4096


def _signature(
    q, k, v, softmax_scale, causal, window_size, softcap, causal_align, kernel, learnable_sink, alibi_slopes
) -> tuple | None:
    """What flash_attn_func's decisions depend on, as a dict key; None where an argument's type alone could make
    two calls that differ in meaning compare equal (True == 1 == 1.0), so those take the full validation."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        return None
    scores = []
    for t in (learnable_sink, alibi_slopes):
        if t is not None and not isinstance(t, torch.Tensor):
            return None
        scores.append(None if t is None else (t.shape, t.dtype, t.device))
    if type(causal) is not bool or not (softmax_scale is None or type(softmax_scale) is float):
        return None
    if type(window_size) is not tuple or len(window_size) != 2 or type(softcap) is not float:
        return None
    if type(window_size[0]) is not int or type(window_size[1]) is not int or type(causal_align) is not str:
        return None
    if kernel is not None and type(kernel) is not str:
        return None
    return (
        q.shape,
        q.stride(),
        q.dtype,
        q.device,
        k.shape,
        k.stride(),
        k.dtype,
        k.device,
        v.shape,
        v.stride(),
        v.dtype,
        v.device,
        softmax_scale,
        causal,
        window_size,
        softcap,
        causal_align,
        kernel,
        *scores,
    )


def _plan(
    q, k, v, softmax_scale, causal, window_size, softcap, causal_align, kernel, learnable_sink, alibi_slopes
) -> CallPlan:
    """Validate a call's arguments in full (every error names the argument, its value and what is allowed) and
    resolve them into its CallPlan."""
    scores = (softcap, learnable_sink, alibi_slopes)
    args = validate_attention_args(q, k, v, softmax_scale, causal, causal_align, window_size, *scores)
    casts = q.dtype == torch.float32 and q.is_cuda and torch.is_autocast_enabled("cuda")
    if casts:
        q, k, v = (t.to(torch.get_autocast_dtype("cuda")) for t in (q, k, v))  # the op is no autocast-aware op
    ready = validate_cuda_inputs(q, k, v, args)
    if kernel is not None and not isinstance(kernel, str):
        raise TypeError(f"kernel must be a str or None, got {kernel!r}")
    restrides = any(new is not old for new, old in zip(ready, (q, k, v), strict=True))
    scalars = (args.softmax_scale, args.diagonal_offset, *kernel_window(args), kernel or "auto", args.softcap)
    # a call the kernels do not take as it is: "empty", no query row or no key (_nothing_to_compute), or "pad",
    # head dims off multiples of 8 (padded_call)
    detour = "empty" if args.empty else "pad" if pads_head_dims(args) else None
    key_range = None if detour else _split_key_range(args, *ready)
    return CallPlan(args, scalars, restrides, casts, key_range, detour)


def _nothing_to_compute(q, k, v, return_lse: bool, softmax_scale: float, **options):
    """flash_attn_func where there is no query row or no key (a batch or a length of 0): no launch; the spec's
    operations on the empty sizes give out (empty, or O = 0) and LSE (-inf, or the sink) in the kernels' dtypes,
    differentiable as the kernels' path is (zero gradients)."""
    from flashcute.reference.naive import attention_ref  # (the reference package imports this module)

    out, lse = attention_ref(q, k, v, softmax_scale, return_lse=True, **options)
    out, lse = out.to(q.dtype), lse.float()
    return (out, lse) if return_lse else out


def pad_head_dims(*tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """The tensors (None passes) whose head dim, the last, is not a multiple of 8 zero-padded up to one, the
    kernels' 16-byte rows (flash_attn pads such head dims alike): a zero column of q and k adds nothing to a score,
    and v's zero columns make out's extra columns, which the caller drops. F.pad is differentiable, so autograd
    takes the gradients back to the given tensors' columns."""
    return tuple(t if t is None or t.shape[-1] % 8 == 0 else F.pad(t, (0, -t.shape[-1] % 8)) for t in tensors)


def padded_call(entry, q, k, v, return_lse: bool, softmax_scale: float, *args, **options):
    """``entry``(q, k, v, *args, ...) on head dims zero-padded to multiples of 8 (pad_head_dims), with the scale
    that the given head dim resolved to, and its out cut back to v's head dim (a view, as flash_attn returns)."""
    out, lse = entry(*pad_head_dims(q, k, v), *args, softmax_scale=softmax_scale, return_lse=True, **options)
    out = out[..., : v.shape[-1]]
    return (out, lse) if return_lse else out


def _split_key_range(
    args: AttentionArgs, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[int, int, int] | None:
    """(lo, hi, tail): the keys [lo, hi) that a call attends unmasked on the split-KV path (splitkv.py) and the
    ``tail`` keys after them that its queries see under its mask (splitkv.tail_keys), or None where the plain
    launch is as fast: decoding-sized calls (every (sequence, kv head)'s queries fit one tile), unmasked, with one
    query row (whose mask is a key range) or several under a right-bounded mask aligned bottom-right, with at least
    two splits' worth of keys to walk and either more than one split or query heads to pack; the keys' (batch,
    seqlen_k) dims must merge into the packed kernels' rows."""
    group = args.qheads_per_kvhead
    window = kernel_window(args)
    tail = splitkv.tail_keys(args.seqlen_q, *window)
    if args.seqlen_q * group > splitkv.ROWS_PER_TILE or tail is None:
        return None
    if tail and args.causal_align != "bottom_right":  # (the tail's mask is aligned bottom-right)
        return None
    if args.alibi_slopes is not None:  # a split's keys lose their positions, which the bias needs
        return None
    if any(t.shape[0] > 1 and t.stride(0) != t.shape[1] * t.stride(1) for t in (k, v)):
        return None
    lo, hi = 0, args.seqlen_k - min(tail, args.seqlen_k)
    if args.seqlen_q == 1:
        lo, hi = splitkv.one_query_key_range(args.diagonal_offset, args.seqlen_k, *window)
    if hi - lo < 2 * splitkv.MIN_SPLIT_KEYS:
        return None
    tiles = splitkv.packed_tiles(args.batch, args.seqlen_q, args.nheads, args.nheads_k)
    if group == 1 and splitkv.num_splits(tiles, hi - lo, num_sms(q.device)) == 1:
        return None
    return lo, hi, args.seqlen_k - hi if tail else 0


def _split_kv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: CallPlan, learnable_sink: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_attn_func's forward on the split-KV path, over the plan's key range and tail: every sequence attends
    the same keys, so the split's index tensors are constant_chunks' (and the tail's), kept with the plan."""
    args = plan.args
    batch, seqlen_k = args.batch, args.seqlen_k
    split = plan.split
    if split is None:
        lo, hi, tail = plan.key_range
        how = splitkv.plan(batch, args.seqlen_q, args.nheads, args.nheads_k, hi - lo, 0, q.device)
        if tail:  # the keys after hi (lo is 0), in each sequence's rows from b * seqlen_k
            split = (how, *how.constant_tail(seqlen_k, seqlen_k, tail, kernel_window(args)[1]))
        else:
            split = (how, how.constant_chunks(seqlen_k, lo, hi), None)
        if not (q.is_cuda and torch.cuda.is_current_stream_capturing()):  # else the graph's memory pool holds them
            plan.split = split
    how, chunks, tail = split
    keys = _rows(k, v, batch * seqlen_k)
    return how.attention(q, *keys, chunks, args.softmax_scale, *plan.scalars[4:], learnable_sink, tail)


def _rows(k: torch.Tensor, v: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v (batch, seqlen_k, nheads_k, headdim) as the packed kernels' (batch * seqlen_k, nheads_k, headdim)."""
    return k.view(rows, *k.shape[2:]), v.view(rows, *v.shape[2:])


# ---- packed variable-length batches ---------------------------------------------------------------------------


def varlen_outputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    seqused_q: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    kernel: str,
    softcap: float = 0.0,
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    *,
    pages: tuple = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (total_q, nheads, v's headdim), lse (nheads, total_q)) of a packed batch (validated inputs only). Rows that
    no sequence counts (past seqused_q) are O = 0, LSE = -inf, as are rows whose sequence has no key (LSE = the
    head's sink, with ``learnable_sink``). ``alibi_slopes``: (nheads,) or (batch, nheads), a row per sequence.
    ``pages``: (block_table, page_size, seq_rows) where k and v are a cache's pages, (pages * page_size, nheads_k,
    headdim) rows read where they lie (registry.reads_pages said the family can): cu_seqlens_k numbers sequence b's
    positions from b * seq_rows, and position p lies in page block_table[b, p // page_size]."""
    total_q, nheads, _ = q.shape
    # allocated from q (torch.empty with a dtype and device takes twice the host time: design.md, A call's host path)
    out, lse = q.new_empty((total_q, nheads, v.shape[-1])), q.new_empty((nheads, total_q), dtype=torch.float32)
    if seqused_q is not None:  # rows past a sequence's seqused_q are never written
        out.zero_()
        lse.fill_(-math.inf)
    if total_q == 0 or cu_seqlens_q.shape[0] == 1 or max_seqlen_q == 0:
        return out, lse
    sink = kernel_sink(learnable_sink)
    if k.shape[0] == 0 or max_seqlen_k == 0:  # no sequence has a key
        lse.fill_(-math.inf)
        if sink is not None:  # the rows of the sequences get their head's sink
            counted = _rows_in_sequences(cu_seqlens_q, seqused_q, total_q)
            torch.where(counted, sink[:, None], lse, out=lse)
        return out.zero_(), lse
    name = None if kernel == "auto" else kernel
    window = (window_left, window_right)
    alibi = kernel_alibi(alibi_slopes, cu_seqlens_q.shape[0] - 1, nheads)
    scores = {"softcap": softcap > 0, "sink": sink is not None, "alibi": alibi is not None}
    scores["head_dim_v"] = v.shape[-1]
    scores["page_size"] = pages[1] if pages else 0
    launch = registry.forward_launcher(q.device, dtype_name(q), q.shape[-1], *window, name, True, **scores)
    q, k, v = aligned_inputs(q, k, v)
    packed = _packed_args(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k)
    paged = {"pages": pages} if pages else {}
    launch(q[None], k[None], v[None], out[None], lse[None], softmax_scale, 0, packed, softcap, sink, alibi, **paged)
    return out, lse


def _rows_in_sequences(cu_seqlens_q: torch.Tensor, seqused_q: torch.Tensor | None, total_q: int) -> torch.Tensor:
    """bool (total_q,): the rows of q that a sequence counts (inside cu_seqlens_q[-1] and its seqused_q); device
    arithmetic, no host sync."""
    rows = torch.arange(total_q, dtype=torch.int32, device=cu_seqlens_q.device)
    batch = cu_seqlens_q.shape[0] - 1
    sequence = torch.searchsorted(cu_seqlens_q[1:], rows, right=True).clamp_(max=batch - 1)
    ends = cu_seqlens_q[1:] if seqused_q is None else cu_seqlens_q[:-1] + seqused_q
    return (rows < ends[sequence]) & (rows < cu_seqlens_q[-1])


def _packed_args(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k) -> tuple:
    """The kernels' packed-batch arguments (kernels/common/seqlen.py): cu_seqlens[1:] stands for a seqused not
    given."""
    used_q = cu_seqlens_q[1:] if seqused_q is None else seqused_q
    used_k = cu_seqlens_k[1:] if seqused_k is None else seqused_k
    return (cu_seqlens_q, cu_seqlens_k, used_q, used_k, max_seqlen_q, max_seqlen_k)


def launch_varlen_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    seqused_q: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    deterministic: bool,
    kernel: str,
    softcap: float = 0.0,
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    dlse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of a packed batch: (dq, dk, dv) shaped like q, k, v, rows outside every sequence 0, and dsink
    as launch_bwd returns it; ``dlse`` (nheads, total_q) as in backward_grads."""
    if q.shape[0] == 0 or k.shape[0] == 0 or cu_seqlens_q.shape[0] == 1 or 0 in (max_seqlen_q, max_seqlen_k):
        # no key anywhere: O = 0 in every row, so D = 0 and the sinks get no gradient either
        dsink = None if learnable_sink is None else torch.zeros_like(learnable_sink)
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), _or_empty(dsink, q)
    dout = readable("dout", dout)  # (autograd hands over whatever layout the loss made)
    name = None if kernel == "auto" else kernel
    family = registry.backward_family(q.device, name, q.shape[-1], deterministic, True, v.shape[-1])
    q, k, v, out = aligned_inputs(q, k, v, out)
    packed = _packed_args(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k)
    tensors = (t[None] for t in (dout, q, k, v, out, lse))
    alibi = kernel_alibi(alibi_slopes, cu_seqlens_q.shape[0] - 1, q.shape[1])
    scalars = (softmax_scale, 0, window_left, window_right, deterministic)
    scores = (softcap, alibi, None if dlse is None else dlse[None], kernel_sink(learnable_sink))
    dq, dk, dv, sink_rows = family.backward(*tensors, *scalars, packed, *scores)
    dq, dk, dv = dq[0], dk[0], dv[0]
    dsink = None if learnable_sink is None else prepost.sink_grad(sink_rows, learnable_sink.dtype)
    return dq, dk, dv, _or_empty(dsink, dq)


def _varlen_fwd_fake(q, k, v, *options, **scores):
    total_q, nheads, _ = q.shape
    return q.new_empty((total_q, nheads, v.shape[-1])), q.new_empty((nheads, total_q), dtype=torch.float32)


_SEQUENCES = "Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_q, Tensor? seqused_k"


def _varlen_bwd_fake(dout, q, k, v, out, lse, *scalars, softcap=0.0, learnable_sink=None, alibi_slopes=None, dlse=None):
    """scalars: cu_seqlens_q .. kernel, then softcap, learnable_sink, alibi_slopes and dlse where given by
    position."""
    learnable_sink = scalars[12] if len(scalars) > 12 else learnable_sink
    return _grads(q, k, v, learnable_sink)


_define_op(
    f"varlen_fwd(Tensor q, Tensor k, Tensor v, {_SEQUENCES}, SymInt max_seqlen_q, SymInt max_seqlen_k, "
    f"float softmax_scale, SymInt window_left, SymInt window_right, str kernel, {_SCORES}) -> (Tensor, Tensor)",
    varlen_outputs,
    _varlen_fwd_fake,
)
_define_op(
    f"varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {_SEQUENCES}, "
    "SymInt max_seqlen_q, SymInt max_seqlen_k, float softmax_scale, SymInt window_left, SymInt window_right, "
    f"bool deterministic, str kernel, {_SCORES}, Tensor? dlse) -> (Tensor, Tensor, Tensor, Tensor)",
    launch_varlen_bwd,
    _varlen_bwd_fake,
)


def _dense_sides(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, return_lse,
                 options):  # fmt: skip
    """flash_attn_varlen_func with a dense side (cu_seqlens None): the dense batch as a packed one whose sequence b
    is rows b * seqlen of it (views where the layout allows), out and LSE back in the dense layout for a dense q.
    Both sides dense without autograd (decoding, flash-attn-4's way) is flash_attn_with_kvcache's call without an
    append, which splits the keys of a few query rows (splitkv.py)."""
    if _decoding_call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, options):
        from flashcute.kvcache import flash_attn_with_kvcache  # (kvcache imports this module)

        names = ("softmax_scale", "causal", "window_size", "softcap", "kernel", "learnable_sink", "alibi_slopes")
        cache = {"cache_seqlens": seqused_k, "block_table": options["block_table"]}
        return flash_attn_with_kvcache(q, k, v, **cache, **{n: options[n] for n in names}, return_lse=return_lse)
    dense_q = cu_seqlens_q is None
    if dense_q:
        batch, seqlen_q = _dense_sizes("q", q, "cu_seqlens_q", "(batch, seqlen_q, nheads, headdim)")
        cu_seqlens_q = splitkv.row_starts(batch + 1, seqlen_q, q.device)
        max_seqlen_q = seqlen_q if max_seqlen_q is None else max_seqlen_q
        q = q.reshape(batch * seqlen_q, *q.shape[2:])
    if cu_seqlens_k is None:
        batch = cu_seqlens_q.shape[0] - 1
        if options["block_table"] is None:
            _, seqlen_k = _dense_sizes("k", k, "cu_seqlens_k", "(batch, seqlen_k, nheads_k, headdim)")
            _dense_sizes("v", v, "cu_seqlens_k", "(batch, seqlen_k, nheads_k, headdim)")
            k, v = (t.reshape(t.shape[0] * t.shape[1], *t.shape[2:]) for t in (k, v))
        else:  # every sequence's pages' positions, seqused_k of them counted
            seqlen_k = options["block_table"].shape[-1] * k.shape[1]
        cu_seqlens_k = splitkv.row_starts(batch + 1, seqlen_k, q.device)
        max_seqlen_k = seqlen_k if max_seqlen_k is None else max_seqlen_k
    sequences = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    used = {"seqused_q": seqused_q, "seqused_k": seqused_k}
    out, lse = flash_attn_varlen_func(q, k, v, *sequences, **options, **used, return_lse=True)
    if dense_q:
        out = out.view(batch, seqlen_q, *out.shape[1:])
        lse = lse.view(lse.shape[0], batch, seqlen_q).transpose(0, 1).contiguous()
    return (out, lse) if return_lse else out


def _decoding_call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, options) -> bool:
    """Whether a varlen call with dense sides is flash_attn_with_kvcache's (_dense_sides): both sides dense and
    non-empty, no gradient, every query row counted, no value check asked, and k and v readable where they lie
    (the cache entry refuses other layouts, which the packed path copies)."""
    tensors = (q, k, v)
    if cu_seqlens_q is not None or cu_seqlens_k is not None or seqused_q is not None or options["validate"]:
        return False
    if torch.compiler.is_compiling():  # (the cache entry is eager; traced tensors have no address)
        return False
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 and t.numel() for t in tensors):
        return False
    sink = options["learnable_sink"]
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (*tensors, sink)):
        return False
    return all(aligned_rows(name, t) is t and t.data_ptr() % 16 == 0 for name, t in (("k", k), ("v", v)))


def _dense_sizes(name: str, t, cu_name: str, layout: str) -> tuple[int, int]:
    """(batch, seqlen) of a dense side, after checking it is a 4-D tensor."""
    if not isinstance(t, torch.Tensor) or t.dim() != 4:
        shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must have shape {layout} when {cu_name} is None, got {shape}")
    return t.shape[0], t.shape[1]


def eager_when_traced(fn):
    """``fn``, whose calls run eagerly where dynamo traces them (a graph break): ``torch.compiler.disable``, applied
    at the traced call rather than at import, since it imports torch._dynamo, about a second that `import flashcute`
    and an eager process's first call would otherwise pay (docs/benchmarking.md, Host overhead)."""

    disabled = None  # fn under torch.compiler.disable, made at the first traced call and kept

    @functools.wraps(fn)
    def call(*args):
        nonlocal disabled
        if torch.compiler.is_compiling():  # (dynamo is imported by now)
            if disabled is None:
                disabled = torch.compiler.disable(fn)
            return disabled(*args)
        return fn(*args)

    return call


@eager_when_traced  # (the launch reads the pages where they lie, which no op schema carries)
def _paged_varlen(q, k, v, block_table, args, sequences, scalars, learnable_sink, alibi_slopes):
    """flash_attn_varlen_func's forward over a paged cache (``block_table``): its pages read where they lie, or
    gathered for a family that reads one packed tensor (kvcache.paged_keys)."""
    from flashcute.kvcache import paged_keys  # (kvcache imports this module)

    cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k = sequences
    counts = cu_seqlens_k[1:] - cu_seqlens_k[:-1] if seqused_k is None else seqused_k
    kernel = scalars[5]
    keys, values, cu_rows, pages = paged_keys(
        k, v, block_table, args.page_block_size, counts, None if kernel == "auto" else kernel
    )
    rows = (cu_seqlens_q, cu_rows, seqused_q, counts)
    return varlen_outputs(q, keys, values, *rows, *scalars, learnable_sink, alibi_slopes, pages=pages)


class PagedVarlenForward(torch.autograd.Function):
    """A paged forward (``_paged_varlen``) whose inputs require grad: it runs, as flash_attn's does, and its outputs
    carry a backward that raises, so that a loss through them fails where the gradient is asked for, not silently
    and not at the forward (flash_attn's tests, for one, run a paged forward on inputs that require grad)."""

    @staticmethod
    def forward(ctx, q, k, v, learnable_sink, block_table, args, sequences, scalars, alibi_slopes):
        return _paged_varlen(q, k, v, block_table, args, sequences, scalars, learnable_sink, alibi_slopes)

    @staticmethod
    def backward(ctx, dout, dlse):
        raise RuntimeError(
            "flash_attn_varlen_func with block_table (paged keys) has no backward, as in flash_attn: run the "
            "forward of a gradient step on contiguous keys (cu_seqlens_k rows of k and v)"
        )


@eager_when_traced  # (as _paged_varlen: an eager forward between traced regions)
def _paged_varlen_without_backward(q, k, v, block_table, args, sequences, scalars, learnable_sink, alibi_slopes):
    """``_paged_varlen``'s outputs for inputs that require grad (PagedVarlenForward)."""
    return PagedVarlenForward.apply(q, k, v, learnable_sink, block_table, args, sequences, scalars, alibi_slopes)


# The (device, dtype, head dims, window, kernel, cap, ALiBi, mode) of the packed calls whose backward kernels
# build_backward_ahead was started for (flash_attn_func's plans keep this per signature).
_varlen_backward_built: set[tuple] = set()


class FlashAttentionVarlen(torch.autograd.Function):
    """flash_attn_varlen_func's differentiable door, as FlashAttention is flash_attn_func's."""

    @staticmethod
    def forward(ctx, q, k, v, learnable_sink, alibi_slopes, sequences, options):
        """``sequences``: (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k); ``options``: max_seqlen_q,
        max_seqlen_k, softmax_scale, window_left, window_right, kernel, softcap, deterministic."""
        scalars, deterministic = options[:-1], options[-1]
        if torch.compiler.is_compiling():
            forward = _OPS.varlen_fwd.default
        else:
            forward = varlen_outputs
            ahead = (q.device, q.dtype, q.shape[-1], v.shape[-1], *scalars[3:], alibi_slopes is None, deterministic)
            if ahead not in _varlen_backward_built:  # the first differentiable call of its kind
                _varlen_backward_built.add(ahead)
                build_backward_ahead(q, v, *scalars[3:], alibi_slopes, deterministic, packed=True)
        out, lse = forward(q, k, v, *sequences, *scalars, learnable_sink, alibi_slopes)
        ctx.save_for_backward(q, k, v, out, lse, *sequences, learnable_sink, alibi_slopes)
        ctx.scalars = (*scalars[:5], deterministic, *scalars[5:])  # launch_varlen_bwd's order
        ctx.set_materialize_grads(False)  # (as FlashAttention's)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        *saved, learnable_sink, alibi_slopes = ctx.saved_tensors
        backward = _OPS.varlen_bwd.default if torch.compiler.is_compiling() else launch_varlen_bwd
        dout = torch.zeros_like(saved[3]) if dout is None else dout  # (saved[3]: out)
        dq, dk, dv, dsink = backward(dout, *saved, *ctx.scalars, learnable_sink, alibi_slopes, dlse)
        return dq, dk, dv, None if learnable_sink is None else dsink, None, None, None


_varlen_apply = eager_apply(FlashAttentionVarlen)


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    deterministic: bool = False,
    return_lse: bool = False,
    seqused_q: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    validate: bool = False,
    kernel: str | None = None,
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Exact attention over a packed batch of variable-length sequences, flash_attn's conventions; differentiable
    in q, k, v (and learnable_sink).

    q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim), nheads % nheads_k == 0. Sequence b is rows
    cu_seqlens_q[b] .. cu_seqlens_q[b + 1] of q and cu_seqlens_k[b] .. cu_seqlens_k[b + 1] of k and v (int32
    (batch + 1,) tensors on q's device, starting at 0); seqused_q / seqused_k (batch,) int32 limit each to its
    first tokens. max_seqlen_q / max_seqlen_k must be at least every sequence's length (they size the launch);
    None (flash-attn-4's default) takes the side's total rows, a launch sized for one sequence holding them all.
    Sequences of length 0 are allowed anywhere. causal, window_size, softcap, learnable_sink, alibi_slopes
    ((nheads,) or (batch, nheads), a row per sequence) and softmax_scale as in flash_attn_func, with each sequence's
    diagonal aligned bottom-right (key j of a sequence is aligned with its query i + seqlen_k - seqlen_q); v's head
    dim as in flash_attn_func (out takes it). Returns
    out (total_q, nheads, v's headdim) and, with return_lse, lse (nheads, total_q) float32; rows past a seqused_q get O
    = 0 and LSE = -inf. ``validate=True`` also checks the sequence tensors' values (a host sync: off by default so
    that the call stays asynchronous and graph-capturable).
    ``block_table`` (batch, max_num_blocks_per_seq) int32 (flash_attn's paged KV, inference only: inputs that
    require grad run the forward, and a backward through its outputs raises): k and v are a cache's pages
    (num_blocks, page_block_size, nheads_k, headdim), and sequence b's keys are its first cu_seqlens_k[b + 1] -
    cu_seqlens_k[b] positions (seqused_k[b] where given), position p in page block_table[b, p // page_block_size] at
    row p % page_block_size.
    Either side may be a dense batch instead (flash-attn-4's form): cu_seqlens_q None takes q as (batch, seqlen_q,
    nheads, headdim), every sequence seqlen_q rows (out then has q's layout and lse is (batch, nheads, seqlen_q));
    cu_seqlens_k None takes k and v as (batch, seqlen_k, nheads_k, headdim), or a paged cache's pages of
    block_table.shape[1] * page_block_size positions a sequence, each sequence's keys all of them or its
    seqused_k; a max_seqlen of None is then that side's length.
    """
    if cu_seqlens_q is None or cu_seqlens_k is None:
        options = {"softmax_scale": softmax_scale, "causal": causal, "window_size": window_size, "softcap": softcap}
        options |= {"deterministic": deterministic, "validate": validate, "kernel": kernel}
        options |= {"learnable_sink": learnable_sink, "alibi_slopes": alibi_slopes, "block_table": block_table}
        sides = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k)
        return _dense_sides(q, k, v, *sides, return_lse, options)
    args = validate_varlen_args(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        seqused_q,
        seqused_k,
        softmax_scale,
        causal,
        window_size,
        softcap,
        learnable_sink,
        alibi_slopes,
        block_table,
    )
    for name, flag in (("deterministic", deterministic), ("return_lse", return_lse), ("validate", validate)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    if kernel is not None and not isinstance(kernel, str):
        raise TypeError(f"kernel must be a str or None, got {kernel!r}")
    if q.dtype == torch.float32 and q.is_cuda and torch.is_autocast_enabled("cuda"):
        q, k, v = (t.to(torch.get_autocast_dtype("cuda")) for t in (q, k, v))
    q, k, v = (t[0] for t in validate_cuda_inputs(q[None], k[None], v[None], args))
    if pads_head_dims(args):
        sequences = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        options = {"causal": causal, "window_size": window_size, "softcap": softcap, "deterministic": deterministic}
        options |= {"seqused_q": seqused_q, "seqused_k": seqused_k, "validate": validate, "kernel": kernel}
        options |= {"learnable_sink": learnable_sink, "alibi_slopes": alibi_slopes, "block_table": block_table}
        return padded_call(flash_attn_varlen_func, q, k, v, return_lse, args.softmax_scale, *sequences, **options)
    if validate:
        validate_varlen_values(args, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
    span = args.max_seqlen_q + args.max_seqlen_k  # a window side this wide hides no key (kernel_window)
    window = tuple(-1 if side >= span else side for side in (args.window_left, args.window_right))
    sequences = (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
    scalars = (args.max_seqlen_q, args.max_seqlen_k, args.softmax_scale, *window, kernel or "auto", args.softcap)
    options = (*scalars, deterministic)
    sink, alibi = learnable_sink, alibi_slopes
    needs_grad = torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad or (sink is not None and sink.requires_grad)
    )
    if block_table is not None:
        paged = (q, k, v, block_table, args, sequences, scalars, sink, alibi)
        out, lse = _paged_varlen_without_backward(*paged) if needs_grad else _paged_varlen(*paged)
    elif needs_grad:
        apply = FlashAttentionVarlen.apply if torch.compiler.is_compiling() else _varlen_apply
        out, lse = apply(q, k, v, sink, alibi, sequences, options)
    elif torch.compiler.is_compiling():
        out, lse = _OPS.varlen_fwd.default(q, k, v, *sequences, *scalars, sink, alibi)
    else:
        out, lse = varlen_outputs(q, k, v, *sequences, *scalars, sink, alibi)
    return (out, lse) if return_lse else out
