"""Shared test helpers: the seed's worked example, random attention problems, and design.md's error budget."""

from __future__ import annotations

import itertools
import math
import os
import random
import zlib
from dataclasses import dataclass
from fractions import Fraction

import pytest
import torch
from hypothesis import strategies as st

from flashcute.cli import main
from flashcute.reference import attention_ref, attention_same_precision, attention_varlen_ref

LN2 = math.log(2)

# The seed article's worked example (Fig. 2-4), one batch, one head: (batch, seqlen, nheads, headdim).
SEED_Q = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)[None, :, None, :]
SEED_K = torch.tensor([[0.0, 1.0], [1.0, 0.0], [2.0, 1.0], [0.0, 2.0]], dtype=torch.float64)[None, :, None, :]
SEED_V = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.0]], dtype=torch.float64)[None, :, None, :]
SEED_OUT = [[Fraction(7, 8), Fraction(3, 4)], [Fraction(4, 3), Fraction(1, 3)]]
SEED_LSE_ARG = [8, 9]  # LSE = (ln 8, ln 9)
SEED_CAUSAL_OUT = [[1, 0], [Fraction(2, 3), Fraction(1, 3)]]  # top-left causal: row 0 sees key 0, row 1 keys 0-1
SEED_CAUSAL_LSE_ARG = [1, 3]


@dataclass(frozen=True)
class Problem:
    """Sizes, options and a seed for random inputs: one attention call."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_k: int
    headdim: int
    seed: int
    options: dict

    def tensors(self, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed)
        shapes = [
            (self.batch, self.seqlen_q, self.nheads, self.headdim),
            (self.batch, self.seqlen_k, self.nheads_k, self.headdim),
            (self.batch, self.seqlen_k, self.nheads_k, self.headdim),
        ]
        return tuple(
            torch.randn(shape, generator=generator, dtype=torch.float64).mul(1.5).to(dtype) for shape in shapes
        )


# A sink's logit: mostly near the scores, sometimes far below them, or -inf (a sink that adds nothing).
SINK_VALUES = st.one_of(st.floats(-4, 4), st.sampled_from([-30.0, -math.inf]))


@st.composite
def problems(
    draw: st.DrawFn,
    max_seqlen: int = 12,
    masks: bool = True,
    softcap: bool = True,
    sinks: bool = False,
    alibi: bool = False,
) -> Problem:
    """Small problems hitting seqlen 1, odd lengths, seqlen_q != seqlen_k both ways, GQA, causal, windows; with
    ``sinks`` / ``alibi``, half of them also get a float32 learnable_sink (nheads,) / alibi_slopes of shape
    (nheads,) or (batch, nheads)."""
    nheads_k = draw(st.integers(1, 2))
    options = {"softmax_scale": draw(st.sampled_from([None, 0.4, 1.3]))}
    if masks:
        options["causal"] = draw(st.booleans())
        options["causal_align"] = draw(st.sampled_from(["bottom_right", "top_left"]))
        options["window_size"] = (draw(st.integers(-1, 5)), draw(st.integers(-1, 5)))
    if softcap:
        options["softcap"] = draw(st.sampled_from([0.0, 0.0, 2.5]))
    batch = draw(st.integers(1, 2))
    seqlen_q, seqlen_k = draw(st.integers(1, max_seqlen)), draw(st.integers(1, max_seqlen))
    nheads = nheads_k * draw(st.integers(1, 3))
    headdim, seed = draw(st.integers(1, 5)), draw(st.integers(0, 2**31 - 1))
    if sinks and draw(st.booleans()):
        values = draw(st.lists(SINK_VALUES, min_size=nheads, max_size=nheads))
        options["learnable_sink"] = torch.tensor(values, dtype=torch.float32)
    if alibi and draw(st.booleans()):
        shape = draw(st.sampled_from([(nheads,), (batch, nheads)]))
        values = draw(st.lists(st.floats(0, 1.5), min_size=math.prod(shape), max_size=math.prod(shape)))
        options["alibi_slopes"] = torch.tensor(values, dtype=torch.float32).reshape(shape)
    return Problem(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, seed, options)


def max_error_limit(base_err: float, spec: torch.Tensor, dtype: torch.dtype, atol: float) -> float:
    """design.md's budget for a max abs error: twice the same-precision baseline's, + atol, + the error of the spec
    itself rounded to ``dtype``, which an exact kernel would show too (docs/numerics.md, the error budget)."""
    return 2 * base_err + atol + (spec.to(dtype).double() - spec).abs().max().item()


def check_against_spec(out, lse, q, k, v, atol=1e-4, **options) -> None:
    """Error of ``out`` against the float64 spec must be <= 2x the same-precision baseline's, + atol (the max abs
    error also + the spec's own rounding: max_error_limit); LSE too."""
    ref, ref_lse = attention_ref(q, k, v, return_lse=True, **options)
    base = attention_same_precision(q, k, v, **options)
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert not out.isnan().any(), f"{out.isnan().sum().item()} NaN outputs (unwritten or wrong)"
    err = (out.double() - ref).abs().max().item()
    base_err = (base.double() - ref).abs().max().item()
    limit = max_error_limit(base_err, ref, out.dtype, atol)
    assert err <= limit, f"max abs error {err:.3g} > {limit:.3g} (2 x baseline {base_err:.3g} + rounding + {atol})"
    ref_norm = ref.norm().item() or 1.0
    rel = (out.double() - ref).norm().item() / ref_norm
    base_rel = (base.double() - ref).norm().item() / ref_norm
    assert rel <= 2 * base_rel + atol, f"relative L2 error {rel:.3g} > 2 x baseline {base_rel:.3g} + {atol}"
    if lse is not None:
        assert lse.shape == ref_lse.shape and lse.dtype == torch.float32
        empty = ref_lse == -math.inf
        assert torch.equal(lse[empty], ref_lse[empty].float()), "rows that see no key must have LSE = -inf"
        lse_err = ((lse.double() - ref_lse).abs() / (1 + ref_lse.abs()))[~empty]
        assert lse_err.numel() == 0 or lse_err.max().item() < 1e-4, f"LSE error {lse_err.max().item():.3g}"


