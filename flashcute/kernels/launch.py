"""Host-side steps every family's launch contract shares: the device's target, the compiled kernel for a config
(from the compile cache), and a launch on the right device. Nothing here names a family."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from flashcute import compile_cache


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def device_index(device: torch.device | str | int | None) -> int:
    """A CUDA device's index (None or one without an index: the current device's)."""
    if isinstance(device, torch.device) and device.type == "cuda" and device.index is not None:
        return device.index  # (a tensor's device: skips torch's general resolution, a microsecond a launch)
    return torch.cuda._utils._get_device_index(device, optional=True)


def capability(device: torch.device | None) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device (default: the current one)."""
    return _capability(device_index(device))


def device_arch(device: torch.device) -> str:
    """The CuTe DSL target for a CUDA device: sm_80, sm_86, sm_89, sm_90a, sm_100a, ..."""
    major, minor = capability(device)
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device: a persistent kernel's grid size."""
    return _num_sms(device_index(device))


_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


def dtype_name(t: torch.Tensor) -> str:
    """A tensor's dtype as configs name it: "float16", "bfloat16", "float32"."""
    return _DTYPE_NAMES.get(t.dtype) or str(t.dtype).removeprefix("torch.")


# The kernels launches have asked for, by (device, config): a launch's one dict lookup, where the device's target
# and the compile cache's key took a few microseconds on the GPU host (three times a backward).
_by_device: dict[tuple, Callable] = {}


def compiled(config, device: torch.device, compile: Callable) -> Callable:
    """The compiled kernel for ``config`` on ``device``'s target, from the compile cache (``compile(config, arch)``
    builds it on a miss)."""
    kernel = _by_device.get((device, config))
    if kernel is None:
        arch = device_arch(device)
        kernel = compile_cache.get_compiled(arch, config, functools.partial(compile, config, arch))
        if device.index is not None:  # (without one, the current device's, which may change)
            _by_device[(device, config)] = kernel
    return kernel


# The packed-batch arguments (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k) of a
# dense call: every attention kernel takes them behind its other arguments (kernels/common/seqlen.py).
DENSE = (None,) * 6


def run_on_device(device: torch.device, kernel: Callable, *args) -> None:
    """Call a compiled kernel with ``device`` current: TVM-FFI launches on the current device's current stream."""
    if device.index == torch._C._cuda_getDevice():  # (torch.cuda.current_device() without its checks)
        kernel(*args)
    else:
        with torch.cuda.device(device):
            kernel(*args)
