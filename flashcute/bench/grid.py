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
TOKENS = 16384
"""batch · seqlen in the default grid, so every shape moves the same number of tokens."""
HIDDEN = 2048
"""nheads · headdim in the default grid."""


@dataclass(frozen=True)
class Shape:
    """One attention problem: q, k, v are (batch, seqlen, nheads, headdim) of `dtype`.

    A packed batch (`lengths` given) holds batch = len(lengths) sequences of those lengths, one after another, in q,
    k, v of (sum(lengths), nheads, headdim), for flash_attn_varlen_func; its seqlen is the longest sequence (the
    call's max_seqlen).
    """

    dtype: str
    headdim: int
    causal: bool
    seqlen: int
    batch: int
    nheads: int
    lengths: tuple[int, ...] = ()
    """A packed batch's sequence lengths; empty for a dense batch."""

    @property
    def group(self) -> tuple[str, int, bool]:
        """Shapes that differ only in size (seqlen, batch, packing) share a group: one table, one plot."""
        return (self.dtype, self.headdim, self.causal)

    @property
    def packed(self) -> bool:
        return bool(self.lengths)

    @property
    def tokens(self) -> int:
        """Rows of q: every sequence's tokens."""
        return sum(self.lengths) if self.packed else self.batch * self.seqlen

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, DTYPES[self.dtype])

    def flops(self, pass_: str) -> float:
        """A packed batch's FLOPs are summed sequence by sequence: none between two sequences is attended."""
        if self.packed:
            return sum(attention_flops(1, self.nheads, n, n, self.headdim, self.causal, pass_) for n in self.lengths)
        return attention_flops(self.batch, self.nheads, self.seqlen, self.seqlen, self.headdim, self.causal, pass_)

    @property
    def length_label(self) -> str:
        """The sequence length: "4k"; a packed batch's range: "packed 587..8165"."""
        return f"packed {min(self.lengths)}..{max(self.lengths)}" if self.packed else seqlen_label(self.seqlen)

    def label(self) -> str:
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


def packed_lengths(tokens: int, min_len: int, max_len: int, seed: int) -> tuple[int, ...]:
    """Lengths drawn uniformly from [min_len, max_len] by random.Random(seed) until they hold `tokens`, the last one
    cut so that they sum to exactly `tokens` (so it alone may be shorter than min_len, never 0)."""
    rng = random.Random(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(rng.randint(min_len, max_len))
    lengths[-1] -= sum(lengths) - tokens
    return tuple(lengths)


def make_grid(spec: GridSpec | VarlenSpec) -> list[Shape]:
    """Every combination, grouped by (dtype, headdim, causal): with seqlen ascending inside a group, or for the
    packed case the packed batch, then the dense one."""
    if isinstance(spec, VarlenSpec):
        return _varlen_grid(spec)
    combos = itertools.product(spec.dtypes, spec.headdims, spec.causals, sorted(spec.seqlens))
    return [
        Shape(
            dtype=dtype,
            headdim=headdim,
            causal=causal,
            seqlen=seqlen,
            batch=spec.batch or max(1, TOKENS // seqlen),
            nheads=spec.nheads or max(1, HIDDEN // headdim),
        )
        for dtype, headdim, causal, seqlen in combos
    ]


def _varlen_grid(spec: VarlenSpec) -> list[Shape]:
    lengths = packed_lengths(spec.tokens, spec.min_len, spec.max_len, spec.seed)
    shapes = []
    for dtype, headdim, causal in itertools.product(spec.dtypes, spec.headdims, spec.causals):
        packed = Shape(dtype, headdim, causal, max(lengths), len(lengths), spec.nheads, lengths)
        dense = Shape(dtype, headdim, causal, spec.tokens // spec.dense_batch, spec.dense_batch, spec.nheads)
        shapes += [packed, dense]
    return shapes


def seqlen_label(seqlen: int) -> str:
    """1024 -> "1k", 1000 -> "1000"."""
    return f"{seqlen // 1024}k" if seqlen % 1024 == 0 else str(seqlen)


def group_label(group: tuple[str, int, bool]) -> str:
    dtype, headdim, causal = group
    return f"{dtype} · D={headdim} · {'causal' if causal else 'non-causal'}"
