"""Forward kernels on the GPU against the float64 spec (design.md's error budget), outputs NaN-poisoned.

Every test runs once per kernel (sm80: mma.sync; sm90: TMA + wgmma, on sm_90 only)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch.nn.functional import pad

import flashcute
from flashcute.interface import kernel_window, launch_fwd
from flashcute.kernels import registry
from flashcute.kernels.sm90.config import sm90_fwd_config
from flashcute.kernels.variants import alternative_tile_config
from flashcute.validation import validate_attention_args, validate_cuda_inputs
from tests.helpers import check_against_spec, random_gpu_cases

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]
SEQLENS = [(1, 1), (17, 17), (64, 64), (113, 203), (239, 239), (799, 3), (3, 799), (1023, 1024), (4224, 4224)]
HEAD_DIMS = [32, 64, 96, 128, 192, 256, 40, 72, 160, 200]
MASKS = [
    {},
    {"causal": True},
    {"causal": True, "causal_align": "top_left"},
    {"window_size": (50, 7)},
    {"window_size": (64, -1), "causal_align": "top_left"},
    {"window_size": (2**31 - 1, 2**31 - 1)},
]


def randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


def run_poisoned(q, k, v, kernel, **options):
    """Run the kernel into NaN-filled outputs, so any element it fails to write fails the check."""
    args = validate_attention_args(q, k, v, **options)
    q, k, v = validate_cuda_inputs(q, k, v, args)
    out = torch.full((*q.shape[:-1], v.shape[-1]), math.nan, dtype=q.dtype, device=q.device)
    lse = torch.full((args.batch, args.nheads, args.seqlen_q), math.nan, device=q.device)
    scalars = (args.softmax_scale, args.diagonal_offset, *kernel_window(args))
    launch_fwd(q, k, v, out, lse, *scalars, kernel, args.softcap)
    return out, lse


def check(q, k, v, kernel, **options):
    out, lse = run_poisoned(q, k, v, kernel, **options)
    check_against_spec(out, lse, q, k, v, **options)


def check_config(kernel: str, config, q, k, v, **options):
    """check() for one kernel config launched as given, not the heuristic's pick; the Hopper kernel on a persistent
    grid of 7 thread blocks that each claim several tiles."""
    args = validate_attention_args(q, k, v, **options)
    out = torch.full_like(q, math.nan)
    lse = torch.full((args.batch, args.nheads, args.seqlen_q), math.nan, device="cuda")
    grid = {"grid": 7} if kernel == "sm90" else {}
    scalars = (args.softmax_scale, args.diagonal_offset, *kernel_window(args))
    registry.forward_once(kernel, q, k, v, out, lse, *scalars, config=config, **grid)
    check_against_spec(out, lse, q, k, v, **options)


@pytest.fixture(params=["heuristic", "in place"])
def softmax_form(request, kernel) -> str:
    """The heuristic's kernel, and for sm90 also its config with the kept-max steps' E in place of S
    (Sm90FwdConfig.exp_in_place), whose rare paths the softmax tests below reach."""
    if request.param == "in place" and kernel != "sm90":
        pytest.skip("exp_in_place is a Hopper forward option")
    return request.param


def check_form(form: str, q, k, v, kernel, **options):
    """check() through the heuristic, or (form "in place") with the Hopper config's exp_in_place switched on."""
    if form == "heuristic":
        check(q, k, v, kernel, **options)
        return
    window = kernel_window(validate_attention_args(q, k, v, **options))
    config = sm90_fwd_config(q.shape[-1], str(q.dtype).removeprefix("torch."), *window)
    check_config(kernel, dataclasses.replace(config, exp_in_place=True), q, k, v, **options)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("seqlens", SEQLENS, ids=str)