def check_forward(q, k, v, kernel, **options) -> None:
    """One forward launch of ``kernel`` into NaN-poisoned outputs, with every option flash_attn_func takes (softcap,
    learnable_sink, alibi_slopes and the mask ones), against the float64 spec (check_against_spec)."""
    from flashcute.interface import kernel_window, launch_fwd
    from flashcute.validation import validate_attention_args

    args = validate_attention_args(q, k, v, **options)
    out = q.new_full((*q.shape[:-1], v.shape[-1]), math.nan)
    lse = torch.full((args.batch, args.nheads, args.seqlen_q), math.nan, device=q.device)
    scalars = (args.softmax_scale, args.diagonal_offset, *kernel_window(args))
    launch_fwd(q, k, v, out, lse, *scalars, kernel, args.softcap, args.learnable_sink, args.alibi_slopes)
    check_against_spec(out, lse, q, k, v, **options)


@dataclass(frozen=True)
class GpuCase:
    """One random GPU attention call (random_gpu_cases): sizes, dtype, options, and whether q is a strided slice."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_k: int
    head_dim: int
    dtype: torch.dtype
    options: dict
    q_strided: bool

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        sizes = f"b{self.batch}-q{self.seqlen_q}-k{self.seqlen_k}-h{self.nheads}x{self.nheads_k}-d{self.head_dim}"
        opts = "-".join(f"{key}={value}" for key, value in self.options.items())
        return f"{dtype}-{sizes}{'-strided' if self.q_strided else ''}{'-' + opts if opts else ''}"

    def tensors(self, device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (a head slice of a wider tensor when q_strided), k, v; seeded by the case, not by the test order."""
        generator = torch.Generator(device=device).manual_seed(zlib.crc32(str(self).encode()))

        def randn(*shape):
            return torch.randn(*shape, generator=generator, device=device, dtype=self.dtype)

        q_heads = self.nheads + (3 if self.q_strided else 0)
        q = randn(self.batch, self.seqlen_q, q_heads, self.head_dim)[:, :, : self.nheads]
        k, v = (randn(self.batch, self.seqlen_k, self.nheads_k, self.head_dim) for _ in "kv")
        return q, k, v


