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

Score variants given as tensors: learnable_sink (nheads,), one logit per query head that joins every row's softmax
denominator (flash-attn-4), and alibi_slopes (nheads,) or (batch, nheads), the ALiBi bias -slope * |i + offset - j|
added to the scores (flash_attn 2). Both are float tensors on q's device; slopes on the CPU (the references') are
checked to be finite, slopes on a GPU are not read (a host sync a call).
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from flashcute.kernels.common.limits import head_dim_bucket

if TYPE_CHECKING:
    import torch

CAUSAL_ALIGNS = ("bottom_right", "top_left")
Q_DIMS = ("batch", "seqlen_q", "nheads", "headdim")
KV_DIMS = ("batch", "seqlen_k", "nheads_k", "headdim")


@dataclass(frozen=True)
class AttentionArgs:
    """Validated, resolved attention arguments: sizes, the scale, the mask window and the score variants.

    softmax_scale is resolved (None became 1/sqrt(headdim)); causal is already folded into window_right = 0.
    learnable_sink and alibi_slopes are the tensors given (or None); tensors do not compare by value, so == and the
    hash leave them out. headdim_v is v's (and out's) head dim: headdim, or another.
    """

    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_k: int
    headdim: int
    headdim_v: int
    softmax_scale: float
    causal: bool
    causal_align: str
    window_left: int
    window_right: int
    softcap: float
    learnable_sink: torch.Tensor | None = field(default=None, compare=False)
    alibi_slopes: torch.Tensor | None = field(default=None, compare=False)

    def without_tensors(self) -> AttentionArgs:
        """These arguments with learnable_sink and alibi_slopes None (the sizes and scalars a call signature fixes)."""
        return replace(self, learnable_sink=None, alibi_slopes=None)

    @property
    def has_mask(self) -> bool:
        """True when a causal or sliding-window mask hides some keys from some queries."""
        return self.window_left >= 0 or self.window_right >= 0

    @property
    def empty(self) -> bool:
        """True when there is no query row or no key: nothing for a kernel to compute (out is empty, or O = 0)."""
        return self.batch * self.seqlen_q * self.seqlen_k == 0

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
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> AttentionArgs:
    """Check q, k, v shapes and the attention options; return them resolved as `AttentionArgs`.

    Raises TypeError for a value of the wrong type and ValueError for a value out of range.
    """
    (batch, seqlen_q, nheads, headdim), (_, seqlen_k, nheads_k, _), headdim_v = _check_shapes(q, k, v)
    return AttentionArgs(
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
        nheads=nheads,
        nheads_k=nheads_k,
        headdim=headdim,
        headdim_v=headdim_v,
        causal_align=_check_causal_align(causal_align),
        **_score_options(
            q, batch, nheads, headdim, softmax_scale, causal, window_size, softcap, learnable_sink, alibi_slopes
        ),
    )


def _score_options(
    q: Any,
    batch: int,
    nheads: int,
    headdim: int,
    softmax_scale: Any,
    causal: Any,
    window_size: Any,
    softcap: Any,
    learnable_sink: Any,
    alibi_slopes: Any,
) -> dict[str, Any]:
    """softmax_scale, causal, window_left, window_right, softcap, learnable_sink and alibi_slopes checked and
    resolved (None scale: 1/sqrt(headdim); causal folded into window_right = 0), as every entry's args take them.
    batch and nheads are the sizes the two tensors index: sequences and query heads."""
    window_left, window_right = _check_window(window_size)
    options = {
        "softmax_scale": _check_scale(softmax_scale, headdim),
        "causal": _check_causal(causal),
        "window_left": window_left,
        "window_right": 0 if causal else window_right,
        "softcap": _check_softcap(softcap),
    }
    heads = f"(nheads,) = ({nheads},)"
    if learnable_sink is not None:
        _check_float_tensor("learnable_sink", learnable_sink, q, ((nheads,),), heads)
    if alibi_slopes is not None:
        _check_float_tensor(
            "alibi_slopes",
            alibi_slopes,
            q,
            ((nheads,), (batch, nheads)),
            f"{heads} or (batch, nheads) = ({batch}, {nheads})",
        )
        if alibi_slopes.device.type == "cpu":  # a GPU tensor's values would cost a host sync a call: not read
            _check_finite("alibi_slopes", alibi_slopes)
    return options | {"learnable_sink": learnable_sink, "alibi_slopes": alibi_slopes}


