"""The sweep's problem shapes: the default grid of design.md, narrowed or overridden by flags. No torch at import,
so that the commands' flags parse without loading it."""

from __future__ import annotations

import itertools
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
    """One attention problem: q, k, v are (batch, seqlen, nheads, headdim) of `dtype`."""

    dtype: str
    headdim: int
    causal: bool
    seqlen: int
    batch: int
    nheads: int

    @property
    def group(self) -> tuple[str, int, bool]:
        """Shapes that differ only in seqlen (and so batch) share a group: one table, one plot, one check."""
        return (self.dtype, self.headdim, self.causal)

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, DTYPES[self.dtype])

    def flops(self, pass_: str) -> float:
        return attention_flops(self.batch, self.nheads, self.seqlen, self.seqlen, self.headdim, self.causal, pass_)

    def label(self) -> str:
        return f"{group_label(self.group)} · L={seqlen_label(self.seqlen)} B={self.batch} H={self.nheads}"


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


def make_grid(spec: GridSpec) -> list[Shape]:
    """Every combination, grouped by (dtype, headdim, causal) with seqlen ascending inside a group."""
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


def seqlen_label(seqlen: int) -> str:
    """1024 -> "1k", 1000 -> "1000"."""
    return f"{seqlen // 1024}k" if seqlen % 1024 == 0 else str(seqlen)


def group_label(group: tuple[str, int, bool]) -> str:
    dtype, headdim, causal = group
    return f"{dtype} · D={headdim} · {'causal' if causal else 'non-causal'}"
