"""The backends a sweep can time, by name. Each builds, for a shape, a (q, k, v) -> out function.

Names: flashcute-<kernel> for each kernel flashcute.interface.available_kernels() offers on this GPU; fa4
(flash-attn-4, CuTe DSL); sdpa-cudnn, sdpa-flash, sdpa-efficient and sdpa-math (PyTorch SDPA with that backend
forced); flex (FlexAttention under torch.compile, the Triton kernel a Python user would otherwise pick).
flashcute and fa4 run packed shapes through their flash_attn_varlen_func; SDPA and flex refuse them.

Decode shapes (q a few rows, k and v a cache): flashcute-<kernel> runs them through flash_attn_with_kvcache, and
the decode registry adds flashcute-<kernel>-func, the same kernel through flash_attn_func on a contiguous cache;
fa4 runs a paged cache through its flash_attn_varlen_func's page_table; SDPA and flex take contiguous caches only.

flashcute-<kernel>-deterministic: the kernel with deterministic=True, for the deterministic backward's cost against
the default one; a sweep takes it only where --backends names it (Backend.by_default).

Score variants (dense shapes): flashcute takes softcap, learnable_sink and alibi_slopes; fa4 softcap and
learnable_sink, no ALiBi; flex caps and biases through a score_mod, without a sink; SDPA none of them. A backend
reports the variants it cannot run as unsupported. `score_tensors` makes the sink and slopes every backend and the
check use.

v with a head dim of its own (Shape.headdim_v): flashcute, fa4, flex and SDPA's efficient and math backends take v
as it is and return out at its width; SDPA's cudnn backend takes some pairs, (192, 128) among them, on recent cuDNN
releases and refuses the others at the call (reported unsupported, as any refusal of a forced SDPA backend); SDPA's
flash backend requires q, k and v of one head dim and reports those shapes unsupported.
"""

import importlib.util
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from types import ModuleType

import torch
import torch.nn.functional as F

from flashcute.bench.grid import Shape
from flashcute.bench.inputs import block_table, bottom_right_causal_mask, cu_seqlens
from flashcute.bench.passes import AttentionFn
from flashcute.bench.results import DENSE_ENTRY_SUFFIX, DETERMINISTIC_SUFFIX

MATH_MAX_SCORES_BYTES = 1 << 30
SDPA_BACKENDS = {
    "cudnn": "CUDNN_ATTENTION",
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}
SDPA_PACKED = "SDPA takes them only as nested tensors, not timed here"
FLEX_PACKED = "FlexAttention needs a document mask for them, not timed here"
SDPA_PAGED = "SDPA takes no page table"
SDPA_SOFTCAP = "SDPA caps no scores (a float attn_mask cannot)"
SDPA_SINK = "SDPA's softmax takes no logit beyond the scores"
SDPA_ALIBI = "SDPA adds a bias only as a float attn_mask of every score, read from memory, not timed here"
FLEX_PAGED = "FlexAttention reads pages only through its own paged-attention mask conversion, not timed here"
FLEX_SINK = "FlexAttention's softmax takes no logit beyond the scores (a score_mod only changes them)"
FA4_ALIBI = "flash-attn-4 takes no alibi_slopes"
SDPA_FLASH_HEADDIM_V = "SDPA's flash backend requires q, k and v of one head dim"


def _supports_all(shape: Shape, pass_: str) -> str | None:
    return None


def _nothing_missing() -> str | None:
    return None


@dataclass(frozen=True)
class Backend:
    name: str
    build: Callable[[Shape], AttentionFn]
    """Prepares what the shape needs (compiled kernels, masks), outside the timing; the result runs one forward."""
    supports: Callable[[Shape, str], str | None] = _supports_all
    """Why the backend cannot run a shape and pass, or None. Asked before anything is built."""
    available: Callable[[], str | None] = _nothing_missing
    """Why the backend cannot run here at all (a package missing), or None."""
    context: Callable[[], AbstractContextManager] = nullcontext
    """Entered around building, checking and timing: SDPA's choice of backend is set here, not in every call."""
    by_default: bool = True
    """Whether a sweep that names no backends takes it."""


