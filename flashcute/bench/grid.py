"""The sweep's problem shapes: the default grid of design.md, narrowed or overridden by flags. No torch at import,
so that the commands' flags parse without loading it."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flashcute.bench.flops import attention_flops

if TYPE_CHECKING:
    import torch

DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
"""The grid's dtypes by short name, with the name torch and the kernels' configs give each."""
ELEMENT_BYTES = {"bf16": 2, "fp16": 2}
"""Bytes of one element of each dtype, for bandwidth figures without loading torch."""
TOKENS = 16384
"""batch · seqlen in the default grid, so every shape moves the same number of tokens."""
HIDDEN = 2048
"""nheads · headdim in the default grid."""

Scores = tuple[float, bool, bool]
"""A shape's score variants: (softcap, sink, alibi)."""
Variants = tuple[float, bool, bool, int | None]
"""How a shape departs from plain attention: its score variants and v's head dim, (softcap, sink, alibi, headdim_v),
headdim_v None where v has q's head dim."""
Group = tuple[str, int, bool | None, Variants]
"""What the shapes of one table and plot share: (dtype, headdim, causal or None for decode shapes, variants)."""


@dataclass(frozen=True)
class Shape:
    """One attention problem: q is (batch, seqlen_q, nheads, headdim), k is (batch, seqlen, nheads_k, headdim) and
    v (batch, seqlen, nheads_k, headdim_v), of `dtype`; seqlen_q, nheads_k and headdim_v default to seqlen, nheads
    and headdim (self-attention, as many K/V heads as query heads, v as wide as q and k). out is v's width.

    A packed batch (`lengths` given) holds batch = len(lengths) sequences of those lengths, one after another, in q,
    k, v of (sum(lengths), nheads, headdim), for flash_attn_varlen_func; its seqlen is the longest sequence (the
    call's max_seqlen).

    A decode shape (`seqlen_q` given) is one step of incremental decoding: seqlen_q new query rows per sequence
    attend to a cache of seqlen keys, for flash_attn_with_kvcache. With `page_size` the cache is paged: k and v are
    (num_pages, page_size, nheads_k, headdim), and `inputs.block_table` maps each sequence's positions to pages.
    """

    dtype: str
    headdim: int
    causal: bool
    seqlen: int
    batch: int
    nheads: int
    lengths: tuple[int, ...] = ()
    """A packed batch's sequence lengths; empty for a dense batch."""
    seqlen_q: int | None = None
    """A decode shape's query rows per sequence; None: seqlen (self-attention)."""
    nheads_k: int | None = None
    """K/V heads (grouped-query attention: query head h reads K/V head h // (nheads // nheads_k)); None: nheads."""
    page_size: int = 0
    """A decode shape's cache page size; 0: a contiguous cache."""
    softcap: float = 0.0
    """Scores capped to softcap * tanh(score / softcap) (Gemma 2); 0: not capped."""
    sink: bool = False
    """A learnable sink: one logit per query head in every row's softmax denominator (gpt-oss)."""
    alibi: bool = False
    """The ALiBi bias -slope * |i + seqlen_k - seqlen_q - j| on the scores, a slope per query head."""
    headdim_v: int | None = None
    """v's (and out's) head dim where it differs from q's and k's (DeepSeek-style: 192 and 128); None: headdim."""

    @property
    def scores(self) -> Scores:
        """The score variants: (softcap, sink, alibi)."""
        return (self.softcap, self.sink, self.alibi)

    @property
    def variants(self) -> Variants:
        """The score variants and v's own head dim: (softcap, sink, alibi, headdim_v)."""
        return (*self.scores, self.headdim_v)

    @property
    def group(self) -> Group:
        """Shapes that differ only in size (seqlen, batch, packing) share a group: one table, one plot. Decode
        shapes of a dtype and head dim share one group whatever their mask (None): one table of decode steps."""
        return (self.dtype, self.headdim, None if self.decode else self.causal, self.variants)

    @property
    def packed(self) -> bool:
        return bool(self.lengths)

    @property
    def decode(self) -> bool:
        return self.seqlen_q is not None

    @property
    def paged(self) -> bool:
        return self.page_size > 0

    @property
    def num_pages(self) -> int:
        """A paged cache's pages: each sequence's seqlen keys, page_size to a page."""
        return self.batch * self.seqlen // self.page_size

    @property
    def q_seqlen(self) -> int:
        """Query rows per sequence."""
        return self.seqlen if self.seqlen_q is None else self.seqlen_q

    @property
    def kv_heads(self) -> int:
        return self.nheads if self.nheads_k is None else self.nheads_k

    @property
    def v_headdim(self) -> int:
        """v's head dim, the width of out."""
        return self.headdim if self.headdim_v is None else self.headdim_v

    @property
    def tokens(self) -> int:
        """Rows of q: every sequence's tokens."""
        return sum(self.lengths) if self.packed else self.batch * self.q_seqlen

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V: what a decode step must read, whatever else it does."""
        keys = sum(self.lengths) if self.packed else self.batch * self.seqlen
        return keys * self.kv_heads * (self.headdim + self.v_headdim) * ELEMENT_BYTES[self.dtype]

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, DTYPES[self.dtype])

    def flops(self, pass_: str) -> float:
        """A packed batch's FLOPs are summed sequence by sequence: none between two sequences is attended."""
        dims = {"headdim": self.headdim, "causal": self.causal, "pass_": pass_, "headdim_v": self.headdim_v}
        if self.packed:
            return sum(attention_flops(1, self.nheads, n, n, **dims) for n in self.lengths)
        return attention_flops(self.batch, self.nheads, self.q_seqlen, self.seqlen, **dims)

    @property
    def length_label(self) -> str:
        """The sequence length: "4k"; a packed batch's range: "packed 587..8165"; a decode shape's query rows and
        cache: "Lq=1 Lk=32k"."""
        if self.decode:
            return f"Lq={self.q_seqlen} Lk={seqlen_label(self.seqlen)}"
        return f"packed {min(self.lengths)}..{max(self.lengths)}" if self.packed else seqlen_label(self.seqlen)

    @property
    def size_label(self) -> str:
        """What tells the shape apart within its group: "L=4k"; for a decode shape "Lq=4 Lk=32k B=8 H=32/8 page 64
        causal" (its group holds both masks)."""
        if not self.decode:
            return f"L={self.length_label}"
        return self._decode_size + (" causal" if self.causal else "")

    @property
    def _decode_size(self) -> str:
        page = f" page {self.page_size}" if self.paged else ""
        return f"{self.length_label} B={self.batch} H={self.nheads}/{self.kv_heads}{page}"

    def label(self) -> str:
        if self.decode:
            return f"{group_label((self.dtype, self.headdim, self.causal, self.variants))} · {self._decode_size}"
        tokens = f" ({self.tokens} tokens)" if self.packed else ""
        return f"{group_label(self.group)} · L={self.length_label} B={self.batch}{tokens} H={self.nheads}"