@pytest.mark.parametrize("mask", MASKS, ids=str)
def test_seqlens_and_masks(dtype, seqlens, mask, kernel):
    seqlen_q, seqlen_k = seqlens
    batch = 2 if seqlen_q * seqlen_k < 10**6 else 1
    check(
        randn(batch, seqlen_q, 3, 128, dtype=dtype),
        *(randn(batch, seqlen_k, 3, 128, dtype=dtype) for _ in "kv"),
        kernel,
        **mask,
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims(dtype, head_dim, causal, kernel):
    q = randn(2, 239, 4, head_dim, dtype=dtype)
    k, v = (randn(2, 301, 4, head_dim, dtype=dtype) for _ in "kv")
    check(q, k, v, kernel, causal=causal)


@pytest.mark.parametrize("nheads_k", [1, 2])
def test_gqa_mqa(nheads_k, kernel):
    q = randn(2, 300, 8, 64)
    k, v = (randn(2, 257, nheads_k, 64) for _ in "kv")
    check(q, k, v, kernel, causal=True)


def test_packed_qkv_views(kernel):
    """Slices of one (batch, seqlen, 3, nheads, head_dim) tensor: strided, non-contiguous inputs."""
    qkv = randn(2, 333, 3, 4, 64)
    q, k, v = qkv.unbind(dim=2)
    assert not q.is_contiguous()
    check(q, k, v, kernel, causal=True)
    hq = randn(1, 257, 16 * 3, 64)  # heads interleaved along one dim, then sliced with a step
    check(hq[:, :, 0::3], hq[:, :, 1::3], hq[:, :, 2::3], kernel)


def test_heads_major_views(kernel):
    """(batch, nheads, seqlen, head_dim) tensors, SDPA's layout, viewed as (batch, seqlen, nheads, head_dim): the
    seqlen stride is one row, the head stride a whole sequence; k and v with other sequence lengths than q's."""
    q = randn(2, 4, 211, 64).transpose(1, 2)
    k, v = (randn(2, 2, 150, 64).transpose(1, 2) for _ in "kv")
    check(q, k, v, kernel, causal=True)
    check(q, k, v, kernel, window_size=(30, 30))


def test_broadcast_kv_and_stride_zero_dims(kernel):
    """K and V shared by every batch element through expand (stride 0), and a size-1 dim with stride 0."""
    q = randn(3, 200, 4, 64)
    k, v = (randn(1, 150, 2, 64).expand(3, 150, 2, 64) for _ in "kv")
    check(q, k, v, kernel, causal=True)
    one = randn(150, 2, 64).as_strided((1, 150, 2, 64), (0, 128, 64, 1))
    check(q[:1], one, one, kernel)


def test_many_heads_times_batch(kernel):
    """batch * heads > 65535 thread blocks along one grid dim would overflow gridDim.y/z."""
    q = randn(1100, 1, 64, 32)
    k, v = (randn(1100, 5, 64, 32) for _ in "kv")
    check(q, k, v, kernel)


def test_rows_that_see_no_key(kernel):
    """Bottom-right causal with seqlen_q > seqlen_k: the first rows see nothing: O = 0, LSE = -inf."""
    q = randn(1, 200, 2, 64)
    k, v = (randn(1, 70, 2, 64) for _ in "kv")
    out, lse = run_poisoned(q, k, v, kernel, causal=True)
    assert torch.equal(out[:, :130], torch.zeros_like(out[:, :130]))
    assert torch.isneginf(lse[:, :, :130]).all()
    check_against_spec(out, lse, q, k, v, causal=True)


def test_softmax_scale_and_lse(kernel):
    q = randn(2, 190, 2, 64)
    k, v = (randn(2, 190, 2, 64) for _ in "kv")
    check(q, k, v, kernel, softmax_scale=0.3)
    out, lse = flashcute.flash_attn_func(q, k, v, softmax_scale=0.3, return_lse=True, kernel=kernel)
    check_against_spec(out, lse, q, k, v, softmax_scale=0.3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("slope", [0.002, -0.02, 0.02, 0.2, 2.0])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 256])