@dataclass(frozen=True)
class VarlenArgs:
    """Validated, resolved arguments of a packed variable-length batch (flash_attn_varlen_func).

    Sequence b's queries are rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q, its keys the same rows of k and v
    by cu_seqlens_k; only the first seqused_q[b] / seqused_k[b] of them count where those are given. Masks align
    each sequence's diagonal bottom-right (flash_attn's convention): offset = its seqlen_k - its seqlen_q, which also
    places each sequence's ALiBi distances. alibi_slopes (batch, nheads) index the sequences. With a block table
    (``page_block_size`` not None), k and v are a cache's pages and sequence b's keys are its first
    cu_seqlens_k[b + 1] - cu_seqlens_k[b] positions (or seqused_k[b]), up to its pages' rows, and total_k is the
    pages' rows.
    """

    batch: int
    total_q: int
    total_k: int
    max_seqlen_q: int
    max_seqlen_k: int
    nheads: int
    nheads_k: int
    headdim: int
    headdim_v: int  # v's and out's head dim: headdim, or another
    softmax_scale: float
    causal: bool
    window_left: int
    window_right: int
    softcap: float
    learnable_sink: torch.Tensor | None = field(default=None, compare=False)
    alibi_slopes: torch.Tensor | None = field(default=None, compare=False)
    page_block_size: int | None = None


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
    learnable_sink: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    block_table: Any = None,
) -> VarlenArgs:
    """Check a packed batch's shapes, sequence tensors and options without reading device memory (no host sync; only
    alibi_slopes on the CPU, when given, are read, to check they are finite); `validate_varlen_values` checks the
    values of the sequence tensors. With ``block_table`` (batch, max_num_blocks_per_seq) int32, k and v are a
    paged cache's (num_blocks, page_block_size, nheads_k, headdim) pages. A max_seqlen of None resolves to its
    side's total rows (a paged cache's: the pages a sequence has), a bound on every sequence's length. Raises
    TypeError / ValueError naming the argument, the value given and what is allowed."""
    total_q, nheads, headdim = _shape("q", q, VARLEN_Q_DIMS, empty_dims=1)
    paged = block_table is not None
    kv_dims = PAGED_CACHE_DIMS if paged else VARLEN_KV_DIMS
    k_shape = _shape("k", k, kv_dims, empty_dims=0 if paged else 1)
    v_shape = _shape("v", v, kv_dims, empty_dims=0 if paged else 1)
    *rows, nheads_k, headdim_k = k_shape
    layout = ", ".join(kv_dims[:-1])
    if v_shape[:-1] != k_shape[:-1]:
        raise ValueError(f"v must have k's ({layout}), {k_shape[:-1]}, and any head dim, got shape {v_shape}")
    if headdim_k != headdim:
        raise ValueError(f"k headdim (k.shape[{len(kv_dims) - 1}]) must equal q's ({headdim}), got {headdim_k}")
    if nheads % nheads_k != 0:
        raise ValueError(
            f"k nheads_k (k.shape[{len(kv_dims) - 2}]) must divide q's nheads ({nheads}) for grouped-query "
            f"attention, got {nheads_k}"
        )
    batch = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q)
    if _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q) != batch:
        raise ValueError(
            f"cu_seqlens_k must have as many entries as cu_seqlens_q ({batch + 1}), got {tuple(cu_seqlens_k.shape)}"
        )
    for name, used in (("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        if used is not None:
            _check_int32_vector(name, used, q, batch, "(batch,)")
    pages = {}
    if paged:
        capacity = _check_block_table(block_table, q, batch) * rows[1]
        max_k = capacity if max_seqlen_k is None else _check_max_seqlen("max_seqlen_k", max_seqlen_k)
        if max_k > capacity:
            raise ValueError(
                f"max_seqlen_k ({max_k}) must be at most the pages a sequence has (block_table.shape[1] x "
                f"page_block_size = {capacity})"
            )
        pages = {"page_block_size": rows[1]}
    else:
        max_k = rows[0] if max_seqlen_k is None else _check_max_seqlen("max_seqlen_k", max_seqlen_k)
    return VarlenArgs(
        batch=batch,
        total_q=total_q,
        total_k=math.prod(rows),
        max_seqlen_q=total_q if max_seqlen_q is None else _check_max_seqlen("max_seqlen_q", max_seqlen_q),
        max_seqlen_k=max_k,
        nheads=nheads,
        nheads_k=nheads_k,
        headdim=headdim,
        headdim_v=v_shape[-1],
        **_score_options(
            q, batch, nheads, headdim, softmax_scale, causal, window_size, softcap, learnable_sink, alibi_slopes
        ),
        **pages,
    )


def validate_varlen_values(args: VarlenArgs, cu_seqlens_q: Any, cu_seqlens_k: Any, seqused_q: Any, seqused_k: Any):
    """The checks that read the sequence tensors (one host sync): cu_seqlens start at 0, never decrease and end at
    the packed tensors' totals (a paged cache's keys: any total); seqused within each sequence; max_seqlen at least
    every length that counts."""
    total_k = None if args.page_block_size is not None else args.total_k
    for name, cu, total, used, used_name, longest, longest_name in (
        ("cu_seqlens_q", cu_seqlens_q, args.total_q, seqused_q, "seqused_q", args.max_seqlen_q, "max_seqlen_q"),
        ("cu_seqlens_k", cu_seqlens_k, total_k, seqused_k, "seqused_k", args.max_seqlen_k, "max_seqlen_k"),
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
        if total is not None and values[-1] != total:
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


def _check_int32_tensor(name: str, t: Any, q: Any, layout: str) -> None:
    """Check ``t`` is an int32 torch.Tensor on q's device (``layout`` names its shape in the message)."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be an int32 torch.Tensor {layout}, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype int32, got {t.dtype}")
    if t.device != q.device:
        raise ValueError(f"{name} must be on q's device ({q.device}), got {t.device}")


def _check_int32_vector(name: str, t: Any, q: Any, size: int | None, layout: str) -> int:
    """``t``'s length, after checking it is a contiguous int32 vector on q's device of ``size`` entries (None: at
    least one)."""
    _check_int32_tensor(name, t, q, layout)
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


def _shape(name: str, x: Any, dims: tuple[str, ...], empty_dims: int = 0) -> tuple[int, ...]:
    """x's shape after checking it has one size per name in ``dims``, each >= 1 but the first ``empty_dims``, which
    may be 0 (a batch, a sequence length, a packed batch's total of rows: a call with nothing to compute)."""
    if not hasattr(x, "shape"):
        raise TypeError(f"{name} must be a tensor or array ({', '.join(dims)}), got {type(x).__name__}")
    shape = tuple(int(size) for size in x.shape)
    if len(shape) != len(dims):
        layout = f"({', '.join(dims)})"
        raise ValueError(
            f"{name} must have {len(dims)} dimensions {layout}, got shape {shape} ({len(shape)} dimensions)"
        )
    if min(shape[empty_dims:]) < 1:
        dim = next(dim for dim, size in enumerate(shape) if size < 1 and dim >= empty_dims)
        raise ValueError(f"{name}.shape[{dim}] ({dims[dim]}) must be >= 1, got {shape[dim]}")
    return shape


def _check_shapes(q: Any, k: Any, v: Any) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Return (q shape, k shape, v's head dim) after checking ranks, sizes and that q, k and v agree (v's head dim
    may differ from theirs)."""
    batch, _, nheads, headdim = q_shape = _shape("q", q, Q_DIMS, empty_dims=2)
    k_shape = _shape("k", k, KV_DIMS, empty_dims=2)
    v_shape = _shape("v", v, KV_DIMS, empty_dims=2)
    if v_shape[:3] != k_shape[:3]:
        raise ValueError(
            f"v must have k's (batch, seqlen_k, nheads_k), {k_shape[:3]}, and any head dim, got shape {v_shape}"
        )
    if k_shape[0] != batch:
        raise ValueError(f"k batch size (k.shape[0]) must equal q's ({batch}), got {k_shape[0]}")
    if k_shape[3] != headdim:
        raise ValueError(f"k headdim (k.shape[3]) must equal q's ({headdim}), got {k_shape[3]}")
    if nheads % k_shape[2] != 0:
        raise ValueError(
            f"k nheads_k (k.shape[2]) must divide q's nheads ({nheads}) for grouped-query attention, got {k_shape[2]}"
        )
    return q_shape, k_shape, v_shape[3]


# ---- options ------------------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    # (plain ints and floats first: an ABC isinstance check costs about a microsecond, and a call makes several)
    return type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


def _array_of_shape(value: Any, shape: tuple[int, ...]) -> bool:
    """Whether ``value`` is a tensor or array (it has shape and tolist) of this shape."""
    return hasattr(value, "tolist") and tuple(getattr(value, "shape", (-1,))) == shape


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
    allowed = "a pair (window_left, window_right) of ints >= -1 (-1 or None = unbounded)"
    pair = window_size.tolist() if _array_of_shape(window_size, (2,)) else window_size  # (a tensor, as flash_attn)
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise TypeError(f"window_size must be {allowed}, got {window_size!r}")
    # None: flash-attn-4's unbounded side; a 0-dim tensor or array: its value
    sides = [-1 if side is None else side.tolist() if _array_of_shape(side, ()) else side for side in pair]
    if not all(_is_int(side) for side in sides):
        raise TypeError(f"window_size must be {allowed}, got {window_size!r}")
    if min(sides) < -1:
        raise ValueError(f"window_size must be {allowed}, got {window_size!r}")
    return int(sides[0]), int(sides[1])


def _check_softcap(softcap: Any) -> float:
    allowed = "a finite number >= 0 (0 = no softcap)"
    if not _is_real(softcap):
        raise TypeError(f"softcap must be {allowed}, got {softcap!r} ({type(softcap).__name__})")
    if not (math.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"softcap must be {allowed}, got {softcap!r}")
    return float(softcap)


def _check_float_tensor(name: str, t: Any, q: Any, shapes: tuple[tuple[int, ...], ...], layout: str) -> None:
    """Check ``t`` is a floating-point torch.Tensor of one of ``shapes`` (``layout`` names them in the message) on
    q's device, the CPU where q is a numpy array."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a floating-point torch.Tensor {layout}, got {type(t).__name__}")
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name} must have a floating-point dtype, got {t.dtype}")
    if tuple(t.shape) not in shapes:
        raise ValueError(f"{name} must have shape {layout}, got {tuple(t.shape)}")
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    if t.device != device:
        raise ValueError(f"{name} must be on q's device ({device}), got {t.device}")


def _check_finite(name: str, t: torch.Tensor) -> None:
    """Every entry of ``t`` must be finite (reads the values: one host sync for a CUDA tensor)."""
    import torch

    finite = torch.isfinite(t)
    if not finite.all():
        index = tuple(int(i) for i in (~finite).nonzero()[0])
        raise ValueError(f"{name} must be finite, got {t[index].item()} at index {index}")


# ---- CUDA kernel inputs -------------------------------------------------------------------------------------

KERNEL_DTYPES = ("float16", "bfloat16")
KERNEL_MAX_HEADDIM = 256


def validate_cuda_inputs(q: Any, k: Any, v: Any, args: AttentionArgs) -> tuple[Any, Any, Any]:
    """Check what the CUDA kernels need beyond `validate_attention_args`; return q, k, v ready to launch.

    The kernels read 16-byte vectors, so every row (the last dim) must be contiguous and start on a 16-byte
    boundary: every other stride divisible by 16 bytes (and the data pointer: interface.aligned_inputs). Strides
    of size-1 dims never move a pointer, so misaligned ones there are replaced (a view, no copy); a tensor whose
    rows the kernels cannot read where they lie (a last stride other than 1, rows off 16 bytes) is returned as a
    contiguous copy, as PyTorch's attention and flash-attn-4 take any layout.
    """
    check_cuda_tensors({"q": q, "k": k, "v": v}, args)
    if pads_head_dims(args) or q.numel() == 0 or k.numel() == 0:  # zero-padded copies (interface.pad_head_dims)
        return q, k, v  # or no launch at all
    return tuple(aligned_rows(name, t) for name, t in (("q", q), ("k", k), ("v", v)))


def check_cuda_tensors(tensors: dict[str, Any], args: AttentionArgs) -> None:
    """The types, devices, dtypes and head dims that the CUDA kernels take, of q, k, v (``tensors`` by the names
    that errors give them, in that order)."""
    import torch

    q, k, v = tensors.values()
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor, got device {t.device}")
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in KERNEL_DTYPES:
            raise TypeError(f"{name} must have dtype float16 or bfloat16, got {t.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"{_names(tensors)} must share one dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"{_names(tensors)} must be on one device, got {q.device}, {k.device} and {v.device}")
    if args.headdim > KERNEL_MAX_HEADDIM:
        raise ValueError(f"headdim must be at most {KERNEL_MAX_HEADDIM}, got {args.headdim}")
    if args.headdim_v != args.headdim:
        bucket = head_dim_bucket(args.headdim)
        if args.headdim_v > bucket:
            raise ValueError(
                f"v's headdim (v.shape[3]) must be at most q's head-dim bucket ({bucket} for q's {args.headdim}) "
                f"where it differs from q's, got {args.headdim_v}"
            )


def _names(tensors: dict[str, Any]) -> str:
    """ "q, k and v", by the names the tensors go by."""
    first, second, third = tensors
    return f"{first}, {second} and {third}"


def pads_head_dims(args: AttentionArgs) -> bool:
    """Whether q's or v's head dim is not a multiple of 8, the kernels' 16-byte rows: such a call runs on copies
    zero-padded up to one (flash_attn's way with such head dims)."""
    return (args.headdim | args.headdim_v) % 8 != 0


def aligned_rows(name: str, t: Any, copy: bool = True) -> Any:
    """``t`` with rows the kernels read (validate_cuda_inputs' docstring): itself, a view where only
    size-1 dims' strides are off, or else a contiguous copy; without ``copy`` (a tensor written in place) a
    ValueError naming it."""
    if t.stride(-1) != 1:
        if copy:
            return t.contiguous()
        raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides {tuple(t.stride())}")
    elems = 16 // t.element_size()
    strides = list(t.stride())
    for dim, size in enumerate(t.shape[:-1]):
        if strides[dim] % elems == 0:
            continue
        if size != 1:
            if copy:
                return t.contiguous()
            raise ValueError(
                f"{name}.stride({dim}) must be a multiple of {elems} elements (16-byte aligned rows), "
                f"got strides {tuple(t.stride())}"
            )
        strides[dim] = math.prod(t.shape[dim + 1 :])
    return t if strides == list(t.stride()) else t.as_strided(t.shape, strides)


def validate_pointers(**tensors: Any) -> None:
    """Every tensor must start on a 16-byte boundary (the kernels' 128-bit loads and stores): for the tensors
    that the kernels write in place (a KV cache); inputs that are only read are copied instead
    (interface.aligned_inputs).

    Called where the kernels are launched, on real tensors: under torch.compile the traced code sees fake
    tensors, which have no address.
    """
    for name, t in tensors.items():
        if t.data_ptr() % 16 != 0:
            raise ValueError(f"{name} must start on a 16-byte boundary, got data_ptr() % 16 = {t.data_ptr() % 16}")


# ---- KV caches (flash_attn_with_kvcache) --------------------------------------------------------------------

CACHE_DIMS = ("batch_cache", "seqlen_cache", "nheads_k", "headdim")
PAGED_CACHE_DIMS = ("num_blocks", "page_block_size", "nheads_k", "headdim")
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class KvcacheArgs:
    """Validated, resolved arguments of flash_attn_with_kvcache.

    ``attention`` holds q's sizes and the attention options, with seqlen_k the cache's capacity: the keys that one
    sequence can hold (seqlen_cache, or block_table.shape[1] * page_block_size for a paged cache).
    ``page_block_size`` is None for a cache indexed by batch; ``rotary_dim`` is 0 without rotary embedding.
    """

    attention: AttentionArgs
    seqlen_new: int
    page_block_size: int | None
    rotary_dim: int

    @property
    def capacity(self) -> int:
        return self.attention.seqlen_k

    @property
    def q_positions_per_row(self) -> bool:
        """flash_attn's rotary positions of q: row i at cache_seqlens[b] + i when a causal or local mask hides
        keys, else every row at cache_seqlens[b]. A window side of at least the capacity hides no key, so it does
        not make the mask local (flash_attn turns it into -1 first)."""
        return any(0 <= side < self.capacity for side in (self.attention.window_left, self.attention.window_right))


def validate_kvcache_args(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    k: Any = None,
    v: Any = None,
    rotary_cos: Any = None,
    rotary_sin: Any = None,
    cache_seqlens: Any = None,
    cache_batch_idx: Any = None,
    cache_leftpad: Any = None,
    block_table: Any = None,
    softmax_scale: Any = None,
    causal: Any = False,
    window_size: Any = (-1, -1),
    softcap: Any = 0.0,
    rotary_interleaved: Any = True,
    num_splits: Any = 0,
    return_lse: Any = False,
    learnable_sink: Any = None,
    alibi_slopes: Any = None,
    return_softmax_lse: Any = False,
) -> KvcacheArgs:
    """Check flash_attn_with_kvcache's shapes, dtypes, devices and options without reading device memory (only
    alibi_slopes on the CPU, when given, are read, to check they are finite); raise
    TypeError / ValueError naming the argument, the value given and what is allowed. What the CUDA kernels need
    beyond this (dtype, head dim, row alignment) is checked by the caller that launches them."""
    import torch

    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) and (t is not None or name in ("q", "k_cache", "v_cache")):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    batch, seqlen_q, nheads, headdim = _shape("q", q, Q_DIMS)
    if not q.dtype.is_floating_point:
        raise TypeError(f"q must have a floating-point dtype, got {q.dtype}")
    for name, t in tensors.items():
        if t is None or name == "q":
            continue
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype ({q.dtype}), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device ({q.device}), got {t.device}")

    paged = block_table is not None
    cache_shape = _shape("k_cache", k_cache, PAGED_CACHE_DIMS if paged else CACHE_DIMS)
    headdim_v = _shape("v_cache", v_cache, PAGED_CACHE_DIMS if paged else CACHE_DIMS)[3]
    if tuple(v_cache.shape[:3]) != cache_shape[:3]:
        raise ValueError(
            f"v_cache must have k_cache's shape {cache_shape} but for its head dim, got {tuple(v_cache.shape)}"
        )
    _, rows, nheads_k, cache_headdim = cache_shape
    if cache_headdim != headdim:
        raise ValueError(f"k_cache headdim (k_cache.shape[3]) must equal q's ({headdim}), got {cache_headdim}")
    if nheads % nheads_k != 0:
        raise ValueError(
            f"k_cache nheads_k (k_cache.shape[2]) must divide q's nheads ({nheads}) for grouped-query attention, "
            f"got {nheads_k}"
        )
    if paged:
        capacity = _check_block_table(block_table, q, batch) * rows
        if cache_batch_idx is not None:
            raise ValueError(
                "cache_batch_idx must be None with a paged cache: block_table already names each sequence's pages"
            )
    else:
        capacity = rows
        if cache_batch_idx is not None:
            _check_int32_vector("cache_batch_idx", cache_batch_idx, q, batch, "(batch,)")
        elif cache_shape[0] < batch:
            raise ValueError(
                f"k_cache.shape[0] (batch_cache) must be >= q's batch ({batch}) without cache_batch_idx, "
                f"got {cache_shape[0]}"
            )
    if batch * capacity > INT32_MAX:
        raise ValueError(
            f"batch x cache capacity ({batch} x {capacity}) must be at most {INT32_MAX}: the attended cache rows "
            "are counted by int32 cu_seqlens_k"
        )

    seqlen_new = _check_new_kv(k, v, (batch, nheads_k, headdim, headdim_v), capacity, seqlen_q)
    _check_cache_seqlens(cache_seqlens, q, batch, capacity, seqlen_new, k is not None)
    if cache_leftpad is not None:
        _check_int32_vector("cache_leftpad", cache_leftpad, q, batch, "(batch,)")
    rotary_dim = _check_rotary(rotary_cos, rotary_sin, q, headdim, capacity, k is not None)

    flags = (("rotary_interleaved", rotary_interleaved), ("return_lse", return_lse))
    for name, flag in (*flags, ("return_softmax_lse", return_softmax_lse)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r} ({type(flag).__name__})")
    if not _is_int(num_splits) or num_splits < 0:
        raise (ValueError if _is_int(num_splits) else TypeError)(
            f"num_splits must be an int >= 0 (0 = the implementation's choice), got {num_splits!r}"
        )
    attention = AttentionArgs(
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=capacity,
        nheads=nheads,
        nheads_k=nheads_k,
        headdim=headdim,
        headdim_v=headdim_v,
        causal_align="bottom_right",
        **_score_options(
            q, batch, nheads, headdim, softmax_scale, causal, window_size, softcap, learnable_sink, alibi_slopes
        ),
    )
    return KvcacheArgs(attention, seqlen_new, rows if paged else None, rotary_dim)


def _check_block_table(block_table: Any, q: torch.Tensor, batch: int) -> int:
    """The pages per sequence (block_table.shape[1]) after checking block_table is an int32 (batch, pages) tensor
    on q's device."""
    layout = f"(batch, max_num_blocks_per_seq) = ({batch}, max_num_blocks_per_seq)"
    _check_int32_tensor("block_table", block_table, q, layout)
    if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.shape[1] < 1:
        raise ValueError(
            f"block_table must have shape {layout} with at least one page per sequence, got {tuple(block_table.shape)}"
        )
    return block_table.shape[1]


def _check_new_kv(k: Any, v: Any, sizes: tuple[int, int, int, int], capacity: int, seqlen_q: int) -> int:
    """seqlen_new, the rows of k and v (0 without them), after checking their shapes against q's batch and the
    cache's heads and head dims (``sizes``: batch, nheads_k, k_cache's head dim, v_cache's)."""
    if (k is None) != (v is None):
        given = "k" if v is None else "v"
        raise ValueError(f"k and v must be given together (the new keys and values), got only {given}")
    if k is None:
        return 0
    batch, nheads_k, *headdims = sizes
    for name, t, headdim in (("k", k, headdims[0]), ("v", v, headdims[1])):
        shape = tuple(t.shape)
        if len(shape) != 4 or (shape[0], shape[2], shape[3]) != (batch, nheads_k, headdim):
            raise ValueError(
                f"{name} must have shape (batch, seqlen_new, nheads_k, headdim) = ({batch}, seqlen_new, {nheads_k}, "
                f"{headdim}), got {shape}"
            )
    if v.shape[1] != k.shape[1]:
        raise ValueError(f"v must have k's seqlen_new ({k.shape[1]}), got shape {tuple(v.shape)}")
    seqlen_new = k.shape[1]
    if seqlen_new > capacity:
        raise ValueError(f"k.shape[1] (seqlen_new) must be at most the cache's capacity ({capacity}), got {seqlen_new}")
    if seqlen_q > capacity:
        raise ValueError(
            f"q.shape[1] (seqlen_q) must be at most the cache's capacity ({capacity}) when k and v are given, "
            f"got {seqlen_q}"
        )
    return seqlen_new


def _check_cache_seqlens(
    cache_seqlens: Any, q: torch.Tensor, batch: int, capacity: int, seqlen_new: int, appends: bool
) -> None:
    import torch

    if cache_seqlens is None:
        if appends:
            raise ValueError("cache_seqlens must be given with k and v: it says where each sequence's new keys go")
        return
    if isinstance(cache_seqlens, torch.Tensor):
        _check_int32_vector("cache_seqlens", cache_seqlens, q, batch, "(batch,)")
        return
    if not _is_int(cache_seqlens):
        raise TypeError(
            f"cache_seqlens must be None, an int or an int32 torch.Tensor (batch,), got {cache_seqlens!r} "
            f"({type(cache_seqlens).__name__})"
        )
    if not 0 <= cache_seqlens <= capacity - seqlen_new:
        raise ValueError(
            f"cache_seqlens must be in [0, {capacity - seqlen_new}] (the cache's capacity {capacity} less the "
            f"{seqlen_new} new keys), got {cache_seqlens}"
        )


def _check_rotary(cos: Any, sin: Any, q: torch.Tensor, headdim: int, capacity: int, appends: bool) -> int:
    """rotary_dim (0 without rotary embedding) after checking rotary_cos and rotary_sin."""
    import torch

    if cos is None and sin is None:
        return 0
    if cos is None or sin is None:
        given = "rotary_sin" if cos is None else "rotary_cos"
        raise ValueError(f"rotary_cos and rotary_sin must be given together, got only {given}")
    if not appends:
        raise ValueError("rotary_cos and rotary_sin need k and v: they rotate the new keys, and q with them")
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (seqlen_ro, rotary_dim / 2), got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must have a floating-point dtype, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device ({q.device}), got {t.device}")
    if cos.dim() != 2 or cos.shape[1] < 1:
        raise ValueError(
            f"rotary_cos must have shape (seqlen_ro, rotary_dim / 2), rotary_dim >= 2, got {tuple(cos.shape)}"
        )
    if sin.shape != cos.shape:
        raise ValueError(f"rotary_sin must have rotary_cos's shape {tuple(cos.shape)}, got {tuple(sin.shape)}")
    seqlen_ro, rotary_dim = cos.shape[0], 2 * cos.shape[1]
    if rotary_dim > headdim:
        raise ValueError(
            f"rotary_dim (2 * rotary_cos.shape[1]) must be at most q's headdim ({headdim}), got {rotary_dim}"
        )
    if seqlen_ro < capacity:
        raise ValueError(
            f"rotary_cos.shape[0] (seqlen_ro) must be at least the cache's capacity ({capacity}), got {seqlen_ro}"
        )
    return rotary_dim


def validate_kvcache_kernel_inputs(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, args: KvcacheArgs
) -> None:
    """What the CUDA kernels need of the tensors they may read where they lie (16-byte aligned rows, CUDA fp16 /
    bf16, head dim), checked before the cache is written, so that a call they cannot run changes
    nothing."""
    check_cuda_tensors({"q": q, "k_cache": k_cache, "v_cache": v_cache}, args.attention)
    if not pads_head_dims(args.attention):  # (zero-padded copies are read and written back otherwise)
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            aligned_rows(name, t, copy=False)
        validate_pointers(k_cache=k_cache, v_cache=v_cache)