@dataclass(frozen=True)
class GridSpec:
    """What to sweep; batch and nheads of None follow TOKENS and HIDDEN."""

    dtypes: tuple[str, ...] = ("bf16", "fp16")
    headdims: tuple[int, ...] = (64, 128, 256)
    causals: tuple[bool, ...] = (False, True)
    seqlens: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384)
    batch: int | None = None
    nheads: int | None = None
    softcaps: tuple[float, ...] = (0.0,)
    sinks: tuple[bool, ...] = (False,)
    """Without (False) and with (True) a learnable sink."""
    alibis: tuple[bool, ...] = (False,)
    """Without (False) and with (True) the ALiBi bias."""
    headdims_v: tuple[int, ...] = ()
    """v's head dim for each of headdims in order, or one for all of them; empty: v as wide as q and k."""


FULL = GridSpec()
QUICK = GridSpec(dtypes=("bf16",), headdims=(64, 128), seqlens=(512, 1024), batch=2, nheads=4)


@dataclass(frozen=True)
class VarlenSpec:
    """The packed variable-length case: per dtype, head dim and mask, `tokens` tokens packed in one batch of
    sequences of random lengths (`packed_lengths`), then as many tokens as `dense_batch` sequences of one length, so
    that one flash_attn_varlen_func call stands beside the dense call that moves the same tokens."""

    dtypes: tuple[str, ...] = ("bf16",)
    headdims: tuple[int, ...] = (128,)
    causals: tuple[bool, ...] = (False, True)
    tokens: int = 65536
    min_len: int = 256
    max_len: int = 8192
    dense_batch: int = 16
    nheads: int = 16
    seed: int = 0


