"""The PyTorch boundary: validation, dispatch to a compiled kernel, and the torch.library custom op.

``flash_attn_func`` validates everything before any launch, picks the kernel for the device, and calls the
``flashcute::fwd`` custom op, which allocates the outputs and launches the compiled kernel on the current CUDA
stream. The op has a fake (meta) implementation, so it traces under torch.compile.
"""

from __future__ import annotations

import torch

from flashcute import compile_cache
from flashcute.config import FwdConfig, fwd_config
from flashcute.validation import AttentionArgs, validate_attention_args, validate_cuda_inputs

KERNELS = ("sm80",)


def device_arch(device: torch.device) -> str:
    """The CuTe DSL target for a CUDA device: sm_80, sm_86, sm_89, sm_90a, sm_100a, ..."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


def available_kernels(device: torch.device | None = None) -> list[str]:
    """Names of the flashcute kernels the given (default: current) CUDA device can run; [] without a GPU."""
    if not torch.cuda.is_available():
        return []
    major, _ = torch.cuda.get_device_capability(device)
    return ["sm80"] if major >= 8 else []


def _resolve_kernel(kernel: str | None, device: torch.device) -> str:
    available = available_kernels(device)
    if kernel is None or kernel == "auto":
        if not available:
            raise ValueError(
                f"no flashcute kernel runs on {torch.cuda.get_device_name(device)}: it needs sm_80 or newer"
            )
        return available[-1]
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {('auto', *KERNELS)} or None, got {kernel!r}")
    if kernel not in available:
        raise ValueError(
            f"kernel={kernel!r} cannot run on {torch.cuda.get_device_name(device)}; available: {available}"
        )
    return kernel


def _compiled_fwd(config: FwdConfig, arch: str):
    from flashcute.kernels.build import compile_fwd

    return compile_cache.get_compiled(arch, config, lambda: compile_fwd(config, arch))


def kernel_window(args: AttentionArgs) -> tuple[int, int]:
    """The window as the kernels take it: a side at least seqlen_q + seqlen_k wide hides no key, so it becomes
    -1 (unbounded). Same mask, and no int32 overflow in the kernel's index arithmetic for huge windows."""
    unbounded = args.seqlen_q + args.seqlen_k
    return tuple(-1 if side >= unbounded else side for side in (args.window_left, args.window_right))


@torch.library.custom_op("flashcute::fwd", mutates_args=())
def _fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    diag_offset: int,
    window_left: int,
    window_right: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seqlen_q, nheads, _ = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q.device)
    launch_fwd(q, k, v, out, lse, softmax_scale, diag_offset, window_left, window_right)
    return out, lse


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
) -> None:
    """Launch the forward kernel into given outputs (validated inputs only; tests use it to poison outputs)."""
    config = fwd_config(
        q.shape[-1], str(q.dtype).removeprefix("torch."), window_left=window_left, window_right=window_right
    )
    with torch.cuda.device(q.device):
        kernel = _compiled_fwd(config, device_arch(q.device))
        kernel(q, k, v, out, lse, softmax_scale, diag_offset, window_left, window_right)


@_fwd.register_fake
def _fwd_fake(q, k, v, softmax_scale, diag_offset, window_left, window_right):
    batch, seqlen_q, nheads, _ = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
    return out, lse


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
    """Exact attention, FlashAttention-style, for CUDA fp16/bf16 tensors.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim), nheads % nheads_k == 0.
    softmax_scale defaults to 1/sqrt(headdim). causal=True masks keys j > i + seqlen_k - seqlen_q (bottom-right,
    flash_attn's convention) or, with causal_align="top_left", keys j > i (the seed's rule). window_size=(left,
    right) keeps keys within [i + offset - left, i + offset + right]; -1 means unbounded. A query that sees no key
    gets O = 0 and LSE = -inf. Returns out (batch, seqlen_q, nheads, headdim), and with return_lse also
    lse (batch, nheads, seqlen_q), float32, natural log. The forward pass is deterministic whatever
    ``deterministic`` says (the flag is for the backward pass). ``kernel`` picks a kernel by name (see
    ``available_kernels``); the default picks the fastest one for the device.
    """
    args = validate_attention_args(q, k, v, softmax_scale, causal, causal_align, window_size, softcap)
    q, k, v = validate_cuda_inputs(q, k, v, args)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {deterministic!r}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {return_lse!r}")
    _resolve_kernel(kernel, q.device)
    window_left, window_right = kernel_window(args)
    out, lse = _fwd(q, k, v, args.softmax_scale, args.diagonal_offset, window_left, window_right)
    return (out, lse) if return_lse else out