def _unavailable(name: str, reason: str) -> Backend:
    """A backend that refuses every shape with `reason` (so the sweep reports it per row)."""

    def refuse_build(shape: Shape) -> AttentionFn:
        raise RuntimeError(reason)

    return Backend(name, refuse_build, supports=lambda shape, pass_: reason, available=lambda: reason)


def _varlen_arguments(shape: Shape) -> dict[str, torch.Tensor | int]:
    """flash_attn_varlen_func's sequence arguments for a packed shape: q, k and v share one packing."""
    starts = cu_seqlens(shape)
    return {"cu_seqlens_q": starts, "cu_seqlens_k": starts, "max_seqlen_q": shape.seqlen, "max_seqlen_k": shape.seqlen}


def _refusing(
    what: str, refused: Callable[[Shape], bool], why: str, supports: Callable[[Shape, str], str | None] = _supports_all
) -> Callable[[Shape, str], str | None]:
    """`supports` for a backend that does not run the shapes ``refused`` picks ("no <what>: <why>"), and otherwise
    asks ``supports``."""

    def refusing(shape: Shape, pass_: str) -> str | None:
        return f"no {what}: {why}" if refused(shape) else supports(shape, pass_)

    return refusing


Supports = Callable[[Shape, str], str | None]


def _dense_only(why: str, supports: Supports = _supports_all) -> Supports:
    """Refuses packed variable-length batches."""
    return _refusing("packed variable-length batches", lambda shape: shape.packed, why, supports)


def _contiguous_only(why: str, supports: Supports = _supports_all) -> Supports:
    """Refuses paged KV caches."""
    return _refusing("paged KV cache", lambda shape: shape.paged, why, supports)


