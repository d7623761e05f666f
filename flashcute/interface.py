"""The PyTorch boundary: validation, dispatch to a compiled kernel, the torch.library custom ops and autograd.

``flash_attn_func`` validates everything before any launch, then allocates the outputs and launches the compiled
kernel on the current CUDA stream through one of two doors to the same launch functions. Under ``torch.compile``
it calls the ``flashcute::fwd`` custom op, whose gradient ``flashcute::bwd`` is registered with
``register_autograd``; both ops have fake (meta) implementations, so a model using them traces with
``fullgraph=True``. In eager mode it calls ``FlashAttention``, a
``torch.autograd.Function``, since the custom op's dispatch costs several times its host time a call (EAGER_NOTE).
"""

from __future__ import annotations

import functools
import math

import torch

from flashcute import compile_cache
from flashcute.config import (
    bwd_config,
    bwd_post_config,
    bwd_pre_config,
    dq_config,
    fwd_config,
    sm90_bwd_config,
    sm90_bwd_supports,
    sm90_fwd_config,
)
from flashcute.validation import AttentionArgs, validate_attention_args, validate_cuda_inputs, validate_pointers

KERNELS = ("sm80", "sm90")


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_arch(device: torch.device) -> str:
    """The CuTe DSL target for a CUDA device: sm_80, sm_86, sm_89, sm_90a, sm_100a, ..."""
    major, minor = _capability(torch.cuda._utils._get_device_index(device, optional=True))
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


def available_kernels(device: torch.device | None = None) -> list[str]:
    """Names of the flashcute kernels the given (default: current) CUDA device can run, fastest first ("auto"
    picks the first); [] without a GPU. The sm90 kernel (TMA, wgmma) runs on sm_90 only; the sm80 kernel
    (mma.sync) on sm_80 and newer."""
    if not torch.cuda.is_available():
        return []
    major, _ = _capability(torch.cuda._utils._get_device_index(device, optional=True))
    return (["sm90"] if major == 9 else []) + (["sm80"] if major >= 8 else [])


def _check_kernel(kernel: str, device: torch.device) -> None:
    """Raise unless ``kernel`` ("auto" or a name from KERNELS) can run on ``device``."""
    if kernel != "auto" and kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {('auto', *KERNELS)} or None, got {kernel!r}")
    available = available_kernels(device)
    if kernel == "auto" and not available:
        raise ValueError(f"no flashcute kernel runs on {torch.cuda.get_device_name(device)}: it needs sm_80 or newer")
    if kernel != "auto" and kernel not in available:
        raise ValueError(
            f"kernel={kernel!r} cannot run on {torch.cuda.get_device_name(device)}; available: {available}"
        )


def kernel_window(args: AttentionArgs) -> tuple[int, int]:
    """The window as the kernels take it: a side at least seqlen_q + seqlen_k wide hides no key, so it becomes
    -1 (unbounded). Same mask, and no int32 overflow in the kernel's index arithmetic for huge windows."""
    unbounded = args.seqlen_q + args.seqlen_k
    return tuple(-1 if side >= unbounded else side for side in (args.window_left, args.window_right))


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _run_on_device(device: torch.device, kernel, *args) -> None:
    """Call a compiled kernel with ``device`` current: TVM-FFI launches on the current device's current stream."""
    if device.index == torch.cuda.current_device():
        kernel(*args)
    else:
        with torch.cuda.device(device):
            kernel(*args)


