"""Which kernel families run on a device, fastest first: the only place that maps a GPU to code.

A family is a folder under kernels/ with a ``family`` module that provides NAME, ARCHS (the targets it is built for
without a GPU), ``runs_on(capability)``, ``compile(config, arch, dump_dir)``, ``variants(arch,
dtypes, buckets, masks, exact_only)``, ``forward_launcher(device, dtype, head_dim, window_left, window_right,
packed, softcap=False, sink=False, alibi=False[, head_dim_v][, page_size])`` (a ``launch(q, k, v, out, lse,
softmax_scale, diag_offset[, packed_args, softcap, sink, alibi][, pages])``; head_dim_v, v's head dim where it is
not q's, only where ``supports_forward(head_dim, head_dim_v)``; page_size, a packed forward over a cache's pages
where they lie, only where ``reads_pages(page_size)``), ``supports_backward(head_dim, deterministic, packed,
head_dim_v=None)`` and ``backward(..., deterministic, packed_args, softcap, alibi)``
(returning dq, dk, dv and D = rowsum(dO * O), (batch, nheads, rows >= seqlen_q) float32, 0 past seqlen_q).
Adding a family is one folder and one line in FAMILIES.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from flashcute.kernels.common.limits import DTYPES, HEAD_DIM_BUCKETS

if TYPE_CHECKING:
    import torch

# Fastest first: a device runs the first family whose runs_on accepts it, unless the caller names another.
FAMILIES = ("sm90", "sm80")
# (window_left, window_right) pairs that reach each mask variant: none, causal, sliding window, left-only window
MASK_VARIANTS = ((-1, -1), (-1, 0), (8, 8), (8, -1))


def family_name(name: str) -> str:
    """``name`` if it names a family (an argparse type: a ValueError names the families otherwise)."""
    if name not in FAMILIES:
        raise ValueError(f"{name!r} is not one of the kernel families {', '.join(FAMILIES)}")
    return name


def family(name: str) -> ModuleType:
    """A family's launch contract by name."""
    if name not in FAMILIES:
        raise ValueError(f"kernel must be one of {FAMILIES} or None, got {name!r}")
    return importlib.import_module(f"flashcute.kernels.{name}.family")


def families() -> list[ModuleType]:
    return [family(name) for name in FAMILIES]


def available(device: torch.device | None = None) -> list[str]:
    """Names of the families the given (default: current) CUDA device runs, fastest first; [] without a GPU."""
    import torch

    from flashcute.kernels.launch import capability

    if not torch.cuda.is_available():
        return []
    cap = capability(device)
    return [f.NAME for f in families() if f.runs_on(cap)]


def pick(device: torch.device, kernel: str | None = None) -> list[ModuleType]:
    """The families to try on ``device``, in order: from ``kernel`` (a name; None: the fastest) on. Raises a
    ValueError naming the device when none runs there or ``kernel`` does not."""
    import torch

    if kernel is not None:
        family(kernel)  # a clear error for an unknown name
    names = available(device)
    if not names:
        raise ValueError(f"no flashcute kernel runs on {torch.cuda.get_device_name(device)}: it needs sm_80 or newer")
    if kernel is not None and kernel not in names:
        raise ValueError(f"kernel={kernel!r} cannot run on {torch.cuda.get_device_name(device)}; available: {names}")
    return [family(name) for name in names[names.index(kernel) if kernel else 0 :]]


# Decisions a call would otherwise take again: which family, config and compiled kernel serve a (device, dtype,
# head dim, window, kernel) key. Both hold a handful of entries, one per kind of call a program makes.
_forward_launchers: dict[tuple, object] = {}
_backward_families: dict[tuple, ModuleType] = {}