def random_gpu_cases(seed: int, count: int, max_seqlen: int, max_elements: int = 2**24) -> list[GpuCase]:
    """``count`` random calls that the fixed test grids do not pin down: seqlens from 1 to max_seqlen (half of them
    near a multiple of 64 or 128, the tile edges), any head dim that is a multiple of 8 up to 256, GQA groups of 1
    to 4, bottom-right or top-left causal, random windows, random softmax scales and softcaps, q as a strided
    slice; batch x seqlen x heads x head_dim of q kept under ``max_elements``. FLASHCUTE_TEST_SEED=N (an integer)
    draws another set: the seed becomes seed + N (the default set is N = 0)."""
    rng = random.Random(seed + int(os.environ.get("FLASHCUTE_TEST_SEED", "0")))

    def seqlen() -> int:
        if rng.random() < 0.5:
            edge = rng.choice((64, 128)) * rng.randint(1, max_seqlen // 128 + 1) + rng.randint(-2, 2)
            return max(1, min(max_seqlen, edge))
        return rng.randint(1, max_seqlen)

    cases = []
    while len(cases) < count:
        nheads_k = rng.randint(1, 3)
        options: dict = {}
        kind = rng.choice(("none", "causal", "window"))
        if kind == "causal":
            options["causal"] = True
        elif kind == "window":
            options["window_size"] = (rng.choice((-1, rng.randint(0, 300))), rng.choice((-1, rng.randint(0, 300))))
        if kind != "none" and rng.random() < 0.5:
            options["causal_align"] = "top_left"
        if rng.random() < 0.3:
            options["softmax_scale"] = round(rng.uniform(0.02, 0.5), 3)
        if rng.random() < 0.2:
            options["softcap"] = rng.choice((1.0, 8.0, 30.0))
        case = GpuCase(
            batch=rng.randint(1, 3),
            seqlen_q=seqlen(),
            seqlen_k=seqlen(),
            nheads=nheads_k * rng.randint(1, 4),
            nheads_k=nheads_k,
            head_dim=8 * rng.randint(1, 32),
            dtype=rng.choice((torch.bfloat16, torch.float16)),
            options=options,
            q_strided=rng.random() < 0.3,
        )
        if case.batch * case.seqlen_q * case.nheads * case.head_dim <= max_elements:
            cases.append(case)
    return cases


no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without a GPU")


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    """`flashcute ARGV...` in this process: (exit status, stdout, stderr)."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def time_on_the_cpu(monkeypatch, clock) -> None:
    """bench's sweep on CPU inputs with a stand-in GPU: torch.cuda.is_available() says True, a timing runs the step
    once and reads ``clock()``, a first call takes 5 ms, and the run's metadata names no GPU."""
    from flashcute.bench import meta, runner
    from flashcute.bench.inputs import make_inputs

    def gpu_time_ms(step, warmup_ms, rep_ms):
        step()
        return clock()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runner, "make_rotation", lambda shape, with_grad: [make_inputs(shape, with_grad, "cpu")])
    monkeypatch.setattr(runner, "wall_ms", lambda call: (5.0, call()))
    monkeypatch.setattr(runner, "gpu_time_ms", gpu_time_ms)
    monkeypatch.setattr(meta, "gpu", lambda: {"name": "a CPU stand-in"})