def tma_addressable(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the Hopper kernels' TMA tensor maps can describe it: a broadcast dim (stride 0, size > 1) is
    materialized (a copy), and a size-1 dim with stride 0 gets the contiguous stride (a view). Other layouts are
    returned as they are."""
    if any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape, strict=True)):
        t = t.contiguous()
    if 0 in t.stride():
        strides = [stride or math.prod(t.shape[dim + 1 :]) for dim, stride in enumerate(t.stride())]
        t = t.as_strided(t.shape, strides)
    return t


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
) -> None:
    """Launch a forward kernel ("auto": the fastest available) into given outputs (validated inputs only; tests
    use it to poison outputs)."""
    from flashcute.kernels.build import compile_fwd

    _check_kernel(kernel, q.device)
    validate_pointers(q=q, k=k, v=v)
    name = available_kernels(q.device)[0] if kernel == "auto" else kernel
    if name == "sm90":
        q, k, v = (tma_addressable(t) for t in (q, k, v))
    arch = device_arch(q.device)
    masks = {"window_left": window_left, "window_right": window_right}
    if name == "sm90":
        config = sm90_fwd_config(q.shape[-1], _dtype_name(q), **masks)
    else:
        config = fwd_config(q.shape[-1], _dtype_name(q), **masks, arch=arch)
    kernel = compile_cache.get_compiled(arch, config, functools.partial(compile_fwd, config, arch))
    tensors, scalars = (q, k, v, out, lse), (softmax_scale, diag_offset, window_left, window_right)
    if name == "sm90":
        counter = torch.zeros(1, dtype=torch.int32, device=q.device) if config.claim_tiles else None
        tensors += (counter,)
        scalars += (
            config.grid_limit(k.shape[1], _num_sms(torch.cuda._utils._get_device_index(q.device, optional=True))),
        )
    _run_on_device(q.device, kernel, *tensors, *scalars)


def _compiled(config, device: torch.device):
    """The compiled kernel for ``config`` on ``device``'s architecture (from the compile cache)."""
    from flashcute.kernels.build import compile_kernel

    arch = device_arch(device)
    return compile_cache.get_compiled(arch, config, functools.partial(compile_kernel, config, arch))


def launch_bwd_preprocess(
    dout: torch.Tensor, out: torch.Tensor, delta: torch.Tensor, dq_accum: torch.Tensor | None = None
) -> None:
    """The backward's preprocess, into given outputs (validated inputs only): ``delta`` (batch, nheads,
    seqlen_q) float32, unit last stride, gets D = rowsum(dO * O) summed in float32, and ``dq_accum`` (float32,
    shaped like ``out``), when given, is zeroed in the same launch for the dQ atomics."""
    config = bwd_pre_config(out.shape[-1], _dtype_name(out), clear_dq_accum=dq_accum is not None)
    _run_on_device(out.device, _compiled(config, out.device), out, dout, delta, dq_accum)


def launch_bwd_postprocess(dq_accum: torch.Tensor, dq: torch.Tensor, softmax_scale: float) -> None:
    """The backward's postprocess, into a given output: dq = dq_accum * softmax_scale in dq's dtype."""
    config = bwd_post_config(dq.shape[-1], _dtype_name(dq))
    _run_on_device(dq.device, _compiled(config, dq.device), dq_accum, dq, softmax_scale)


def launch_bwd(
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward pass; returns (dq, dk, dv) shaped like q, k, v.

    Preprocess D = rowsum(dO * O); the dK/dV kernel; dQ either from the same kernel's fp32 atomics (or TMA
    reduce-adds) into a buffer the preprocess zeroes, then scaled and cast by the postprocess (default), or,
    deterministic, from the dQ kernel, which adds in a fixed order. ``kernel`` as in launch_fwd: "sm90" (the
    default on sm_90) runs the Hopper backward at the head dims it has tiles for (buckets 64 and 128) unless
    ``deterministic``; everything else runs the sm80 kernels.
    """
    _check_kernel(kernel, q.device)
    if dout.stride(-1) != 1 or any(s % 8 for s in dout.stride()[:-1]) or dout.data_ptr() % 16:
        dout = dout.contiguous()
    validate_pointers(q=q, k=k, v=v, out=out, dout=dout)
    batch, seqlen_q, nheads, head_dim = q.shape
    dtype = _dtype_name(q)
    window = {"window_left": window_left, "window_right": window_right}
    name = available_kernels(q.device)[0] if kernel == "auto" else kernel
    sm90 = name == "sm90" and not deterministic and sm90_bwd_supports(head_dim)
    if sm90:
        config = sm90_bwd_config(head_dim, dtype, **window)
    else:
        config = bwd_config(head_dim, dtype, deterministic=deterministic, **window)
    # The Hopper kernel bulk-copies D (and LSE) a whole Q tile at a time: rows up to the last tile's end.
    rows = -(-seqlen_q // config.block_m) * config.block_m if sm90 else seqlen_q
    delta = torch.empty((batch, nheads, rows), dtype=torch.float32, device=q.device)
    dq_accum = None if deterministic else torch.empty(q.shape, dtype=torch.float32, device=q.device)
    launch_bwd_preprocess(dout, out, delta[..., :seqlen_q], dq_accum)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    scalars = (softmax_scale, diag_offset, window_left, window_right)
    if sm90:
        q, k, v, dout = (tma_addressable(t) for t in (q, k, v, dout))
        # past seqlen_q, and where a row saw no key (LSE = -inf): LSE * log2(e) = +inf, so P = 0; D = 0
        delta[..., seqlen_q:] = 0.0
        lse_log2 = torch.full((batch, nheads, rows), math.inf, dtype=torch.float32, device=q.device)
        lse_log2[..., :seqlen_q] = torch.where(lse == -math.inf, math.inf, lse * math.log2(math.e))
        tensors = (q, k, v, dout, lse_log2, delta, dq_accum, dk, dv)
        _run_on_device(q.device, _compiled(config, q.device), *tensors, *scalars)
        launch_bwd_postprocess(dq_accum, dq, 1.0)  # the kernel has applied softmax_scale
        return dq, dk, dv
    _run_on_device(q.device, _compiled(config, q.device), q, k, v, dout, lse, delta, dq_accum, dk, dv, *scalars)
    if deterministic:
        dq_kernel = _compiled(dq_config(head_dim, dtype, **window), q.device)
        _run_on_device(q.device, dq_kernel, q, k, v, dout, lse, delta, dq, *scalars)
    else:
        launch_bwd_postprocess(dq_accum, dq, softmax_scale)
    return dq, dk, dv


def forward_outputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *options) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse), newly allocated, from the forward kernel (validated inputs only); ``options`` are launch_fwd's
    after lse: softmax_scale, diag_offset, window_left, window_right, kernel."""
    batch, seqlen_q, nheads, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q.device)
    launch_fwd(q, k, v, out, lse, *options)
    return out, lse


