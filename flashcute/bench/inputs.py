"""Input tensors for a shape, rotated so that no call finds its inputs in L2 left there by an earlier call."""

import itertools
import math
from dataclasses import dataclass

import torch

from flashcute.bench.grid import Shape

DEFAULT_L2_BYTES = 64 << 20
MAX_SETS = 32
BLOCK_TABLE_SEED = 0
"""Seeds the paged caches' block tables: every run and every input set of a shape read the same pages."""


@dataclass(frozen=True)
class InputSet:
    """q, k, v: (batch, seqlen, nheads, headdim), or (tokens, nheads, headdim) for a packed shape, or for a decode
    shape q (batch, seqlen_q, nheads, headdim) and k, v its cache, (batch, seqlen, nheads_k, headdim) or pages
    (num_pages, page_size, nheads_k, headdim); v (and so out) of the shape's v_headdim in place of headdim. dout:
    the output's gradient, out's shape, for passes with a backward."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor | None = None


def make_inputs(shape: Shape, with_grad: bool, device: str = "cuda") -> InputSet:
    """Standard normal inputs (never zeros: a kernel that writes nothing must not pass the check)."""
    if shape.packed:
        q_rows = kv_rows = (shape.tokens,)
    elif shape.paged:
        q_rows, kv_rows = (shape.batch, shape.q_seqlen), (shape.num_pages, shape.page_size)
    else:
        q_rows, kv_rows = (shape.batch, shape.q_seqlen), (shape.batch, shape.seqlen)
    q_size, k_size = (*q_rows, shape.nheads, shape.headdim), (*kv_rows, shape.kv_heads, shape.headdim)
    v_size, out_size = (*kv_rows, shape.kv_heads, shape.v_headdim), (*q_rows, shape.nheads, shape.v_headdim)

    def randn(size: tuple[int, ...], requires_grad: bool) -> torch.Tensor:
        return torch.randn(size, dtype=shape.torch_dtype, device=device, requires_grad=requires_grad)

    q, k, v = randn(q_size, with_grad), randn(k_size, with_grad), randn(v_size, with_grad)
    return InputSet(q, k, v, randn(out_size, False) if with_grad else None)


def cu_seqlens(shape: Shape, device: str = "cuda") -> torch.Tensor:
    """A packed shape's sequence starts and the end, int32 (batch + 1,): flash_attn_varlen_func's cu_seqlens."""
    return torch.tensor([0, *itertools.accumulate(shape.lengths)], dtype=torch.int32, device=device)


def block_table(shape: Shape, device: str | torch.device = "cuda") -> torch.Tensor:
    """A paged shape's block table, int32 (batch, seqlen // page_size): sequence b's position p lies in page
    table[b, p // page_size]. The pages are a random permutation of all of them (BLOCK_TABLE_SEED), so that a
    sequence's pages lie scattered over the cache as a serving engine's do after a while."""
    generator = torch.Generator().manual_seed(BLOCK_TABLE_SEED)
    pages = torch.randperm(shape.num_pages, generator=generator, dtype=torch.int32)
    return pages.view(shape.batch, -1).to(device)


def bottom_right_causal_mask(shape: Shape, device: str | torch.device = "cuda") -> torch.Tensor:
    """Boolean (seqlen_q, seqlen), True where query i sees key j: j <= i + seqlen - seqlen_q (flash_attn's causal
    rule, for backends whose own causal flag aligns the diagonal top-left)."""
    visible = torch.ones(shape.q_seqlen, shape.seqlen, dtype=torch.bool, device=device)
    return visible.tril(diagonal=shape.seqlen - shape.q_seqlen)


def l2_bytes() -> int:
    """The current GPU's L2 size (about 50-60 MB on H100/H200); a conservative guess where torch cannot say."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES


def rotation_count(set_bytes: int, l2: int) -> int:
    """Sets to cycle through so that the others touched between two uses of a set fill L2: 1 + ceil(L2 / set)."""
    return min(MAX_SETS, 1 + math.ceil(l2 / set_bytes))


def touched_bytes(inputs: InputSet) -> int:
    """Bytes a pass reads and writes: q, k, v and out (q's rows and heads at v's head dim), plus dout, dq, dk and
    dv with a backward."""
    out_bytes = inputs.q.nbytes // inputs.q.shape[-1] * inputs.v.shape[-1]
    tensor_bytes = inputs.q.nbytes + inputs.k.nbytes + inputs.v.nbytes + out_bytes
    return tensor_bytes * (1 if inputs.dout is None else 2)


def make_rotation(shape: Shape, with_grad: bool) -> list[InputSet]:
    first = make_inputs(shape, with_grad)
    count = rotation_count(touched_bytes(first), l2_bytes())
    return [first, *(make_inputs(shape, with_grad) for _ in range(count - 1))]
