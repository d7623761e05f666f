"""The kernel configurations the heuristics pick, checked on the CPU against each kernel's can_implement."""

from __future__ import annotations

import dataclasses

import pytest

from flashcute.kernels import registry
from flashcute.kernels.common.append import KvCacheAppend
from flashcute.kernels.common.bwd_post import FlashAttentionBackwardPostprocess
from flashcute.kernels.common.bwd_pre import FlashAttentionBackwardPreprocess
from flashcute.kernels.common.combine import SplitKvCombine
from flashcute.kernels.common.limits import DTYPES, HEAD_DIM_BUCKETS, MAX_SMEM_BYTES
from flashcute.kernels.common.prepost_config import (
    AppendConfig,
    BwdPostConfig,
    BwdPreConfig,
    ZeroRowsConfig,
    append_config,
    bwd_post_config,
    bwd_pre_config,
    combine_config,
    zero_rows_config,
)
from flashcute.kernels.common.zero_rows import ZeroRowsOutsideSequences
from flashcute.kernels.sm80.config import fwd_config
from flashcute.kernels.sm80.fwd import FlashAttentionForwardSm80
from flashcute.kernels.sm90.bwd import FlashAttentionBackwardSm90
from flashcute.kernels.sm90.bwd_wide import FlashAttentionBackwardSm90Wide
from flashcute.kernels.sm90.config import SMEM_BYTES, Sm90BwdConfig, sm90_bwd_config, sm90_fwd_config
from flashcute.kernels.sm90.fwd import FlashAttentionForwardSm90
from flashcute.kernels.variants import alternative_tile_variants

MASK_VARIANTS = registry.MASK_VARIANTS
SM90 = registry.variants("sm_90a")
CAUSAL = {"window_right": 0}