def forward_launcher(
    device: torch.device,
    dtype: str,
    head_dim: int,
    window_left: int,
    window_right: int,
    kernel: str | None,
    packed: bool = False,
    softcap: bool = False,
    sink: bool = False,
    alibi: bool = False,
    head_dim_v: int | None = None,
    page_size: int = 0,
):
    """The first family's (from ``kernel`` on; None: the fastest) ``forward_launcher`` for these, made once;
    ``head_dim_v``: v's head dim where it is not q's, which only the families whose supports_forward takes it
    run; ``page_size``: k and v are the pages of a cache (reads_pages must have said the family reads them)."""
    head_dim_v = None if head_dim_v == head_dim else head_dim_v
    key = (device, dtype, head_dim, window_left, window_right, kernel, packed, softcap, sink, alibi, head_dim_v)
    key += (page_size,)
    launch = _forward_launchers.get(key)
    if launch is None:
        window = (window_left, window_right)
        scores = {"softcap": softcap, "sink": sink, "alibi": alibi, "head_dim_v": head_dim_v}
        if page_size:
            scores["page_size"] = page_size
        launch = _forward_family(device, kernel, head_dim, head_dim_v).forward_launcher(
            device, dtype, head_dim, *window, packed, **scores
        )
        _forward_launchers[key] = launch
    return launch


def _forward_family(device: torch.device, kernel: str | None, head_dim: int, head_dim_v: int | None) -> ModuleType:
    """The first family from ``kernel`` on whose forward takes these head dims."""
    return next(f for f in pick(device, kernel) if f.supports_forward(head_dim, head_dim_v or head_dim))


def reads_pages(device: torch.device, kernel: str | None, head_dim: int, head_dim_v: int, page_size: int) -> bool:
    """Whether the family that forward_launcher picks reads K and V from a cache's pages of ``page_size`` rows
    where they lie (its reads_pages), or needs them gathered into one tensor first."""
    return _forward_family(device, kernel, head_dim, None if head_dim_v == head_dim else head_dim_v).reads_pages(
        page_size
    )


def forward_once(
    name: str, q, k, v, out, lse, softmax_scale: float, diag_offset: int, window_left: int, window_right: int, **how
) -> None:
    """One forward of family ``name`` into given outputs, through a launcher made for it alone (tests, tuning:
    ``how`` takes the launcher's config, and for the Hopper family its grid)."""
    from flashcute.kernels.launch import dtype_name

    launch = family(name).forward_launcher(q.device, dtype_name(q), q.shape[-1], window_left, window_right, **how)
    launch(q, k, v, out, lse, softmax_scale, diag_offset)


def backward_family(
    device: torch.device,
    kernel: str | None,
    head_dim: int,
    deterministic: bool,
    packed: bool = False,
    head_dim_v: int | None = None,
) -> ModuleType:
    """The first family from ``kernel`` on whose backward covers this head dim, mode and batch layout, and
    ``head_dim_v``, v's head dim where it is not q's."""
    head_dim_v = None if head_dim_v == head_dim else head_dim_v
    key = (device, kernel, head_dim, deterministic, packed, head_dim_v)
    found = _backward_families.get(key)
    if found is None:
        call = (head_dim, deterministic, packed)
        found = next(f for f in pick(device, kernel) if f.supports_backward(*call, head_dim_v=head_dim_v))
        _backward_families[key] = found
    return found


def compile_any(config, arch: str, dump_dir=None):
    """Compile whichever kernel ``config`` configures, a family's or a shared one: by the build module beside the
    module of its config class (a family's config.py -> its build.py; the shared kernels' prepost_config.py ->
    prepost_build.py). Neither imports torch, so a process that only builds kernels goes without it
    (compile_worker.py)."""
    module = type(config).__module__
    if not module.endswith("config"):
        raise TypeError(f"no kernel is configured by a {type(config).__name__}")
    return importlib.import_module(module.removesuffix("config") + "build").compile(config, arch, dump_dir)


def variants(
    arch: str, exact_only: bool = False, dtypes=DTYPES, buckets=HEAD_DIM_BUCKETS, masks=MASK_VARIANTS
) -> dict[str, list]:
    """Every config the heuristics pick on target ``arch``, by "<family>-<kind>" (and "prepost"), in order."""
    from flashcute.kernels.common import prepost

    found = {}
    for f in families():
        for kind, configs in f.variants(arch, dtypes, buckets, masks, exact_only).items():
            if configs:
                found[f"{f.NAME}-{kind}"] = list(dict.fromkeys(configs))
    found["prepost"] = prepost.variants(dtypes, buckets, exact_only)
    return found