class PackedLaunchStandIn:
    """The packed-batch forward launch (interface.varlen_outputs) in float64 on the CPU, reading sequence b's rows
    as the kernels do: cu_seqlens[b] + [0, min(cu_seqlens[b + 1] - cu_seqlens[b], seqused[b])), which must lie
    inside the packed tensor and within max_seqlen; with ``pages`` (block_table, page_size, seq_rows), k and v are
    a cache's pages and row r of that numbering is position r % seq_rows of sequence r // seq_rows, in its page
    of block_table, which must be one of the cache's. Records each call's packed tensors, sequence lengths and
    maxima."""

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(
        self, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale,
        window_left, window_right, kernel, softcap=0.0, learnable_sink=None, alibi_slopes=None, *, pages=(),
    ):  # fmt: skip
        key_rows = k.shape[0] if not pages else pages[0].shape[0] * pages[2]
        lengths = []
        for cu, used, rows, longest in (
            (cu_seqlens_q, seqused_q, q.shape[0], max_seqlen_q),
            (cu_seqlens_k, seqused_k, key_rows, max_seqlen_k),
        ):
            starts = cu.tolist()
            spans = [end - start for start, end in itertools.pairwise(starts)]
            counts = [min(span, n) for span, n in zip(spans, spans if used is None else used.tolist(), strict=True)]
            for b, n in enumerate(counts):
                assert 0 <= n <= longest and starts[b] >= 0 and starts[b] + n <= rows, (b, starts, counts, rows)
            lengths.append(counts)
        self.calls.append({"q": q, "k": k, "v": v, "lengths_q": lengths[0], "lengths_k": lengths[1], "pages": pages,
                           "max_seqlens": (max_seqlen_q, max_seqlen_k)})  # fmt: skip
        if pages:
            k, v = read_pages(k, v, pages, cu_seqlens_k.tolist(), lengths[1])
        out, lse = attention_varlen_ref(
            q, k, v, cu_seqlens_q, cu_seqlens_k, *(torch.tensor(n, dtype=torch.int32) for n in lengths),
            softmax_scale, window_size=(window_left, window_right), softcap=softcap, learnable_sink=learnable_sink,
            alibi_slopes=alibi_slopes, return_lse=True,
        )  # fmt: skip
        return out.to(q.dtype), lse  # LSE kept in float64 (the kernels' is float32): the splits merge exactly