def test_row_max_that_moves_across_tiles(dtype, slope, causal, head_dim, kernel, softmax_form):
    """Scores s_ij = slope * (seqlen - j) + noise: the kernels walk K/V from the last tile down, so with slope > 0 a
    row's max grows at every tile, by about 0.2, 1.8, 18 or 185 (exp2 units) a 64-key tile: below and above the lazy
    rescale's threshold (softmax.py), and past what the Hopper kernel's in-place exponentials can move from E
    (E = inf: softmax.move_kept_max computes S again); with slope < 0 the first tile holds it."""
    seqlen = 1000
    ramp = slope * (seqlen - torch.arange(seqlen, device="cuda", dtype=torch.float32))
    q = 0.1 * randn(2, seqlen, 2, head_dim, dtype=dtype)
    k, v = (randn(2, seqlen, 2, head_dim, dtype=dtype) for _ in "kv")
    q[..., 0] = 1.0
    k[..., 0] = ramp[None, :, None].to(dtype)
    check_form(softmax_form, q, k, v, kernel, softmax_scale=1.0, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("offset", [-100.0, -40.0, -3.0, 0.0, 40.0, 100.0])
@pytest.mark.parametrize(("head_dim", "seqlen_q"), [(64, 1000), (64, 613), (128, 613), (192, 1000), (256, 1000)])
def test_rows_that_reach_unmasked_tiles_without_a_key(dtype, offset, head_dim, seqlen_q, kernel, softmax_form):
    """Causal, scores = offset + noise (std 0.1 sqrt(D - 1)): the Hopper kernel walks the diagonal tile first, then the
    unmasked run, so where Q tiles are taller than K/V tiles (192 x 128 at D=64, 128 x 96 at D=192, 128 x 80 at
    D=256) or the diagonal is off the tile grid (seqlen_q 613) rows reach an unmasked tile at m = -inf. The kept-max
    step at D=64 takes E against 0 there and keeps m = 0 if each thread's sum lies within [1, 2^8]
    (softmax.online_softmax_kept_max): at offset 0 most warps keep it, at -3 some do, at -40 (E too small) and 40
    (too large) none, and they take the full update; elsewhere the full update handles such rows. With E in place
    of S (Sm90FwdConfig.exp_in_place) such rows move their max from E (softmax.move_kept_max), except at -100 (E
    flushed to 0) and 100 (E = inf), where S is computed again."""
    seqlen_k = 1000
    q = 0.1 * randn(2, seqlen_q, 2, head_dim, dtype=dtype)
    k, v = randn(2, seqlen_k, 2, head_dim, dtype=dtype), randn(2, seqlen_k, 2, head_dim, dtype=dtype)
    q[..., 0] = 1.0
    k[..., 0] = offset
    check_form(softmax_form, q, k, v, kernel, softmax_scale=1.0, causal=True)


def test_nan_in_v_propagates_like_spec(kernel):
    q = randn(1, 64, 1, 64)
    k, v = (randn(1, 64, 1, 64) for _ in "kv")
    v[0, 5, 0, 3] = math.nan
    out = flashcute.flash_attn_func(q, k, v, kernel=kernel)
    assert out[..., 3].isnan().all() and not out[..., :3].isnan().any()


def test_deterministic_bitwise(kernel):
    q = randn(2, 1000, 4, 128)
    k, v = (randn(2, 1000, 4, 128) for _ in "kv")
    first = flashcute.flash_attn_func(q, k, v, causal=True, return_lse=True, kernel=kernel)
    second = flashcute.flash_attn_func(q, k, v, causal=True, return_lse=True, kernel=kernel)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_non_default_stream(kernel):
    q = randn(2, 500, 4, 64)
    k, v = (randn(2, 500, 4, 64) for _ in "kv")
    expected = flashcute.flash_attn_func(q, k, v, kernel=kernel)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(10**7)  # keep the side stream busy: a launch on the default stream would race ahead
        out = flashcute.flash_attn_func(q, k, v, kernel=kernel)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(out, expected)


def test_launches_back_to_back_on_two_streams(kernel):
    """Each launch finds what the kernels keep between launches (the persistent grid's tile counter) as the last
    one left it: launches of different sizes one after another, on one stream and interleaved on two, each into
    NaN-poisoned outputs and against the spec."""
    shapes = [(1, 128, 128, 2), (2, 300, 500, 4), (1, 1000, 1000, 1), (3, 64, 700, 2)] * 2
    streams = (torch.cuda.current_stream(), torch.cuda.Stream())
    runs = []
    for i, (batch, seqlen_q, seqlen_k, nheads) in enumerate(shapes):
        q = randn(batch, seqlen_q, nheads, 64)
        k, v = (randn(batch, seqlen_k, nheads, 64) for _ in "kv")
        options = {"causal": i % 3 == 0}
        streams[1].wait_stream(streams[0])  # the inputs are ready
        with torch.cuda.stream(streams[i // 2 % 2]):
            runs.append((run_poisoned(q, k, v, kernel, **options), (q, k, v), options))
    torch.cuda.synchronize()
    for (out, lse), tensors, options in runs:
        check_against_spec(out, lse, *tensors, **options)


def test_a_repeated_signature_still_checks_pointers():
    """A call whose shapes, strides and options repeat an earlier one's still has its pointers checked: an input
    that does not start on 16 bytes is read from an aligned copy, forward and backward."""
    q, k, v = (randn(1, 64, 2, 64) for _ in "qkv")
    expected = flashcute.flash_attn_func(q, k, v)
    misaligned = torch.empty(q.numel() + 8, dtype=q.dtype, device="cuda")[1 : 1 + q.numel()].view(q.shape)
    misaligned.copy_(q)
    assert misaligned.data_ptr() % 16
    assert torch.equal(flashcute.flash_attn_func(misaligned, k, v), expected)
    leaf = misaligned.detach().requires_grad_()
    out = flashcute.flash_attn_func(leaf, k, v)
    out.backward(torch.ones_like(out))
    reference = q.detach().requires_grad_()
    flashcute.flash_attn_func(reference, k, v, deterministic=True).backward(torch.ones_like(out))
    torch.testing.assert_close(leaf.grad, reference.grad)


@pytest.mark.parametrize("layout", ["last stride 2", "rows of 65", "start off 16 bytes", "heads first"])
def test_inputs_of_any_layout(layout, kernel):
    """Layouts the kernels cannot read where they lie are read from copies (as PyTorch's attention and
    flash-attn-4 take any layout): out and gradients against the spec."""
    shape = (2, 131, 4, 64)
    if layout == "last stride 2":
        make = lambda: randn(*shape[:-1], 128)[..., ::2]  # noqa: E731
    elif layout == "rows of 65":
        make = lambda: randn(*shape[:-1], 65)[..., :64]  # noqa: E731
    elif layout == "start off 16 bytes":
        make = lambda: torch.as_strided(randn(math.prod(shape) + 1), shape, (131 * 256, 256, 64, 1), 1)  # noqa: E731
    else:
        make = lambda: randn(2, 4, 131, 64).transpose(1, 2)  # noqa: E731
    q, k, v = (make() for _ in "qkv")
    out, lse = flashcute.flash_attn_func(q, k, v, causal=True, return_lse=True, kernel=kernel)
    check_against_spec(out, lse, q, k, v, causal=True)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    flashcute.flash_attn_func(*leaves, causal=True, kernel=kernel).backward(torch.ones_like(out))
    dense = [t.detach().contiguous().requires_grad_() for t in (q, k, v)]
    flashcute.flash_attn_func(*dense, causal=True, kernel=kernel).backward(torch.ones_like(out))
    for ours, theirs in zip(leaves, dense, strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad, atol=2e-2, rtol=2e-2)


def test_cuda_graph_replay(kernel):
    q = randn(2, 300, 4, 64)
    k, v = (randn(2, 300, 4, 64) for _ in "kv")
    flashcute.flash_attn_func(q, k, v, causal=True, kernel=kernel)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flashcute.flash_attn_func(q, k, v, causal=True, kernel=kernel)
    for _ in range(2):
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        check_against_spec(out, None, q, k, v, causal=True)


# (q's head dim, v's): DeepSeek-style pairs, padded ones, the largest bucket
VALUE_HEAD_DIMS = [(192, 128), (128, 64), (96, 40), (72, 64), (256, 128)]


@pytest.mark.parametrize("mask", MASKS[:4], ids=str)
@pytest.mark.parametrize("head_dims", VALUE_HEAD_DIMS, ids=str)
def test_v_with_a_head_dim_of_its_own(head_dims, mask, kernel):
    """v's head dim apart from q's, NaN-poisoned outputs, lengths that leave partial tiles, GQA, the dtypes in turn;
    through flash_attn_func, out then has v's head dim."""
    head_dim, head_dim_v = head_dims
    dtype = (torch.bfloat16, torch.float16)[(VALUE_HEAD_DIMS.index(head_dims) + MASKS.index(mask)) % 2]
    q, k = randn(2, 137, 4, head_dim, dtype=dtype), randn(2, 201, 2, head_dim, dtype=dtype)
    v = randn(2, 201, 2, head_dim_v, dtype=dtype)
    check(q, k, v, kernel, **mask)
    out, lse = flashcute.flash_attn_func(q, k, v, return_lse=True, kernel=kernel, **mask)
    assert out.shape == (2, 137, 4, head_dim_v)
    check_against_spec(out, lse, q, k, v, **mask)


@pytest.mark.parametrize("head_dims", [(59, 59), (111, 111), (4, 4), (250, 250), (59, 37), (128, 99)], ids=str)
@pytest.mark.parametrize("mask", MASKS[:4], ids=str)
def test_head_dims_that_are_not_multiples_of_8(head_dims, mask, kernel):
    """flash_attn_func on head dims the kernels' 16-byte rows do not fit (zero-padded copies): out with v's head
    dim, the scale resolved from q's given head dim, against the spec."""
    head_dim, head_dim_v = head_dims
    dtype = (torch.bfloat16, torch.float16)[(head_dim + MASKS.index(mask)) % 2]
    q, k = randn(2, 137, 4, head_dim, dtype=dtype), randn(2, 201, 2, head_dim, dtype=dtype)
    v = randn(2, 201, 2, head_dim_v, dtype=dtype)
    out, lse = flashcute.flash_attn_func(q, k, v, return_lse=True, kernel=kernel, **mask)
    assert out.shape == (2, 137, 4, head_dim_v)
    check_against_spec(out, lse, q, k, v, **mask)


@pytest.mark.parametrize("sizes", [(2, 3, 0), (0, 3, 5), (2, 0, 5)], ids=["no key", "no sequence", "no query"])
def test_an_empty_batch_or_length_launches_nothing(sizes, kernel):
    """O = 0 (or nothing) and LSE = -inf where there is no key; the backward gives zero gradients."""
    batch, seqlen_q, seqlen_k = sizes
    q = randn(batch, seqlen_q, 4, 64).requires_grad_()
    k, v = (randn(batch, seqlen_k, 2, 64).requires_grad_() for _ in "kv")
    out, lse = flashcute.flash_attn_func(q, k, v, causal=True, return_lse=True, kernel=kernel)
    assert out.shape == q.shape and not out.any() and (lse == -math.inf).all()
    assert lse.shape == (batch, 4, seqlen_q) and lse.dtype == torch.float32
    out.backward(torch.randn_like(out))
    assert all(t.grad.shape == t.shape and not t.grad.any() for t in (q, k, v))


def test_v_wider_than_the_kernels_take_is_refused():
    """v's head dim above q's head-dim bucket gets a clear error before any launch."""
    q, k = randn(1, 64, 2, 64), randn(1, 64, 2, 64)
    with pytest.raises(ValueError, match=r"v's headdim \(v.shape\[3\]\) must be at most q's head-dim bucket \(64"):
        flashcute.flash_attn_func(q, k, randn(1, 64, 2, 128))


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda q, k, v: (q.cpu(), k, v), "CUDA"),
        (lambda q, k, v: (q.half(), k, v), "dtype"),
        (lambda q, k, v: (q.float(), k.float(), v.float()), "float16 or bfloat16"),
        (lambda q, k, v: (pad(q, (0, 200)), pad(k, (0, 200)), v), "headdim must be at most 256, got 264"),
    ],
)
def test_bad_inputs_raise_before_launch(bad, message):
    q, k, v = bad(*(randn(1, 16, 2, 64) for _ in "qkv"))
    with pytest.raises((TypeError, ValueError), match=message):
        flashcute.flash_attn_func(q, k, v)


@pytest.mark.parametrize("choice", range(max(len(registry.family(f).ALTERNATIVE_TILES) for f in registry.FAMILIES)))
@pytest.mark.parametrize("mask", MASKS[:4], ids=str)
def test_other_tile_configs(choice, mask, kernel):
    """Tile shapes and stage counts besides the heuristic's pick, on lengths that leave partial tiles."""
    tiles = registry.family(kernel).ALTERNATIVE_TILES
    if choice >= len(tiles):
        pytest.skip(f"{kernel} has {len(tiles)} alternative tile configs")
    q = randn(2, 333, 4, 96)
    k, v = (randn(2, 517, 2, 96) for _ in "kv")
    args = validate_attention_args(q, k, v, **mask)
    config = alternative_tile_config(kernel, tiles[choice], args.window_left, args.window_right)
    check_config(kernel, config, q, k, v, **mask)


@pytest.mark.parametrize("case", random_gpu_cases(seed=2026, count=40, max_seqlen=2200), ids=str)
def test_random_cases(case, kernel):
    """Seeded random calls (sizes, head dims, GQA, masks, scales, strides) beyond the grids above."""
    check(*case.tensors(), kernel, **case.options)