@torch.library.custom_op("flashcute::fwd", mutates_args=())
def _fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    diag_offset: int,
    window_left: int,
    window_right: int,
    kernel: str,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    return forward_outputs(q, k, v, softmax_scale, diag_offset, window_left, window_right, kernel)


@_fwd.register_fake
def _fwd_fake(q, k, v, softmax_scale, diag_offset, window_left, window_right, kernel, deterministic):
    batch, seqlen_q, nheads, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)


@torch.library.custom_op("flashcute::bwd", mutates_args=())
def _bwd(
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
    kernel: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_bwd(
        dout, q, k, v, out, lse, softmax_scale, diag_offset, window_left, window_right, deterministic, kernel
    )


@_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, softmax_scale, diag_offset, window_left, window_right, deterministic, kernel):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, softmax_scale, diag_offset, window_left, window_right, kernel, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.scalars = (softmax_scale, diag_offset, window_left, window_right, deterministic, kernel)
    ctx.mark_non_differentiable(lse)  # as in flash_attn: LSE is returned for inspection, not differentiated


def _backward_through(bwd):
    """The backward formula of both doors, given how it reaches launch_bwd (the custom op, or directly)."""

    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = bwd(dout, q, k, v, out, lse, *ctx.scalars)
        return dq, dk, dv, None, None, None, None, None, None

    return backward


_fwd.register_autograd(_backward_through(_bwd), setup_context=_setup_context)

# EAGER_NOTE: host time a call on this project's CPU machine (torch 2.13, stand-ins that only allocate the two
# outputs, best of five runs of 5000 calls), with q needing grad / not: torch.library's custom op 49 / 16 us, an
# autograd.Function that saves its context in forward 11 / 9 us, one with a separate setup_context 37 / 35 us (it
# goes through functorch's machinery), the allocations alone 3 us. On the H200 host the whole forward call took
# 109-174 us against flash-attn-4's 95-139 (docs/perf-notes.md), about as long as the shortest benchmark kernels
# run (bf16 D=128 causal at 1k: about 160 us), where a slower host then sets the pace. So eager calls take the
# autograd.Function, and torch.compile the op (torch.func transforms work with neither, nor did they before).


class FlashAttention(torch.autograd.Function):
    """flash_attn_func's eager door: the custom op's forward and backward without its dispatch (EAGER_NOTE)."""

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, diag_offset, window_left, window_right, kernel, deterministic):
        inputs = (q, k, v, softmax_scale, diag_offset, window_left, window_right, kernel, deterministic)
        outputs = forward_outputs(*inputs[:-1])
        _setup_context(ctx, inputs, outputs)
        return outputs

    backward = staticmethod(_backward_through(launch_bwd))


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
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Exact attention, FlashAttention-style, for CUDA fp16/bf16 tensors; differentiable in q, k and v.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim), nheads % nheads_k == 0.
    softmax_scale defaults to 1/sqrt(headdim). causal=True masks keys j > i + seqlen_k - seqlen_q (bottom-right,
    flash_attn's convention) or, with causal_align="top_left", keys j > i (the seed's rule). window_size=(left,
    right) keeps keys within [i + offset - left, i + offset + right]; -1 means unbounded. A query that sees no key
    gets O = 0 and LSE = -inf. Returns out (batch, seqlen_q, nheads, headdim), and with return_lse also
    lse (batch, nheads, seqlen_q), float32, natural log (not differentiable). The backward adds dQ with fp32
    atomics by default; ``deterministic=True`` computes dQ in a separate kernel that adds in a fixed order, so
    gradients are bitwise reproducible (slower). The forward is deterministic either way.
    ``kernel`` picks a kernel by name (see ``available_kernels``); the default picks the fastest for the device.
    Under ``torch.autocast("cuda")`` float32 inputs are cast to the autocast dtype.
    """
    args = validate_attention_args(q, k, v, softmax_scale, causal, causal_align, window_size, softcap)
    for name, flag in (("deterministic", deterministic), ("return_lse", return_lse)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    if q.dtype == torch.float32 and q.is_cuda and torch.is_autocast_enabled("cuda"):
        q, k, v = (t.to(torch.get_autocast_dtype("cuda")) for t in (q, k, v))  # the op is no autocast-aware op
    q, k, v = validate_cuda_inputs(q, k, v, args)
    if kernel is not None and not isinstance(kernel, str):
        raise TypeError(f"kernel must be a str or None, got {kernel!r}")
    window_left, window_right = kernel_window(args)
    door = _fwd if torch.compiler.is_compiling() else FlashAttention.apply
    out, lse = door(
        q, k, v, args.softmax_scale, args.diagonal_offset, window_left, window_right, kernel or "auto", deterministic
    )
    return (out, lse) if return_lse else out