@pytest.mark.parametrize("config", SM90["sm90-fwd"] + alternative_tile_variants("sm90"), ids=str)
def test_every_sm90_config_fits_sm90a(config):
    assert FlashAttentionForwardSm90.can_implement(config, "sm_90a") is None
    assert config.smem_bytes() <= SMEM_BYTES
    assert config.num_threads == 128 * (1 + config.block_m // 64)


@pytest.mark.parametrize("config", registry.variants("sm_80")["sm80-fwd"] + alternative_tile_variants("sm80"), ids=str)
def test_every_sm80_config_fits_both_targets(config):
    for arch in ("sm_80", "sm_90a"):
        assert FlashAttentionForwardSm80.can_implement(config, arch) is None


def test_sm90_kernel_refuses_other_targets_and_bad_tiles():
    config = sm90_fwd_config(128, "bfloat16")
    assert "sm_90a" in FlashAttentionForwardSm90.can_implement(config, "sm_80")
    too_big = dataclasses.replace(sm90_fwd_config(256, "bfloat16"), block_n=128)
    assert "shared memory" in FlashAttentionForwardSm90.can_implement(too_big, "sm_90a")
    odd = dataclasses.replace(config, block_m=96)
    assert "block_m=96" in FlashAttentionForwardSm90.can_implement(odd, "sm_90a")
    narrow = dataclasses.replace(config, block_n=72)
    assert "block_n=72" in FlashAttentionForwardSm90.can_implement(narrow, "sm_90a")
    assert "float32" in FlashAttentionForwardSm90.can_implement(dataclasses.replace(config, dtype="float32"), "sm_90a")


def test_o_gets_its_own_shared_memory_where_it_fits():
    aliased = {bucket for bucket in HEAD_DIM_BUCKETS if sm90_fwd_config(bucket, "float16").o_aliases_q}
    assert aliased == {192, 256}


# every (q's head dim, v's) the sm90 forward takes that the GPU tests run: the pairs models use and padded ones
VALUE_PAIRS = [(192, 128), (128, 64), (96, 40), (72, 64), (256, 128), (256, 256 - 8), (64, 32)]


@pytest.mark.parametrize("window", MASK_VARIANTS[:2], ids=str)
@pytest.mark.parametrize("head_dims", VALUE_PAIRS, ids=str)
def test_sm90_forward_with_v_of_its_own_head_dim(head_dims, window):
    """v's head dim apart from q's: a config of its own that fits, the tile choices that follow V's width by v's
    bucket, O in Q's shared memory only where it would not fit beside it, and the family takes the call."""
    head_dim, head_dim_v = head_dims
    config = sm90_fwd_config(head_dim, "bfloat16", *window, head_dim_v=head_dim_v)
    bucket, bucket_v = config.head_dim_padded, config.head_dim_v_padded
    assert FlashAttentionForwardSm90.can_implement(config, "sm_90a") is None
    assert bucket_v >= head_dim_v and config.exact_head_dim_v == (bucket_v == head_dim_v)
    assert f"d{bucket}" in config.label and f"v{bucket_v}" in config.label
    assert config.rescale_o_early == (bucket_v > 128)
    assert config.exp_in_place == (window[1] >= 0 and bucket_v >= 192)
    plain = sm90_fwd_config(head_dim, "bfloat16", *window)
    expected = (128, 128) if (bucket, bucket_v) == (192, 128) else (plain.block_m, plain.block_n)  # else q's tiles
    assert (config.block_m, config.block_n) == expected
    assert config.o_aliases_q == (config._smem_bytes(separate_o=True) > SMEM_BYTES)
    assert config.smem_bytes() <= SMEM_BYTES
    assert registry.family("sm90").supports_forward(head_dim, head_dim_v)
    assert sm90_fwd_config(head_dim, "bfloat16", *window, head_dim_v=head_dim) == plain  # the same width: plain


def test_sm90_forward_refuses_v_wider_than_q():
    assert not registry.family("sm90").supports_forward(64, 72)
    wide = dataclasses.replace(sm90_fwd_config(128, "bfloat16"), head_dim_v_padded=192, exact_head_dim_v=True)
    assert "head_dim_v_padded=192" in FlashAttentionForwardSm90.can_implement(wide, "sm_90a")


@pytest.mark.parametrize("window", MASK_VARIANTS, ids=str)
def test_sm90_heuristic_by_mask(window):
    config = sm90_fwd_config(64, "bfloat16", *window)
    assert (config.block_m, config.block_n) == (192, 128)
    assert (config.mask_right, config.mask_left) == (window[1] >= 0, window[0] >= 0)
    assert sm90_fwd_config(256, "bfloat16").rescale_o_early and not sm90_fwd_config(128, "bfloat16").rescale_o_early
    assert {sm90_fwd_config(256, dtype, *window).block_n for dtype in DTYPES} == {80}


@pytest.mark.parametrize(
    "head_dim, page_size, page_rows",
    [(128, 16, 16), (128, 64, 64), (128, 256, 128), (64, 1024, 128), (192, 256, 32), (256, 64, 16), (96, 8, 8)],
)
def test_sm90_paged_forward_boxes_divide_the_page_and_the_kv_tile(head_dim, page_size, page_rows):
    config = sm90_fwd_config(head_dim, "bfloat16", packed=True, page_size=page_size)
    assert config.page_rows == page_rows and config.block_n % page_rows == 0 and page_size % page_rows == 0
    assert dataclasses.replace(config, page_rows=0) == sm90_fwd_config(head_dim, "bfloat16", packed=True)


def test_which_families_read_pages_where_they_lie():
    """The Hopper forward reads pages of a power of two rows, 8 or more (its boxes then divide a page and the
    split chunks of 128 keys); the sm80 kernels take one packed tensor."""
    sm90, sm80 = registry.family("sm90"), registry.family("sm80")
    assert [size for size in (4, 8, 16, 24, 48, 64, 100, 256, 512) if sm90.reads_pages(size)] == [8, 16, 64, 256, 512]
    assert not any(sm80.reads_pages(size) for size in (16, 64, 256))


def test_sm90_step_order_by_head_dim_and_mask():
    """docs/tuning-sm90.md, Step order: one-chain row sums and the turn taken before the K wait at D=64 without a
    mask and at D=128 (there also passed after Q K^T); elsewhere the default order."""

    def order(bucket, *window):
        config = sm90_fwd_config(bucket, "float16", *window)
        return config.sum_chains, config.turn_before_k, config.pass_turn_after_qk

    assert order(128) == order(128, -1, 0) == order(128, 64, -1) == (1, True, True)
    assert order(64) == (1, True, False)
    assert order(64, -1, 0) == order(256) == order(256, -1, 0) == order(96) == (4, False, False)


def test_sm90_exp_in_place_at_head_dims_192_and_256_under_a_mask():
    """docs/tuning-sm90.md, E in place of S: the heuristic takes it at D=192 and D=256 under a mask only."""
    picks = {(c.head_dim_padded, c.mask_right or c.mask_left) for c in SM90["sm90-fwd"] if c.exp_in_place}
    assert picks == {(192, True), (256, True)}
    for bucket in (192, 256):
        assert sm90_fwd_config(bucket, "bfloat16", **CAUSAL).label.endswith("-lazy8e-right")
    assert sm90_fwd_config(128, "bfloat16").label.endswith("-lazy8-nomask")


def test_sm90_empty_rows_keep_zero_under_a_mask_with_short_kv_tiles():
    """Only where the diagonal tile leaves rows without a key (block_m > block_n, a mask)."""
    assert sm90_fwd_config(64, "bfloat16", **CAUSAL).empty_rows_keep_zero
    assert sm90_fwd_config(64, "float16", window_left=8).empty_rows_keep_zero
    assert not sm90_fwd_config(64, "bfloat16").empty_rows_keep_zero
    assert not sm90_fwd_config(128, "bfloat16", **CAUSAL).empty_rows_keep_zero
    assert sm90_fwd_config(256, "bfloat16", **CAUSAL).empty_rows_keep_zero


def test_sm90_k_descriptors_by_dtype_and_head_dim():
    """docs/tuning-sm90.md, K descriptors: both dtypes take the uniform stage base at D=256; below it fp16 32-bit
    adds and bf16 64-bit ones; the kernel refuses a form it does not know."""
    for window in MASK_VARIANTS:
        assert {sm90_fwd_config(256, dtype, *window).k_descriptors for dtype in DTYPES} == {"uniform"}
        assert {sm90_fwd_config(d, "float16", *window).k_descriptors for d in HEAD_DIM_BUCKETS[:-1]} == {"32bit"}
        assert {sm90_fwd_config(d, "bfloat16", *window).k_descriptors for d in HEAD_DIM_BUCKETS[:-1]} == {"64bit"}
    odd = dataclasses.replace(sm90_fwd_config(128, "bfloat16"), k_descriptors="16bit")
    assert "k_descriptors='16bit'" in FlashAttentionForwardSm90.can_implement(odd, "sm_90a")


def test_alternative_tiles_are_not_the_heuristics_pick():
    for family in registry.FAMILIES:
        picks = {registry.family(family).variants("sm_90a", ("bfloat16",), (96,), MASK_VARIANTS[:3], True)["fwd"][0]}
        assert not picks & set(alternative_tile_variants(family))


@pytest.mark.parametrize("config", registry.variants("sm_80")["prepost"], ids=str)
def test_every_bwd_prepost_config_fits_both_targets(config):
    kernels = {BwdPreConfig: FlashAttentionBackwardPreprocess, BwdPostConfig: FlashAttentionBackwardPostprocess}
    kernels |= {AppendConfig: KvCacheAppend, ZeroRowsConfig: ZeroRowsOutsideSequences}
    kernel = kernels.get(type(config), SplitKvCombine)
    for arch in ("sm_80", "sm_90a"):
        assert kernel.can_implement(config, arch) is None


def test_bwd_prepost_kernels_refuse_what_the_copy_cannot_tile():
    rows = dataclasses.replace(bwd_pre_config(128, "bfloat16"), block_m=24)  # 16 rows a pass at head dim 128
    assert "block_m=24" in FlashAttentionBackwardPreprocess.can_implement(rows, "sm_80")
    warps = dataclasses.replace(bwd_post_config(64, "float16"), num_warps=64)
    assert "2048 threads" in FlashAttentionBackwardPostprocess.can_implement(warps, "sm_90a")
    dtype = dataclasses.replace(bwd_post_config(64, "float16"), dtype="float32")
    assert "float32" in FlashAttentionBackwardPostprocess.can_implement(dtype, "sm_80")
    dtype = dataclasses.replace(combine_config(64, "float16"), dtype="float32")
    assert "float32" in SplitKvCombine.can_implement(dtype, "sm_90a")
    assert "float32" in KvCacheAppend.can_implement(append_config("float32", True), "sm_80")
    assert "counts alone" in KvCacheAppend.can_implement(append_config("float16", False, pages=True), "sm_80")
    both = append_config("bfloat16", True, pages=True, batch_index=True)
    assert "no cache rows" in KvCacheAppend.can_implement(both, "sm_90a")
    assert "float32" in ZeroRowsOutsideSequences.can_implement(zero_rows_config("float32"), "sm_80")


@pytest.mark.parametrize("config", SM90["sm90-bwd"], ids=str)
def test_every_sm90_bwd_config_fits_sm90a(config: Sm90BwdConfig):
    kernel = FlashAttentionBackwardSm90Wide if config.wide else FlashAttentionBackwardSm90
    assert kernel.can_implement(config, "sm_90a") is None
    assert config.smem_bytes() <= SMEM_BYTES
    assert config.num_threads == 384  # a producer warpgroup and two consumer warpgroups
    # dQ is split between the two warpgroups by rows (128-row Q tiles) or by the head dim (64-row ones)
    assert config.dq_split_rows == (config.block_m == 128)
    assert config.wide == (config.head_dim_padded > 128)


def test_sm90_bwd_head_dims():
    for head_dim, padded in ((8, 32), (40, 64), (72, 96), (120, 128), (136, 192), (200, 256)):
        assert sm90_bwd_config(head_dim, "float16").head_dim_padded == padded
        assert not sm90_bwd_config(head_dim, "float16").exact_head_dim
    for head_dim in (32, 64, 96, 128, 192, 256):
        assert sm90_bwd_config(head_dim, "float16").exact_head_dim
    # D=96 splits dQ's head dim 48 + 48, in K's 16-column swizzle atoms
    assert sm90_bwd_config(96, "bfloat16").dq_split_rows is False
    # over 128 the queries are rows: 64 of them against 96 keys at D=192, 64 at D=256, each with one Q/dO stage
    # beside its dQ tile (two do not fit); the keys-as-rows kernels keep two
    tiles = [(c.block_m, c.block_n, c.num_stages) for c in (sm90_bwd_config(d, "bfloat16") for d in (128, 192, 256))]
    assert tiles == [(80, 128, 2), (64, 96, 1), (64, 64, 1)]
    # with softcap and ALiBi together (a copy of the capped scores beside the bias) D=192 keeps 64-key tiles
    assert sm90_bwd_config(192, "bfloat16", softcap=True, alibi=True).block_n == 64
    assert all(sm90_bwd_config(d, "float16").wide for d in (136, 192, 200, 256))


def test_sm90_bwd_takes_80_row_q_tiles_at_d128_without_a_mask_a_cap_or_a_bias():
    """FlashAttention-3's D=128 tile without a mask: dQ computed transposed (80 rows are no warpgroup's M), dV's MMA
    issued with dK's (P^T held through dS^T spills at 80 rows); under a mask, with capped or biased scores, 64 rows."""
    plain = sm90_bwd_config(128, "bfloat16")
    assert (plain.block_m, plain.dq_transposed, plain.dq_split_rows, plain.dv_before_ds) == (80, True, False, False)
    # dK's MMA after dQ's, under dQ's trip to shared memory, but at D=64 (dS^T held through dQ's MMA spills there)
    assert [sm90_bwd_config(d, "bfloat16").dk_after_dq for d in (32, 64, 96, 128)] == [True, False, True, True]
    for variant in ({"packed": True}, {"deterministic": True}):
        assert sm90_bwd_config(128, "float16", **variant).block_m == 80
    for window, variant in (((-1, 0), {}), ((64, -1), {}), ((-1, -1), {"softcap": True}), ((-1, -1), {"alibi": True})):
        config = sm90_bwd_config(128, "bfloat16", *window, **variant)
        assert (config.block_m, config.dq_transposed, config.dv_before_ds) == (64, False, True)
    assert not any(sm90_bwd_config(d, "bfloat16").dq_transposed for d in (32, 64, 96, 192, 256))
    assert FlashAttentionBackwardSm90.can_implement(plain, "sm_90a") is None
    d64 = dataclasses.replace(sm90_bwd_config(64, "bfloat16"), block_m=80)
    assert "head_dim_padded 128 only" in FlashAttentionBackwardSm90.can_implement(d64, "sm_90a")


def test_sm90_bwd_reads_lse_ahead_of_the_wait_only_where_it_pays_and_does_not_spill():
    """LSE into registers before the wait for S^T: D=128 causal alone (D=32 measured slower; D=64, the 80-row tiles,
    two-sided windows of packed batches, capped or biased scores spill)."""
    assert sm90_bwd_config(128, "bfloat16", -1, 0).lse_ahead
    assert sm90_bwd_config(128, "float16", -1, 0, packed=True, deterministic=True).lse_ahead
    assert "-lse-" in sm90_bwd_config(128, "bfloat16", -1, 0).label
    assert not any(sm90_bwd_config(d, "bfloat16", -1, 0).lse_ahead for d in (32, 64, 96, 192, 256))
    for window, variant in (((-1, -1), {}), ((64, 64), {}), ((-1, 0), {"softcap": True}), ((-1, 0), {"alibi": True})):
        assert not sm90_bwd_config(128, "bfloat16", *window, **variant).lse_ahead


def test_sm90_bwd_refuses_other_targets_and_bad_tiles():
    config = sm90_bwd_config(128, "bfloat16", -1, 0)  # 64-row Q tiles
    assert "sm_90a" in FlashAttentionBackwardSm90.can_implement(config, "sm_80")
    for fields, message in (({"block_n": 64}, "block_n=64"), ({"block_m": 96}, "block_m=96")):
        assert message in FlashAttentionBackwardSm90.can_implement(dataclasses.replace(config, **fields), "sm_90a")
    # 64-row Q tiles split dQ's head dim between the warpgroups (K's swizzle atoms as wide as a half)
    d64 = dataclasses.replace(sm90_bwd_config(64, "bfloat16"), block_m=64)
    assert FlashAttentionBackwardSm90.can_implement(d64, "sm_90a") is None
    for bucket in (192, 256):
        other = dataclasses.replace(config, head_dim_padded=bucket)
        assert "is over 128" in FlashAttentionBackwardSm90.can_implement(other, "sm_90a")
    big = dataclasses.replace(config, block_m=128)
    assert "shared memory" in FlashAttentionBackwardSm90.can_implement(big, "sm_90a")


def test_sm90_wide_bwd_refuses_other_targets_and_bad_tiles():
    config = sm90_bwd_config(192, "bfloat16")
    assert "sm_90a" in FlashAttentionBackwardSm90Wide.can_implement(config, "sm_80")
    for fields, message in (({"block_n": 56}, "block_n=56"), ({"block_m": 128}, "block_m=128")):
        assert message in FlashAttentionBackwardSm90Wide.can_implement(dataclasses.replace(config, **fields), "sm_90a")
    big = dataclasses.replace(config, block_n=128)
    assert "shared memory" in FlashAttentionBackwardSm90Wide.can_implement(big, "sm_90a")


def test_sm80_heuristic_fits_the_targets_shared_memory():
    """D=256 takes 128-key tiles where sm_90's shared memory holds them, and the 64-key one-stage tile on sm_80,
    in both dtypes and under every mask; every pick fits its target."""
    for dtype in DTYPES:
        for window in MASK_VARIANTS:
            hopper = fwd_config(256, dtype, *window, arch="sm_90a")
            ampere = fwd_config(256, dtype, *window, arch="sm_80")
            assert (hopper.block_n, hopper.num_stages) == (128, 1)
            assert hopper.smem_bytes() > MAX_SMEM_BYTES["sm_80"]
            assert (ampere.block_n, ampere.num_stages) == (64, 1)
    for arch in ("sm_80", "sm_90a"):
        for config in registry.variants(arch)["sm80-fwd"]:
            assert FlashAttentionForwardSm80.can_implement(config, arch) is None, (config, arch)


def test_sm80_d128_tiles_and_lazy_rescaling_by_mask():
    """One stage without a mask, two under any mask; only D=128 rescales lazily (docs/tuning-sm80.md)."""
    for dtype in DTYPES:
        for window, stages in (((-1, -1), 1), ((-1, 0), 2), ((16, -1), 2), ((16, 4), 2)):
            config = fwd_config(128, dtype, *window, arch="sm_90a")
            assert (config.block_m, config.block_n, config.num_warps, config.num_stages) == (128, 64, 4, stages)
            assert config.lazy_rescale and config.label.endswith(f"s{stages}-lazy8-{config.label.split('-')[-1]}")
    assert not any(fwd_config(d, "bfloat16").lazy_rescale for d in HEAD_DIM_BUCKETS if d != 128)


def test_sm80_kernel_refuses_tiles_its_warps_cannot_cover():
    base = fwd_config(128, "bfloat16")
    assert "block_m=32" in FlashAttentionForwardSm80.can_implement(dataclasses.replace(base, block_m=32), "sm_80")
    assert "num_stages=3" in FlashAttentionForwardSm80.can_implement(dataclasses.replace(base, num_stages=3), "sm_80")
