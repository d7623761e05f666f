"""Argument validation: the one place where attention arguments are checked and resolved.

Every public entry point (the CUDA kernels, the float64 reference, the tiled CPU reference) calls
`validate_attention_args` before doing any work. It only needs `.shape` from q, k and v, so it accepts torch tensors
and numpy arrays alike (including object arrays of `fractions.Fraction`). Each error names the argument, the value
given and what is allowed.

Layout: q is (batch, seqlen_q, nheads, headdim); k and v are (batch, seqlen_k, nheads_k, headdim), with nheads a
multiple of nheads_k (grouped-query attention: query head h reads kv head h // (nheads // nheads_k)).
Every size must be at least 1: empty batches and empty sequences are rejected, so no kernel is ever launched on an
empty problem.

Masking (the specification): with offset = seqlen_k - seqlen_q for causal_align="bottom_right" (flash_attn >= 2.1)
or offset = 0 for "top_left" (the seed article's rule j <= i), query i sees key j iff

    (window_left < 0 or j >= i + offset - window_left) and (window_right < 0 or j <= i + offset + window_right)

causal=True is window_right = 0 (window_left is kept as given), exactly as in flash_attn.
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass
from typing import Any

CAUSAL_ALIGNS = ("bottom_right", "top_left")
Q_DIMS = ("batch", "seqlen_q", "nheads", "headdim")
KV_DIMS = ("batch", "seqlen_k", "nheads_k", "headdim")


@dataclass(frozen=True)
class AttentionArgs:
    """Validated, resolved attention arguments: sizes, the scale and the mask window.

    softmax_scale is resolved (None became 1/sqrt(headdim)); causal is already folded into window_right = 0.
    """

    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_k: int
    headdim: int
    softmax_scale: float
    causal: bool
    causal_align: str
    window_left: int
    window_right: int
    softcap: float

    @property
    def has_mask(self) -> bool:
        """True when a causal or sliding-window mask hides some keys from some queries."""
        return self.window_left >= 0 or self.window_right >= 0

    @property
    def diagonal_offset(self) -> int:
        """The key aligned with query i is key i + offset: seqlen_k - seqlen_q (bottom_right) or 0 (top_left)."""
        return self.seqlen_k - self.seqlen_q if self.causal_align == "bottom_right" else 0

    @property
    def qheads_per_kvhead(self) -> int:
        """Query heads sharing one kv head (GQA group size): query head h reads kv head h // qheads_per_kvhead."""
        return self.nheads // self.nheads_k


