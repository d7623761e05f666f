"""The sm80 family's launch contract: the seed's mma.sync kernels, on every GPU of compute capability 8.0 or newer.

forward_launcher, forward and backward take validated tensors and launch on the current stream; compile builds any
of the family's kernels for a target without a GPU; variants lists what the heuristics pick, for the compile tests
and warm-up.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from flashcute.kernels.common import prepost
from flashcute.kernels.common.limits import VALUE_HEAD_DIMS, head_dim_bucket
from flashcute.kernels.launch import DENSE, compiled, device_arch, dtype_name, run_on_device
from flashcute.kernels.sm80.build import compile
from flashcute.kernels.sm80.config import BwdConfig, DQConfig, FwdConfig, bwd_config, dq_config, fwd_config

NAME = "sm80"
# The targets the compile tests and `flashcute check` build this family for.
ARCHS = ("sm_80", "sm_90a")
# The backend its benchmarks and comparisons time beside it: PyTorch's FlashAttention-2, the same design.
REFERENCE = "sdpa-flash"
# Forward tiles besides the heuristic's that the GPU tests run (head dim 96, bf16): the fields they replace.
ALTERNATIVE_TILES = (
    {"num_stages": 2},
    {"block_m": 64, "block_n": 64},
    {"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 2},
    {"block_n": 128, "num_warps": 8},
)


def runs_on(capability: tuple[int, int]) -> bool:
    return capability[0] >= 8


def variants(arch: str, dtypes, buckets, masks, exact_only: bool) -> dict[str, list]:
    """The heuristics' configs by kernel kind, per dtype x head-dim bucket x (window_left, window_right) (x exact
    and padded head dim) on target ``arch``."""
    kinds = {
        "fwd": lambda d, t, w, **v: fwd_config(d, t, *w, arch=arch, **v),
        "bwd": lambda d, t, w, **v: bwd_config(d, t, *w, **v),
        "bwd-deterministic": lambda d, t, w, **v: bwd_config(d, t, *w, deterministic=True, **v),
        "dq": lambda d, t, w, **v: dq_config(d, t, *w, **v),
    }
    found = {kind: [] for kind in kinds}
    for dtype, bucket, window in itertools.product(dtypes, buckets, masks):
        for head_dim in (bucket,) if exact_only else (bucket, bucket - 8):
            for kind, make in kinds.items():
                found[kind].append(make(head_dim, dtype, window))
    # v's head dim apart from q's: the pairs models use, for each dtype and mask
    for kind, make in kinds.items():
        found[f"{kind}-value"] = [
            make(head_dim, dtype, window, head_dim_v=head_dim_v)
            for dtype, (head_dim, head_dim_v), window in itertools.product(dtypes, VALUE_HEAD_DIMS, masks)
            if head_dim in buckets
        ]
    # packed batches, capped scores, sinks (the forward alone) and ALiBi: the exact head dims (each is orthogonal to
    # padding)
    for variant, variant_kinds in (("packed", kinds), ("softcap", kinds), ("sink", ("fwd",)), ("alibi", kinds)):
        for kind in variant_kinds:
            found[f"{kind}-{variant}"] = [
                dataclasses.replace(kinds[kind](bucket, dtype, window), **{variant: True})
                for dtype, bucket, window in itertools.product(dtypes, buckets, masks)
            ]
    return found


def forward_launcher(
    device: torch.device,
    dtype: str,
    head_dim: int,
    window_left: int,
    window_right: int,
    packed: bool = False,
    config: FwdConfig | None = None,
    softcap: bool = False,
    sink: bool = False,
    alibi: bool = False,
    head_dim_v: int | None = None,
):
    """``launch(q, k, v, out, lse, softmax_scale, diag_offset, packed_args=DENSE, softcap=0.0, sink=None,
    alibi=None)`` for validated inputs of this device, dtype, head dim and window (outputs allocated by the caller),
    with the heuristic's config or ``config`` (tests, tuning). ``packed``: the launches take packed variable-length
    batches (kernels/common/seqlen.py), q (1, total_q, nheads, head_dim) and lse (1, nheads, total_q), and their
    packed_args. ``softcap``: the kernel caps the scores, by the launch's softcap (> 0). ``sink``: every row's
    softmax denominator takes its head's learnable sink, the launch's (nheads,) contiguous float32 ``sink``.
    ``alibi``: the scores take the ALiBi bias of the launch's (batch, nheads) float32 ``alibi`` slopes, rows
    contiguous (a packed batch's: one row per sequence)."""
    if config is None:
        arch = device_arch(device)
        scores = {"softcap": softcap, "sink": sink, "alibi": alibi}
        config = fwd_config(
            head_dim, dtype, window_left, window_right, arch=arch, packed=packed, head_dim_v=head_dim_v, **scores
        )
    kernel = compiled(config, device, compile)
    scalars = (window_left, window_right)
    capped = config.softcap

    def launch(
        q,
        k,
        v,
        out,
        lse,
        softmax_scale: float,
        diag_offset: int,
        packed_args: tuple = DENSE,
        softcap: float = 0.0,
        sink: torch.Tensor | None = None,
        alibi: torch.Tensor | None = None,
    ) -> None:
        cap = softcap if capped else None  # None: an optional argument the kernel leaves out
        args = (q, k, v, out, lse, softmax_scale, diag_offset, *scalars, *packed_args, cap, sink, alibi)
        run_on_device(device, kernel, *args)

    return launch


def reads_pages(page_size: int) -> bool:
    """Whether the forward reads K and V from a paged cache where it lies: no, its kernels take one packed tensor
    (flash_attn_with_kvcache gathers the pages first)."""
    return False


def supports_forward(head_dim: int, head_dim_v: int) -> bool:
    """Whether the forward takes v's head dim beside q's: up to q's head-dim bucket."""
    return head_dim_v <= head_dim_bucket(head_dim)


def supports_backward(head_dim: int, deterministic: bool, packed: bool, head_dim_v: int | None = None) -> bool:
    """Whether the backward covers the call: every one, with v's head dim (where it is not q's) as the forward's."""
    return head_dim_v is None or supports_forward(head_dim, head_dim_v)


def backward_kernels(
    head_dim: int,
    head_dim_v: int,
    dtype: str,
    window_left: int,
    window_right: int,
    deterministic: bool,
    packed: bool,
    softcap: bool,
    alibi: bool,
) -> list[BwdConfig | DQConfig]:
    """The configs of the kernels that ``backward`` runs for such a call, but the pre- and postprocess's (which build
    in tenths of a second, where these take seconds): the dK/dV kernel's, and deterministic the dQ kernel's;
    ``softcap``, ``alibi``: whether the call caps, biases the scores."""
    window = (window_left, window_right)
    variant = {"packed": packed, "softcap": softcap, "alibi": alibi, "head_dim_v": head_dim_v}
    dq = [dq_config(head_dim, dtype, *window, **variant)] if deterministic else []
    return [bwd_config(head_dim, dtype, *window, deterministic=deterministic, **variant), *dq]


def backward(
    dout,
    q,
    k,
    v,
    out,
    lse,
    softmax_scale: float,
    diag_offset: int,
    window_left: int,
    window_right: int,
    deterministic: bool,
    packed_args: tuple | None = None,
    softcap: float = 0.0,
    alibi: torch.Tensor | None = None,
    dlse: torch.Tensor | None = None,
    sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(dq, dk, dv, the sinks' gradient rows): the preprocess D = rowsum(dO * O) (less ``dlse``, the LSE's gradient
    where a loss uses it) and with ``sink`` ((nheads,) float32 learnable sinks) each row's share of their gradient (None
    without: prepost.preprocess); the dK/dV kernel; dQ either from the same kernel's fp32 atomics into a buffer the
    preprocess zeroes, scaled and cast by the postprocess, or, deterministic, from the dQ kernel, which adds in a fixed
    order. ``packed_args``: a packed variable-length batch's (forward_launcher), the tensors shaped as its launches take
    them; the kernels write no row that lies outside every sequence, so those rows are zeroed apart
    (prepost.zero_rows_outside_sequences). ``softcap`` >
    0: the forward capped the scores by it; ``alibi``: (batch, nheads) float32 slopes it biased them with. v (and out,
    dout, dv) may have a head dim of its own (supports_backward)."""
    batch, seqlen_q, nheads, head_dim = q.shape
    head_dim_v = v.shape[-1]
    dtype = dtype_name(q)
    delta = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
    contiguous = torch.contiguous_format
    same_width = head_dim_v == head_dim
    new_accum = torch.empty_like if same_width else torch.zeros_like
    dq_accum = None if deterministic else new_accum(q, dtype=torch.float32, memory_format=contiguous)
    # the preprocess zeroes dq_accum with out's tiles, which cover it only where v's head dim is q's
    sink_rows = prepost.preprocess(dout, out, delta, dq_accum if same_width else None, lse, dlse=dlse, sink=sink)
    dq, dk, dv = (torch.empty_like(t, memory_format=contiguous) for t in (q, k, v))
    if packed_args is not None:  # the kernels write each sequence's rows; the others get their gradient, 0, here
        cu_seqlens_q, cu_seqlens_k, used_q, used_k = packed_args[:4]
        prepost.zero_rows_outside_sequences(dk[0], dv[0], cu_seqlens_k, used_k)
        if deterministic:  # (else the postprocess writes every row of dq from the zeroed accumulator)
            prepost.zero_rows_outside_sequences(dq[0], dq[0], cu_seqlens_q, used_q)
    scalars = (softmax_scale, diag_offset, window_left, window_right)
    packed, capped = packed_args is not None, softcap > 0
    after = (*(packed_args if packed else DENSE), softcap if capped else None, alibi)
    call = (head_dim, head_dim_v, dtype, window_left, window_right, deterministic, packed, capped, alibi is not None)
    config, *dq_configs = backward_kernels(*call)
    tensors = (q, k, v, dout, lse, delta, dq_accum, dk, dv)
    run_on_device(q.device, compiled(config, q.device, compile), *tensors, *scalars, *after)
    if deterministic:
        dq_kernel = compiled(dq_configs[0], q.device, compile)
        run_on_device(q.device, dq_kernel, q, k, v, dout, lse, delta, dq, *scalars, *after)
    else:
        prepost.postprocess(dq_accum, dq, softmax_scale)
    return dq, dk, dv, sink_rows