VARLEN = VarlenSpec()
VARLEN_QUICK = VarlenSpec(tokens=4096, min_len=64, max_len=1024, dense_batch=4, nheads=4)


@dataclass(frozen=True)
class DecodePoint:
    """One decode shape of a DecodeSpec: seqlen_q query rows per sequence over a cache of seqlen_k keys."""

    seqlen_q: int
    seqlen_k: int
    batch: int
    causal: bool = False
    page_size: int = 0
    """0: a contiguous cache."""


@dataclass(frozen=True)
class DecodeSpec:
    """The decoding case: per dtype and head dim, each of `points` with nheads query heads over nheads_k K/V heads;
    `causals` keeps the points of those masks."""

    dtypes: tuple[str, ...] = ("bf16",)
    headdims: tuple[int, ...] = (128,)
    causals: tuple[bool, ...] = (False, True)
    nheads: int = 32
    nheads_k: int = 8
    points: tuple[DecodePoint, ...] = (
        DecodePoint(1, 4096, 8),
        DecodePoint(1, 32768, 8),
        DecodePoint(1, 131072, 8),
        DecodePoint(1, 131072, 1),
        DecodePoint(4, 32768, 8, causal=True),  # speculative decoding: a few draft tokens checked at once
        *(DecodePoint(1, 32768, 8, page_size=page) for page in (16, 64, 256)),
    )


DECODE = DecodeSpec()
DECODE_QUICK = DecodeSpec(
    nheads=8,
    nheads_k=2,
    points=(
        DecodePoint(1, 1024, 2),
        DecodePoint(1, 4096, 2),
        DecodePoint(4, 1024, 2, causal=True),
        DecodePoint(1, 4096, 2, page_size=64),
    ),
)