def score_tensors(
    shape: Shape, device: torch.device | str, requires_grad: bool = False, sink_dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """flash_attn_func's learnable_sink and alibi_slopes keywords for the shape's score variants (none for a shape
    without them), on ``device``. The sink: logits from -1 to 1 across the heads, (nheads,) of ``sink_dtype``,
    rounded to bfloat16 values so that a backend that takes it only in bfloat16 (flash-attn-4) gets the same logits;
    it requires grad when ``requires_grad``, as a model's parameter would in training. The slopes: ALiBi's geometric
    sequence 2^(-8 (h + 1) / nheads), float32 (nheads,)."""
    arguments = {}
    if shape.sink:
        logits = torch.linspace(-1.0, 1.0, shape.nheads).bfloat16()
        arguments["learnable_sink"] = logits.to(device, sink_dtype).requires_grad_(requires_grad)
    if shape.alibi:
        slopes = [2 ** (-8 * (h + 1) / shape.nheads) for h in range(shape.nheads)]
        arguments["alibi_slopes"] = torch.tensor(slopes, dtype=torch.float32, device=device)
    return arguments


def _with_scores(
    call: Callable[..., torch.Tensor], shape: Shape, sink_dtype: torch.dtype = torch.float32
) -> AttentionFn:
    """``call`` given the shape's `score_tensors` as keywords, made at the first call on q's device and kept for the
    next ones (none is made in what is timed); the sink requires grad when q does, so that a pass with a backward
    computes its gradient. ``call`` itself for a shape without them."""
    if not (shape.sink or shape.alibi):
        return call
    made: dict[tuple[torch.device, bool], dict[str, torch.Tensor]] = {}

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        key = (q.device, q.requires_grad)
        if key not in made:
            made[key] = score_tensors(shape, q.device, q.requires_grad, sink_dtype)
        return call(q, k, v, **made[key])

    return attention


def _heads_first(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(batch, seqlen, nheads, headdim) views as (batch, nheads, seqlen, headdim), the layout of SDPA and flex."""
    return tuple(t.transpose(1, 2) for t in tensors)


# ---- flashcute ---------------------------------------------------------------------------------------------------


def flashcute_backend(name: str, package: ModuleType, kernel: str, deterministic: bool = False) -> Backend:
    """``package.flash_attn_func`` with ``kernel``, or its flash_attn_varlen_func for a packed shape, or its
    flash_attn_with_kvcache for a decode shape: flashcute's, or those of another tree's copy of the package. With
    ``deterministic`` the first two take deterministic=True, decode shapes are refused (the cache entry has no
    backward) and a sweep takes the backend only where named."""
    mode = {"deterministic": True} if deterministic else {}  # (a copy from before the flag takes none)

    def build(shape: Shape) -> AttentionFn:
        if shape.decode:
            return partial(
                package.flash_attn_with_kvcache,
                cache_seqlens=shape.seqlen,
                block_table=block_table(shape) if shape.paged else None,
                causal=shape.causal,
                kernel=kernel,
            )
        if shape.packed:
            return partial(
                package.flash_attn_varlen_func, **_varlen_arguments(shape), causal=shape.causal, kernel=kernel, **mode
            )
        capped = {"softcap": shape.softcap} if shape.softcap else {}  # (a copy from before softcap takes none)
        call = partial(package.flash_attn_func, causal=shape.causal, kernel=kernel, **capped, **mode)
        return _with_scores(call, shape)

    if deterministic:
        return Backend(name, build, supports=_no_decode, by_default=False)
    return Backend(name, build)


def _no_decode(shape: Shape, pass_: str) -> str | None:
    return "no decode shapes: flash_attn_with_kvcache has no backward to make deterministic" if shape.decode else None


def _decode_only(shape: Shape, pass_: str) -> str | None:
    if not shape.decode:
        return "decode shapes only: flashcute-<kernel> times flash_attn_func on the others"
    if shape.paged:
        return "no paged KV cache: flash_attn_func takes k and v of (batch, seqlen_k, nheads_k, headdim)"
    return None


def flashcute_func_backend(name: str, package: ModuleType, kernel: str) -> Backend:
    """``package.flash_attn_func`` with ``kernel`` on a decode shape's contiguous cache: the dense entry beside
    flash_attn_with_kvcache, for what the cache entry costs over it."""

    def build(shape: Shape) -> AttentionFn:
        return partial(package.flash_attn_func, causal=shape.causal, kernel=kernel)

    return Backend(name, build, supports=_decode_only)


def _flashcute_backends(decode: bool) -> list[Backend]:
    try:
        import flashcute

        kernels = flashcute.available_kernels()
    except Exception as exc:  # a broken flashcute is reported like a missing backend, never fatal to the sweep
        return [_unavailable("flashcute", f"available_kernels() failed: {type(exc).__name__}: {exc}")]
    if not kernels:
        return [_unavailable("flashcute", "no flashcute kernel runs on this GPU")]
    backends = [flashcute_backend(f"flashcute-{kernel}", flashcute, kernel) for kernel in kernels]
    if decode:
        backends += [
            flashcute_func_backend(f"flashcute-{kernel}{DENSE_ENTRY_SUFFIX}", flashcute, kernel) for kernel in kernels
        ]
    return backends + [
        flashcute_backend(f"flashcute-{kernel}{DETERMINISTIC_SUFFIX}", flashcute, kernel, deterministic=True)
        for kernel in kernels
    ]


# ---- flash-attn-4 --------------------------------------------------------------------------------------------------


def _fa4_available() -> str | None:
    try:
        import flash_attn.cute  # noqa: F401
    except Exception as exc:  # any import failure (missing, wrong cutlass version) means "not here"
        return f"flash_attn.cute is not importable: {type(exc).__name__}: {exc}"
    return None


def _fa4_paged_arguments(shape: Shape) -> dict[str, torch.Tensor | int]:
    """flash-attn-4's flash_attn_varlen_func arguments for a paged cache: without seqused_k it would take every
    sequence to hold as many keys as the whole cache."""
    table = block_table(shape)
    seqused_k = torch.full((shape.batch,), shape.seqlen, dtype=torch.int32, device=table.device)
    return {"page_table": table, "seqused_k": seqused_k, "max_seqlen_k": shape.seqlen}


def _build_fa4(shape: Shape) -> AttentionFn:
    # by keyword: flash_attn_varlen_func's order is not flashcute's
    if shape.paged:
        from flash_attn.cute import flash_attn_varlen_func

        call = partial(flash_attn_varlen_func, **_fa4_paged_arguments(shape))
    elif shape.packed:
        from flash_attn.cute import flash_attn_varlen_func

        call = partial(flash_attn_varlen_func, **_varlen_arguments(shape))
    else:
        from flash_attn.cute import flash_attn_func as call

    capped = {"softcap": shape.softcap} if shape.softcap else {}

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **scores: torch.Tensor) -> torch.Tensor:
        out = call(q, k, v, causal=shape.causal, **capped, **scores)
        return out[0] if isinstance(out, tuple) else out  # some versions return (out, lse)

    # in bfloat16: flash-attn-4 releases before its float16 and float32 sinks assert a bfloat16 one
    return _with_scores(attention, shape, sink_dtype=torch.bfloat16)


# ---- PyTorch SDPA --------------------------------------------------------------------------------------------------


def _sdpa_mask(shape: Shape) -> dict[str, torch.Tensor | bool]:
    """SDPA's mask arguments. is_causal is top-left aligned, which is flashcute's bottom-right rule only when
    seqlen_q == seqlen_k; otherwise a causal shape gets the bottom-right rule as a boolean attn_mask, which the
    flash backend refuses (reported unsupported) and the others take."""
    if shape.causal and shape.q_seqlen != shape.seqlen:
        return {"attn_mask": bottom_right_causal_mask(shape)}
    return {"is_causal": shape.causal}


def _build_sdpa(shape: Shape) -> AttentionFn:
    # enable_gqa only where K/V have fewer heads: torch before 2.5 does not take the argument.
    arguments = {**_sdpa_mask(shape), **({"enable_gqa": True} if shape.kv_heads != shape.nheads else {})}

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(*_heads_first(q, k, v), **arguments).transpose(1, 2)

    return attention


def _math_fits(shape: Shape, pass_: str) -> str | None:
    """The math backend materializes the scores: keep it to sizes where that is cheap."""
    nbytes = shape.batch * shape.nheads * shape.q_seqlen * shape.seqlen * shape.torch_dtype.itemsize
    if nbytes <= MATH_MAX_SCORES_BYTES:
        return None
    return f"math SDPA only runs where its scores fit in {MATH_MAX_SCORES_BYTES >> 30} GiB (needs {nbytes >> 30} GiB)"


def _sdpa(kind: str) -> Backend:
    def forced() -> AbstractContextManager:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[kind]))

    supports = _dense_only(SDPA_PACKED, _contiguous_only(SDPA_PAGED, _math_fits if kind == "math" else _supports_all))
    supports = _refusing("softcap", lambda shape: shape.softcap > 0, SDPA_SOFTCAP, supports)
    supports = _refusing("learnable sink", lambda shape: shape.sink, SDPA_SINK, supports)
    supports = _refusing("ALiBi", lambda shape: shape.alibi, SDPA_ALIBI, supports)
    if kind == "flash":
        apart = "v head dim apart from q's"
        supports = _refusing(apart, lambda shape: shape.headdim_v is not None, SDPA_FLASH_HEADDIM_V, supports)
    return Backend(f"sdpa-{kind}", _build_sdpa, supports=supports, context=forced)


# ---- FlexAttention -------------------------------------------------------------------------------------------------


def _flex_available() -> str | None:
    return None if importlib.util.find_spec("triton") else "triton is not installed"


def _causal_mask(offset: int) -> Callable[..., torch.Tensor]:
    """flex's mask_mod for the bottom-right causal rule: query i sees key j iff j <= i + offset, offset = seqlen_k -
    seqlen_q."""

    def causal(batch_idx: torch.Tensor, head_idx: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor):
        return q_idx + offset >= kv_idx

    return causal


def flex_score_mod(shape: Shape, device: torch.device | str) -> Callable[..., torch.Tensor] | None:
    """flex's score_mod for the shape's softcap and ALiBi, in the reference's order: the cap, then the bias -slope[h]
    * |i + offset - j|, offset = seqlen_k - seqlen_q, slopes on ``device``; None for plain scores. Its score is
    already softmax_scale * q.k."""
    cap, offset = shape.softcap, shape.seqlen - shape.q_seqlen
    slopes = score_tensors(shape, device).get("alibi_slopes")
    if not cap and slopes is None:
        return None

    def modified(score: torch.Tensor, batch_idx, head_idx, q_idx, kv_idx) -> torch.Tensor:
        if cap:
            score = cap * torch.tanh(score / cap)
        if slopes is not None:
            score = score - slopes[head_idx] * (q_idx + offset - kv_idx).abs()
        return score

    return modified


def _build_flex(shape: Shape) -> AttentionFn:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # A fresh compile per shape: with a whole sweep's shapes in one dynamo cache, the recompile limit would send
    # later shapes to flex_attention's eager path, which materializes the scores.
    torch._dynamo.reset()
    attend = torch.compile(flex_attention, dynamic=False)
    arguments = {"enable_gqa": True} if shape.kv_heads != shape.nheads else {}
    if modified := flex_score_mod(shape, "cuda"):
        arguments["score_mod"] = modified
    if shape.causal:
        mask = _causal_mask(shape.seqlen - shape.q_seqlen)
        arguments["block_mask"] = create_block_mask(mask, None, None, shape.q_seqlen, shape.seqlen, device="cuda")

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attend(*_heads_first(q, k, v), **arguments).transpose(1, 2)

    return attention


# ---- selection -----------------------------------------------------------------------------------------------------


def registry(decode: bool = False) -> dict[str, Backend]:
    """Every backend this process knows, flashcute first, in the order tables and plots show them; with ``decode``
    also the backends that only time decode shapes."""
    flex_supports = _refusing(
        "learnable sink", lambda shape: shape.sink, FLEX_SINK, _dense_only(FLEX_PACKED, _contiguous_only(FLEX_PAGED))
    )
    fa4_supports = _refusing("ALiBi", lambda shape: shape.alibi, FA4_ALIBI)
    backends = [
        *_flashcute_backends(decode),
        Backend("fa4", _build_fa4, supports=fa4_supports, available=_fa4_available),
        _sdpa("cudnn"),
        _sdpa("flash"),
        _sdpa("efficient"),
        Backend("flex", _build_flex, supports=flex_supports, available=_flex_available),
        _sdpa("math"),
    ]
    return {backend.name: backend for backend in backends}


def select_backends(names: str | None, decode: bool = False) -> tuple[list[Backend], dict[str, str]]:
    """The backends to sweep (``decode``: a sweep of decode shapes), and those skipped with why.

    names=None takes every available backend and skips the others. A comma list takes exactly those names: an
    unknown or unavailable one stays in the sweep and refuses every row with the reason, so the report shows it.
    """
    known = registry(decode)
    if names is None:
        reasons = {name: backend.available() for name, backend in known.items() if backend.by_default}
        selected = [backend for name, backend in known.items() if name in reasons and reasons[name] is None]
        return selected, {name: reason for name, reason in reasons.items() if reason is not None}
    unknown = f"unknown backend; known: {', '.join(known)}"
    chosen = [known.get(name) or _unavailable(name, unknown) for name in _split(names)]
    return [_unavailable(b.name, reason) if (reason := b.available()) else b for b in chosen], {}


def _split(names: str) -> list[str]:
    return list(dict.fromkeys(name.strip() for name in names.split(",") if name.strip()))