def validate_attention_args(
    q: Any,
    k: Any,
    v: Any,
    softmax_scale: float | None = None,
    causal: bool = False,
    causal_align: str = "bottom_right",
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> AttentionArgs:
    """Check q, k, v shapes and the attention options; return them resolved as `AttentionArgs`.

    Raises TypeError for a value of the wrong type and ValueError for a value out of range.
    """
    (batch, seqlen_q, nheads, headdim), (_, seqlen_k, nheads_k, _) = _check_shapes(q, k, v)
    window_left, window_right = _check_window(window_size)
    return AttentionArgs(
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
        nheads=nheads,
        nheads_k=nheads_k,
        headdim=headdim,
        softmax_scale=_check_scale(softmax_scale, headdim),
        causal=_check_causal(causal),
        causal_align=_check_causal_align(causal_align),
        window_left=window_left,
        window_right=0 if causal else window_right,
        softcap=_check_softcap(softcap),
    )


@dataclass(frozen=True)
class VarlenArgs:
    """Validated, resolved arguments of a packed variable-length batch (flash_attn_varlen_func).

    Sequence b's queries are rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q, its keys the same rows of k and v
    by cu_seqlens_k; only the first seqused_q[b] / seqused_k[b] of them count where those are given. Masks align
    each sequence's diagonal bottom-right (flash_attn's convention): offset = its seqlen_k - its seqlen_q.
    """

    batch: int
    total_q: int
    total_k: int
    max_seqlen_q: int
    max_seqlen_k: int
    nheads: int
    nheads_k: int
    headdim: int
    softmax_scale: float
    causal: bool
    window_left: int
    window_right: int
    softcap: float


VARLEN_Q_DIMS = ("total_q", "nheads", "headdim")
VARLEN_KV_DIMS = ("total_k", "nheads_k", "headdim")


def validate_varlen_args(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: Any,
    max_seqlen_k: Any,
    seqused_q: Any = None,
    seqused_k: Any = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> VarlenArgs:
    """Check a packed batch's shapes, sequence tensors and options without reading device memory (no host sync);
    `validate_varlen_values` checks the values of the sequence tensors. Raises TypeError / ValueError naming the
    argument, the value given and what is allowed."""
    total_q, nheads, headdim = _packed_shape("q", q, VARLEN_Q_DIMS)
    total_k, nheads_k, _ = k_shape = _packed_shape("k", k, VARLEN_KV_DIMS)
    v_shape = _packed_shape("v", v, VARLEN_KV_DIMS)
    if v_shape != k_shape:
        raise ValueError(f"v must have the same shape as k, {k_shape}, got shape {v_shape}")
    if k_shape[2] != headdim:
        raise ValueError(f"k headdim (k.shape[2]) must equal q's ({headdim}), got {k_shape[2]}")
    if nheads % nheads_k != 0:
        raise ValueError(
            f"k nheads_k (k.shape[1]) must divide q's nheads ({nheads}) for grouped-query attention, got {nheads_k}"
        )
    batch = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q)
    if _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q) != batch:
        raise ValueError(
            f"cu_seqlens_k must have as many entries as cu_seqlens_q ({batch + 1}), got {tuple(cu_seqlens_k.shape)}"
        )
    for name, used in (("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        if used is not None:
            _check_int32_vector(name, used, q, batch, "(batch,)")
    window_left, window_right = _check_window(window_size)
    return VarlenArgs(
        batch=batch,
        total_q=total_q,
        total_k=total_k,
        max_seqlen_q=_check_max_seqlen("max_seqlen_q", max_seqlen_q),
        max_seqlen_k=_check_max_seqlen("max_seqlen_k", max_seqlen_k),
        nheads=nheads,
        nheads_k=nheads_k,
        headdim=headdim,
        softmax_scale=_check_scale(softmax_scale, headdim),
        causal=_check_causal(causal),
        window_left=window_left,
        window_right=0 if causal else window_right,
        softcap=_check_softcap(softcap),
    )


def validate_varlen_values(args: VarlenArgs, cu_seqlens_q: Any, cu_seqlens_k: Any, seqused_q: Any, seqused_k: Any):
    """The checks that read the sequence tensors (one host sync): cu_seqlens start at 0, never decrease and end at
    the packed tensors' totals; seqused within each sequence; max_seqlen at least every length that counts."""
    for name, cu, total, used, used_name, longest, longest_name in (
        ("cu_seqlens_q", cu_seqlens_q, args.total_q, seqused_q, "seqused_q", args.max_seqlen_q, "max_seqlen_q"),
        ("cu_seqlens_k", cu_seqlens_k, args.total_k, seqused_k, "seqused_k", args.max_seqlen_k, "max_seqlen_k"),
    ):
        values = cu.tolist()
        if values[0] != 0:
            raise ValueError(f"{name}[0] must be 0, got {values[0]}")
        lengths = [end - start for start, end in itertools.pairwise(values)]
        if min(lengths, default=0) < 0:
            b = next(b for b, n in enumerate(lengths) if n < 0)
            raise ValueError(
                f"{name} must not decrease, got {name}[{b}] = {values[b]} > {name}[{b + 1}] = {values[b + 1]}"
            )
        if values[-1] != total:
            raise ValueError(f"{name}[-1] ({values[-1]}) must equal the packed tensor's total rows ({total})")
        if used is not None:
            counted = used.tolist()
            for b, (n, u) in enumerate(zip(lengths, counted, strict=True)):
                if not 0 <= u <= n:
                    raise ValueError(f"{used_name}[{b}] must be in [0, {n}] (its sequence's length), got {u}")
            lengths = counted
        if max(lengths, default=0) > longest:
            b = lengths.index(max(lengths))
            raise ValueError(f"{longest_name} ({longest}) is smaller than sequence {b}'s length {lengths[b]}")


def _packed_shape(name: str, x: Any, dims: tuple[str, ...]) -> tuple[int, ...]:
    if not hasattr(x, "shape"):
        raise TypeError(f"{name} must be a tensor ({', '.join(dims)}), got {type(x).__name__}")
    shape = tuple(int(size) for size in x.shape)
    if len(shape) != len(dims):
        layout = f"({', '.join(dims)})"
        raise ValueError(f"{name} must have 3 dimensions {layout}, got shape {shape} ({len(shape)} dimensions)")
    if min(shape[1:]) < 1:
        dim = 1 if shape[1] < 1 else 2
        raise ValueError(f"{name}.shape[{dim}] ({dims[dim]}) must be >= 1, got {shape[dim]}")
    return shape


def _check_int32_vector(name: str, t: Any, q: Any, size: int | None, layout: str) -> int:
    """``t``'s length, after checking it is a contiguous int32 vector on q's device of ``size`` entries (None: at
    least one)."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be an int32 torch.Tensor {layout}, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype int32, got {t.dtype}")
    if t.device != q.device:
        raise ValueError(f"{name} must be on q's device ({q.device}), got {t.device}")
    if t.dim() != 1 or (t.shape[0] != size if size is not None else t.shape[0] < 1):
        wanted = f"{layout} = ({size},)" if size is not None else f"{layout} with at least one entry"
        raise ValueError(f"{name} must have shape {wanted}, got {tuple(t.shape)}")
    if t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous, got stride {t.stride(0)}")
    return t.shape[0]


def _check_cu_seqlens(name: str, t: Any, q: Any) -> int:
    """The batch size that ``t`` (batch + 1,) describes."""
    return _check_int32_vector(name, t, q, None, "(batch + 1,)") - 1


def _check_max_seqlen(name: str, value: Any) -> int:
    if not _is_int(value):
        raise TypeError(f"{name} must be an int >= 0, got {value!r} ({type(value).__name__})")
    if value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


def validate_tile_sizes(block_m: Any, block_n: Any) -> None:
    """Tile sizes (queries per Q tile, keys per K/V tile) must be ints >= 1."""
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if not _is_int(value):
            raise TypeError(f"{name} must be an int >= 1, got {value!r} ({type(value).__name__})")
        if value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")


# ---- shapes -------------------------------------------------------------------------------------------------


def _shape(name: str, x: Any, dims: tuple[str, ...]) -> tuple[int, ...]:
    if not hasattr(x, "shape"):
        raise TypeError(f"{name} must be a tensor or array ({', '.join(dims)}), got {type(x).__name__}")
    shape = tuple(int(size) for size in x.shape)
    if len(shape) != len(dims):
        layout = f"({', '.join(dims)})"
        raise ValueError(f"{name} must have 4 dimensions {layout}, got shape {shape} ({len(shape)} dimensions)")
    if min(shape) < 1:
        dim = next(dim for dim, size in enumerate(shape) if size < 1)
        raise ValueError(
            f"{name}.shape[{dim}] ({dims[dim]}) must be >= 1 (empty inputs are rejected), got {shape[dim]}"
        )
    return shape


def _check_shapes(q: Any, k: Any, v: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Return (q shape, k shape) after checking ranks, sizes and that q, k and v agree."""
    batch, _, nheads, headdim = q_shape = _shape("q", q, Q_DIMS)
    k_shape = _shape("k", k, KV_DIMS)
    v_shape = _shape("v", v, KV_DIMS)
    if v_shape != k_shape:
        raise ValueError(f"v must have the same shape as k, {k_shape}, got shape {v_shape}")
    if k_shape[0] != batch:
        raise ValueError(f"k batch size (k.shape[0]) must equal q's ({batch}), got {k_shape[0]}")
    if k_shape[3] != headdim:
        raise ValueError(f"k headdim (k.shape[3]) must equal q's ({headdim}), got {k_shape[3]}")
    if nheads % k_shape[2] != 0:
        raise ValueError(
            f"k nheads_k (k.shape[2]) must divide q's nheads ({nheads}) for grouped-query attention, got {k_shape[2]}"
        )
    return q_shape, k_shape


# ---- options ------------------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    # (plain ints and floats first: an ABC isinstance check costs about a microsecond, and a call makes several)
    return type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


def _is_real(value: Any) -> bool:
    return type(value) in (float, int) or (isinstance(value, numbers.Real) and not isinstance(value, bool))


def _check_scale(softmax_scale: Any, headdim: int) -> float:
    allowed = "None (meaning 1/sqrt(headdim)) or a finite number > 0"
    if softmax_scale is None:
        return 1.0 / math.sqrt(headdim)
    if not _is_real(softmax_scale):
        raise TypeError(f"softmax_scale must be {allowed}, got {softmax_scale!r} ({type(softmax_scale).__name__})")
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be {allowed}, got {softmax_scale!r}")
    return float(softmax_scale)


def _check_causal(causal: Any) -> bool:
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool (True or False), got {causal!r} ({type(causal).__name__})")
    return causal


def _check_causal_align(causal_align: Any) -> str:
    if causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"causal_align must be one of {CAUSAL_ALIGNS}, got {causal_align!r}")
    return causal_align


def _check_window(window_size: Any) -> tuple[int, int]:
    allowed = "a pair (window_left, window_right) of ints >= -1 (-1 = unbounded)"
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2):
        raise TypeError(f"window_size must be {allowed}, got {window_size!r}")
    if not all(_is_int(side) for side in window_size):
        raise TypeError(f"window_size must be {allowed}, got {window_size!r}")
    if min(window_size) < -1:
        raise ValueError(f"window_size must be {allowed}, got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def _check_softcap(softcap: Any) -> float:
    allowed = "a finite number >= 0 (0 = no softcap)"
    if not _is_real(softcap):
        raise TypeError(f"softcap must be {allowed}, got {softcap!r} ({type(softcap).__name__})")
    if not (math.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"softcap must be {allowed}, got {softcap!r}")
    return float(softcap)


# ---- CUDA kernel inputs -------------------------------------------------------------------------------------

KERNEL_DTYPES = ("float16", "bfloat16")
KERNEL_MAX_HEADDIM = 256


def validate_cuda_inputs(q: Any, k: Any, v: Any, args: AttentionArgs) -> tuple[Any, Any, Any]:
    """Check what the CUDA kernels need beyond `validate_attention_args`; return q, k, v ready to launch.

    The kernels read 16-byte vectors, so every row (the last dim) must be contiguous and start on a 16-byte
    boundary: every other stride divisible by 16 bytes (and the data pointer, see `validate_pointers`). Strides
    of size-1 dims never move a pointer, so misaligned ones there are replaced (a view, no copy).
    """
    import torch

    tensors = {"q": q, "k": k, "v": v}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor, got device {t.device}")
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in KERNEL_DTYPES:
            raise TypeError(f"{name} must have dtype float16 or bfloat16, got {t.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device} and {v.device}")
    if args.headdim % 8 != 0 or args.headdim > KERNEL_MAX_HEADDIM:
        raise ValueError(f"headdim must be a multiple of 8 up to {KERNEL_MAX_HEADDIM}, got {args.headdim}")
    if args.softcap != 0.0:
        raise ValueError(f"softcap={args.softcap} is not supported by flashcute's CUDA kernels yet (allowed: 0.0)")
    return tuple(_aligned_rows(name, t) for name, t in tensors.items())


def _aligned_rows(name: str, t: Any) -> Any:
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides {tuple(t.stride())}")
    elems = 16 // t.element_size()
    strides = list(t.stride())
    for dim, size in enumerate(t.shape[:-1]):
        if strides[dim] % elems == 0:
            continue
        if size != 1:
            raise ValueError(
                f"{name}.stride({dim}) must be a multiple of {elems} elements (16-byte aligned rows), "
                f"got strides {tuple(t.stride())}"
            )
        strides[dim] = math.prod(t.shape[dim + 1 :])
    return t if strides == list(t.stride()) else t.as_strided(t.shape, strides)


def validate_pointers(**tensors: Any) -> None:
    """Every tensor must start on a 16-byte boundary (the kernels' 128-bit loads and stores).

    Called where the kernels are launched, on real tensors: under torch.compile the traced code sees fake
    tensors, which have no address.
    """
    for name, t in tensors.items():
        if t.data_ptr() % 16 != 0:
            raise ValueError(f"{name} must start on a 16-byte boundary, got data_ptr() % 16 = {t.data_ptr() % 16}")