def packed_lengths(tokens: int, min_len: int, max_len: int, seed: int) -> tuple[int, ...]:
    """Lengths drawn uniformly from [min_len, max_len] by random.Random(seed) until they hold `tokens`, the last one
    cut so that they sum to exactly `tokens` (so it alone may be shorter than min_len, never 0)."""
    rng = random.Random(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(rng.randint(min_len, max_len))
    lengths[-1] -= sum(lengths) - tokens
    return tuple(lengths)


def make_grid(spec: GridSpec | VarlenSpec | DecodeSpec) -> list[Shape]:
    """Every combination, grouped by score variants (the plain grid first), then (dtype, head dims, causal): with
    seqlen ascending inside a group, or for the packed case the packed batch, then the dense one; decode shapes
    grouped by (dtype, headdim), in the order of the spec's points."""
    if isinstance(spec, VarlenSpec):
        return _varlen_grid(spec)
    if isinstance(spec, DecodeSpec):
        return _decode_grid(spec)
    variants = itertools.product(spec.softcaps, spec.sinks, spec.alibis)
    combos = itertools.product(variants, spec.dtypes, headdim_pairs(spec), spec.causals, sorted(spec.seqlens))
    return [
        Shape(
            dtype=dtype,
            headdim=headdim,
            causal=causal,
            seqlen=seqlen,
            batch=spec.batch or max(1, TOKENS // seqlen),
            nheads=spec.nheads or max(1, HIDDEN // headdim),
            softcap=softcap,
            sink=sink,
            alibi=alibi,
            headdim_v=headdim_v,
        )
        for (softcap, sink, alibi), dtype, (headdim, headdim_v), causal, seqlen in combos
    ]


def headdim_pairs(spec: GridSpec) -> list[tuple[int, int | None]]:
    """(headdim, headdim_v) for each of spec.headdims: headdims_v paired with them in order (one value: for all),
    headdim_v None where v is as wide as q, so that such a shape equals one of a grid without headdims_v."""
    widths = spec.headdims_v * len(spec.headdims) if len(spec.headdims_v) == 1 else spec.headdims_v
    if not widths:
        return [(headdim, None) for headdim in spec.headdims]
    if len(widths) != len(spec.headdims):
        raise ValueError(
            f"headdims_v {spec.headdims_v} pairs with headdims {spec.headdims}: give one, or one per head dim"
        )
    pairs = ((d, None if dv == d else dv) for d, dv in zip(spec.headdims, widths, strict=True))
    return list(dict.fromkeys(pairs))


def _varlen_grid(spec: VarlenSpec) -> list[Shape]:
    lengths = packed_lengths(spec.tokens, spec.min_len, spec.max_len, spec.seed)
    shapes = []
    for dtype, headdim, causal in itertools.product(spec.dtypes, spec.headdims, spec.causals):
        packed = Shape(dtype, headdim, causal, max(lengths), len(lengths), spec.nheads, lengths)
        dense = Shape(dtype, headdim, causal, spec.tokens // spec.dense_batch, spec.dense_batch, spec.nheads)
        shapes += [packed, dense]
    return shapes


def _decode_grid(spec: DecodeSpec) -> list[Shape]:
    return [
        Shape(
            dtype=dtype,
            headdim=headdim,
            causal=point.causal,
            seqlen=point.seqlen_k,
            batch=point.batch,
            nheads=spec.nheads,
            seqlen_q=point.seqlen_q,
            nheads_k=spec.nheads_k,
            page_size=point.page_size,
        )
        for dtype, headdim in itertools.product(spec.dtypes, spec.headdims)
        for point in spec.points
        if point.causal in spec.causals
    ]


def seqlen_label(seqlen: int) -> str:
    """1024 -> "1k", 1000 -> "1000"."""
    return f"{seqlen // 1024}k" if seqlen % 1024 == 0 else str(seqlen)


def headdim_name(headdim: int, headdim_v: int | None) -> str:
    """The head dims as file names (and the kernels' configs) name them: "d128"; with v's own "d192v128"."""
    return f"d{headdim}" if headdim_v is None else f"d{headdim}v{headdim_v}"


def group_label(group: Group) -> str:
    """A group's title: "bf16 · D=128 · causal", then its score variants ("· softcap 30 · sink · alibi"); with v's
    own head dim "bf16 · d192v128 · causal"; for the decode shapes' group (mask None) "bf16 · D=128 · decode"."""
    dtype, headdim, causal, (softcap, sink, alibi, headdim_v) = group
    mask = "decode" if causal is None else "causal" if causal else "non-causal"
    dims = f"D={headdim}" if headdim_v is None else headdim_name(headdim, headdim_v)
    return " · ".join([dtype, dims, mask, *variant_names((softcap, sink, alibi))])


def variant_names(scores: Scores) -> list[str]:
    """The score variants that are on, as labels and file names show them: "softcap 30", "sink", "alibi"."""
    softcap, sink, alibi = scores
    names = [f"softcap {softcap:g}"] if softcap else []
    return names + (["sink"] if sink else []) + (["alibi"] if alibi else [])