def read_pages(k, v, pages: tuple, starts: list[int], counts: list[int]) -> tuple:
    """k and v in the rows of the launch's numbering (PackedLaunchStandIn), from a cache's pages: the rows that
    the sequences read, each checked to lie in one of the cache's pages; the others zero."""
    table, page_size, seq_rows = pages
    rows = torch.zeros(table.shape[0] * seq_rows, dtype=torch.long)
    read = torch.zeros_like(rows, dtype=torch.bool)
    for start, count in zip(starts, counts, strict=False):
        for r in range(start, start + count):
            b, position = divmod(r, seq_rows)
            page = int(table[b, position // page_size])
            assert 0 <= page * page_size < k.shape[0], f"row {r}: sequence {b}'s page {page} is not the cache's"
            rows[r], read[r] = page * page_size + position % page_size, True
    return tuple(torch.where(read[:, None, None], t[rows], torch.zeros_like(t[rows])) for t in (k, v))


def combine_plainly(partial_out, partial_lse, out, lse, sink=None) -> None:
    """prepost.combine's result in float64: partial_out (batch, splits, rows, nheads_k, headdim) and partial_lse
    (nheads_k, batch, splits, rows) merged by their LSE weights into out (batch * seqlen_q, group, nheads_k,
    headdim) and lse (batch, nheads_k, group, seqlen_q), a row being (position, head in the group); a sink
    (nheads_k, group) joins as one more split with O = 0."""
    batch, _, rows, nheads_k, headdim = partial_out.shape
    lse_s = partial_lse.permute(1, 2, 3, 0).double()  # (batch, splits, rows, nheads_k)
    if sink is not None:
        sink_rows = sink.double().t().repeat(rows // sink.shape[1], 1)  # row (position, g) -> sink[:, g]
        lse_s = torch.cat([lse_s, sink_rows.expand(batch, 1, rows, nheads_k)], dim=1)
        partial_out = torch.cat([partial_out, partial_out.new_zeros(batch, 1, rows, nheads_k, headdim)], dim=1)
    total = torch.logsumexp(lse_s, dim=1)
    weights = torch.exp(lse_s - total[:, None]).nan_to_num(0.0)  # a row no split saw: 0, not NaN
    merged = (weights[..., None] * partial_out.double()).sum(1)
    group, seqlen_q = out.shape[1], lse.shape[3]
    out.copy_(merged.reshape(batch * seqlen_q, group, nheads_k, headdim))
    lse.copy_(total.view(batch, seqlen_q, group, nheads_k).permute(0, 3, 2, 1))


def chunk_counts(lengths: torch.Tensor, added: int, splits: int, chunk: int, tail=None) -> torch.Tensor:
    """The split-KV chunks' key counts that prepost.append writes: (batch, splits) int32, max(lengths[b] + added - s
    * chunk, 0); with ``tail`` (rows, tail_keys, seq_rows), of the keys before the masked tail (tail_rows)."""
    offsets = torch.arange(splits, dtype=torch.int64, device=lengths.device) * chunk
    keys = lengths.long() + added
    if tail is not None:
        keys = _tail_split(keys, *tail[1:])[0]
    return (keys[:, None] - offsets).clamp(min=0).int()


def _tail_split(keys: torch.Tensor, tail_keys: int, seq_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys before the tail, keys in it) of sequences holding ``keys`` (kept inside [0, seq_rows])."""
    end = keys.clamp(0, seq_rows)
    in_tail = end.clamp(max=tail_keys)
    return end - in_tail, in_tail


def tail_rows(lengths: torch.Tensor, added: int, tail_keys: int, seq_rows: int) -> torch.Tensor:
    """What prepost.append writes into a masked tail's rows: int32 (2, batch + 1), row 0 where each sequence's tail
    starts (b * seq_rows + its keys before the tail; batch * seq_rows last), row 1 its keys (a 0 last)."""
    common, in_tail = _tail_split(lengths.long() + added, tail_keys, seq_rows)
    starts = torch.arange(lengths.shape[0] + 1, device=lengths.device) * seq_rows
    starts[:-1] += common
    return torch.stack((starts, torch.cat((in_tail, in_tail.new_zeros(1))))).int()


def append_plainly(
    lengths, k, v, k_cache, v_cache, cache_batch_idx=None, block_table=None, counts=None, chunk=0, tail=None
):
    """prepost.append's writes as tensor operations: k and v at positions lengths[b] + i of sequence b's cache row
    (cache_batch_idx[b], or b) or of its pages (block_table), slots outside the cache left alone; the chunks' key
    counts into ``counts``, with ``tail`` (rows, tail_keys, seq_rows) of the keys before the masked tail, whose
    starts and counts go into rows[:, :batch + 1] and rows[1, :batch]."""
    if k is not None:
        batch, added = k.shape[:2]
        positions = lengths.long()[:, None] + torch.arange(added, device=lengths.device)  # (batch, added)
        if block_table is None:
            rows = torch.arange(batch, device=lengths.device) if cache_batch_idx is None else cache_batch_idx.long()
            rows, offsets = rows[:, None].expand_as(positions), positions
            inside = (positions >= 0) & (positions < k_cache.shape[1])
        else:
            page = positions.clamp(min=0) // k_cache.shape[1]
            inside = (positions >= 0) & (page < block_table.shape[1])
            rows = block_table.long().gather(1, page.clamp(max=block_table.shape[1] - 1))
            offsets = positions.clamp(min=0) % k_cache.shape[1]
        inside &= (rows >= 0) & (rows < k_cache.shape[0])
        k_cache[rows[inside], offsets[inside]] = k[inside]
        v_cache[rows[inside], offsets[inside]] = v[inside]
    if counts is not None:
        added = 0 if k is None else k.shape[1]
        counts.copy_(chunk_counts(lengths, added, counts.shape[1], chunk, tail))
        if tail is not None:
            written = tail_rows(lengths, added, *tail[1:])
            tail[0][0].copy_(written[0])
            tail[0][1, :-1].copy_(written[1, :-1])
