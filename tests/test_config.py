"""The kernel configurations the heuristics pick, checked on the CPU against each kernel's can_implement."""

from __future__ import annotations

import dataclasses

import pytest

from flashcute.config import (
    DTYPES,
    HEAD_DIM_BUCKETS,
    LAZY_RESCALE_THRESHOLD,
    MAX_SMEM_BYTES,
    SM90_MAX_SMEM_BYTES,
    BwdPreConfig,
    Sm90BwdConfig,
    Sm90FwdConfig,
    bwd_post_config,
    bwd_pre_config,
    fwd_config,
    sm90_bwd_config,
    sm90_bwd_supports,
    sm90_fwd_config,
)
from flashcute.kernels.sass import variant_label
from flashcute.kernels.sm80.bwd_post import FlashAttentionBackwardPostprocessSm80
from flashcute.kernels.sm80.bwd_pre import FlashAttentionBackwardPreprocessSm80
from flashcute.kernels.sm80.fwd import FlashAttentionForwardSm80
from flashcute.kernels.sm90.bwd import FlashAttentionBackwardSm90
from flashcute.kernels.sm90.fwd import FlashAttentionForwardSm90
from flashcute.kernels.variants import (
    ALTERNATIVE_TILES,
    MASK_VARIANTS,
    alternative_tile_variants,
    bwd_prepost_variants,
    fwd_variants,
    sm90_bwd_variants,
    sm90_fwd_variants,
)


@pytest.mark.parametrize("config", sm90_fwd_variants() + alternative_tile_variants("sm90"), ids=str)
def test_every_sm90_config_fits_sm90a(config: Sm90FwdConfig):
    assert FlashAttentionForwardSm90.can_implement(config, "sm_90a") is None
    assert config.smem_bytes() <= SM90_MAX_SMEM_BYTES
    assert config.num_threads == 128 * (1 + config.block_m // 64)


@pytest.mark.parametrize("config", fwd_variants() + alternative_tile_variants("sm80"), ids=str)
def test_every_sm80_config_fits_both_targets(config):
    for arch in ("sm_80", "sm_90a"):
        assert FlashAttentionForwardSm80.can_implement(config, arch) is None


def test_sm90_kernel_refuses_other_targets_and_bad_tiles():
    config = sm90_fwd_config(128, "bfloat16")
    assert "sm_90a" in FlashAttentionForwardSm90.can_implement(config, "sm_80")
    too_big = sm90_fwd_config(256, "bfloat16", tiles=(128, 128, 2))
    assert "shared memory" in FlashAttentionForwardSm90.can_implement(too_big, "sm_90a")
    odd = sm90_fwd_config(128, "bfloat16", tiles=(96, 128, 2))
    assert "block_m=96" in FlashAttentionForwardSm90.can_implement(odd, "sm_90a")
    narrow = sm90_fwd_config(128, "bfloat16", tiles=(128, 72, 2))
    assert "block_n=72" in FlashAttentionForwardSm90.can_implement(narrow, "sm_90a")


def test_o_gets_its_own_shared_memory_where_it_fits():
    aliased = {bucket for bucket in HEAD_DIM_BUCKETS if sm90_fwd_config(bucket, "float16").o_aliases_q}
    assert aliased == {192, 256}


@pytest.mark.parametrize("window", MASK_VARIANTS, ids=str)
def test_sm90_heuristic_by_mask(window):
    left, right = window
    config = sm90_fwd_config(64, "bfloat16", window_left=left, window_right=right)
    assert (config.block_m, config.block_n) == (192, 128)
    assert (config.mask_right, config.mask_left) == (right >= 0, left >= 0)
    assert sm90_fwd_config(256, "bfloat16").rescale_o_early and not sm90_fwd_config(128, "bfloat16").rescale_o_early
    for bucket in HEAD_DIM_BUCKETS:  # turns at every head dim and mask (config.TAKE_TURNS_NOTE)
        assert sm90_fwd_config(bucket, "bfloat16", window_left=left, window_right=right).take_turns
    assert not sm90_fwd_config(256, "bfloat16", take_turns=False).take_turns
    d256 = {dtype: sm90_fwd_config(256, dtype, window_left=left, window_right=right).block_n for dtype in DTYPES}
    assert d256 == {"bfloat16": 80, "float16": 80}


def test_sm90_step_order_by_head_dim_and_mask():
    """config.STEP_ORDER_NOTE: one-chain row sums and the turn taken before the K wait at D=64 without a mask and
    at D=128 (there also passed after Q K^T); elsewhere the order before the sweep; ``step_order`` overrides."""

    def order(bucket, **mask):
        config = sm90_fwd_config(bucket, "float16", **mask)
        return config.sum_chains, config.turn_before_k, config.pass_turn_after_qk

    assert order(128) == order(128, causal=True) == order(128, window_left=64) == (1, True, True)
    assert order(64) == (1, True, False)
    assert order(64, causal=True) == order(256) == order(256, causal=True) == order(96) == (4, False, False)
    config = sm90_fwd_config(128, "bfloat16", step_order=(4, False, True))
    assert (config.sum_chains, config.turn_before_k, config.pass_turn_after_qk) == (4, False, True)


def test_sm90_lazy_rescaling_by_head_dim_and_mask():
    """config.LAZY_RESCALE_NOTE: the Hopper forward rescales lazily (and skips the row max on unmasked tiles) at
    every head dim and mask (at 192 and 256 under a mask with EXP_IN_PLACE_NOTE's step); ``rescale_threshold``
    overrides."""
    for window in MASK_VARIANTS:
        mask = dict(window_left=window[0], window_right=window[1])
        for bucket in HEAD_DIM_BUCKETS:
            for dtype in DTYPES:
                assert sm90_fwd_config(bucket, dtype, **mask).rescale_threshold == LAZY_RESCALE_THRESHOLD
    assert sm90_fwd_config(192, "float16", causal=True, exp_in_place=False).rescale_threshold is None
    assert sm90_fwd_config(128, "bfloat16", rescale_threshold=None).rescale_threshold is None
    assert variant_label(sm90_fwd_config(128, "bfloat16")).endswith("-lazy8-nomask")


def test_sm90_exp_in_place_at_head_dims_192_and_256_under_a_mask():
    """config.EXP_IN_PLACE_NOTE: the heuristic takes it at D=192 and D=256 under a mask only, with lazy rescaling;
    switched off there, the kernel rescales at every step; asked for elsewhere, it brings lazy rescaling along; the
    kernel refuses it without."""
    picks = {(c.head_dim_padded, c.mask_right or c.mask_left) for c in sm90_fwd_variants() if c.exp_in_place}
    assert picks == {(192, True), (256, True)}
    for bucket in (192, 256):
        causal = sm90_fwd_config(bucket, "bfloat16", causal=True)
        assert causal.exp_in_place and causal.rescale_threshold == LAZY_RESCALE_THRESHOLD
        assert variant_label(causal).endswith("-lazy8e-right")
        assert sm90_fwd_config(bucket, "float16", window_left=16, exp_in_place=False).rescale_threshold is None
    assert sm90_fwd_config(128, "float16", causal=True, exp_in_place=True).rescale_threshold == LAZY_RESCALE_THRESHOLD
    assert not sm90_fwd_config(128, "bfloat16", rescale_threshold=None).exp_in_place
    eager = dataclasses.replace(sm90_fwd_config(128, "bfloat16", rescale_threshold=None), exp_in_place=True)
    assert "rescale_threshold" in FlashAttentionForwardSm90.can_implement(eager, "sm_90a")


def test_sm90_empty_rows_keep_zero_under_a_mask_with_short_kv_tiles():
    """config.LAZY_RESCALE_NOTE: only where the diagonal tile leaves rows without a key (block_m > block_n, a mask)."""
    assert sm90_fwd_config(64, "bfloat16", causal=True).empty_rows_keep_zero
    assert sm90_fwd_config(64, "float16", window_left=8).empty_rows_keep_zero
    assert not sm90_fwd_config(64, "bfloat16").empty_rows_keep_zero
    assert not sm90_fwd_config(128, "bfloat16", causal=True).empty_rows_keep_zero
    assert sm90_fwd_config(256, "bfloat16", causal=True, rescale_threshold=8.0).empty_rows_keep_zero


def test_sm90_k_descriptors_by_dtype_and_head_dim():
    """config.K_DESCRIPTORS_NOTE: fp16 takes the uniform stage base at D=256 and 32-bit adds below it, bf16 64-bit
    adds at every head dim but 256 (lazy rescaling there, under a mask too since EXP_IN_PLACE_NOTE), where it takes
    the uniform base too; ``k_descriptors`` overrides, and the kernel refuses a form it does not know."""
    for window in MASK_VARIANTS:
        mask = dict(window_left=window[0], window_right=window[1])
        assert sm90_fwd_config(256, "float16", **mask).k_descriptors == "uniform"
        assert {sm90_fwd_config(d, "float16", **mask).k_descriptors for d in HEAD_DIM_BUCKETS[:-1]} == {"32bit"}
        assert {sm90_fwd_config(d, "bfloat16", **mask).k_descriptors for d in HEAD_DIM_BUCKETS[:-1]} == {"64bit"}
        assert sm90_fwd_config(256, "bfloat16", **mask).k_descriptors == "uniform"
        assert sm90_fwd_config(256, "bfloat16", **mask, rescale_threshold=None).k_descriptors == "64bit"
    assert sm90_fwd_config(128, "bfloat16", k_descriptors="uniform").k_descriptors == "uniform"
    odd = dataclasses.replace(sm90_fwd_config(128, "bfloat16"), k_descriptors="16bit")
    assert "k_descriptors='16bit'" in FlashAttentionForwardSm90.can_implement(odd, "sm_90a")


@pytest.mark.parametrize("window", MASK_VARIANTS, ids=str)
def test_sm90_grid_is_persistent_and_claims_tiles(window):
    left, right = window
    config = sm90_fwd_config(128, "bfloat16", window_left=left, window_right=right)  # 128-row K/V tiles
    assert config.claim_tiles  # under any mask: CLAIM_TILES_NOTE
    for seqlen_k in (1, 32 * 128, 32 * 128 + 1, 10**6):
        assert config.grid_limit(seqlen_k, 132) == 132


def test_sm90_grid_without_claims_gives_long_causal_walks_a_block_a_tile():
    config = sm90_fwd_config(128, "bfloat16", causal=True, claim_tiles=False)
    assert config.grid_limit(32 * 128, 132) == 132  # a walk of 32 K/V tiles: persistent
    assert config.grid_limit(32 * 128 + 1, 132) == 1 << 30  # past 32: every tile its own thread block
    d256 = sm90_fwd_config(256, "bfloat16", causal=True, claim_tiles=False)  # 80-row K/V tiles: past 32 at 2560
    assert d256.grid_limit(2560, 132) == 132 and d256.grid_limit(2561, 132) == 1 << 30


def test_alternative_tiles_are_not_the_heuristics_pick():
    assert (128, 64, 4, 1) not in ALTERNATIVE_TILES["sm80"]  # the sm80 d96 pick
    assert (128, 128, 2) not in ALTERNATIVE_TILES["sm90"]  # the sm90 d96 pick


@pytest.mark.parametrize("config", bwd_prepost_variants(), ids=str)
def test_every_bwd_prepost_config_fits_both_targets(config):
    pre = isinstance(config, BwdPreConfig)
    kernel = FlashAttentionBackwardPreprocessSm80 if pre else FlashAttentionBackwardPostprocessSm80
    for arch in ("sm_80", "sm_90a"):
        assert kernel.can_implement(config, arch) is None


def test_bwd_prepost_kernels_refuse_what_the_copy_cannot_tile():
    rows = dataclasses.replace(bwd_pre_config(128, "bfloat16"), block_m=24)  # 16 rows a pass at head dim 128
    assert "block_m=24" in FlashAttentionBackwardPreprocessSm80.can_implement(rows, "sm_80")
    warps = dataclasses.replace(bwd_post_config(64, "float16"), num_warps=64)
    assert "2048 threads" in FlashAttentionBackwardPostprocessSm80.can_implement(warps, "sm_90a")
    dtype = dataclasses.replace(bwd_post_config(64, "float16"), dtype="float32")
    assert "float32" in FlashAttentionBackwardPostprocessSm80.can_implement(dtype, "sm_80")


@pytest.mark.parametrize("config", sm90_bwd_variants(), ids=str)
def test_every_sm90_bwd_config_fits_sm90a(config: Sm90BwdConfig):
    assert FlashAttentionBackwardSm90.can_implement(config, "sm_90a") is None
    assert config.smem_bytes() <= SM90_MAX_SMEM_BYTES
    assert config.num_threads == 384  # a producer warpgroup and two consumer warpgroups of 64 key rows
    # dQ is split between the two warpgroups by rows (128-row Q tiles) or by the head dim (64-row ones)
    assert config.dq_split_rows == (config.block_m == 128)


def test_sm90_bwd_head_dims():
    assert [d for d in range(8, 257, 8) if sm90_bwd_supports(d)] == [*range(40, 65, 8), *range(104, 129, 8)]
    assert sm90_bwd_config(120, "float16").head_dim_padded == 128
    assert not sm90_bwd_config(120, "float16").exact_head_dim


def test_sm90_bwd_refuses_other_targets_and_bad_tiles():
    config = sm90_bwd_config(128, "bfloat16")
    assert "sm_90a" in FlashAttentionBackwardSm90.can_implement(config, "sm_80")
    cases = {
        (128, 64, 2): "block_n=64",
        (96, 128, 2): "block_m=96",
        (64, 128, 1): "num_stages=1",
    }
    for tiles, message in cases.items():
        assert message in FlashAttentionBackwardSm90.can_implement(
            sm90_bwd_config(128, "bfloat16", tiles=tiles), "sm_90a"
        )
    # 64-row Q tiles split dQ's head dim in two 64-column halves: not at head dim 64
    assert "head_dim_padded=64" in FlashAttentionBackwardSm90.can_implement(
        sm90_bwd_config(64, "bfloat16", tiles=(64, 128, 2)), "sm_90a"
    )
    assert "shared memory" in FlashAttentionBackwardSm90.can_implement(
        sm90_bwd_config(128, "bfloat16", tiles=(128, 128, 2)), "sm_90a"
    )


def test_sm80_heuristic_fits_the_targets_shared_memory():
    """D=256 takes 128-key tiles where sm_90's shared memory holds them (config.py, stop 23's re-timing), and the
    64-key one-stage tile on sm_80, in both dtypes and under every mask; every pick fits its target."""
    for dtype in ("bfloat16", "float16"):
        for causal in (False, True):
            hopper = fwd_config(256, dtype, causal=causal, arch="sm_90a")
            ampere = fwd_config(256, dtype, causal=causal, arch="sm_80")
            assert (hopper.block_n, hopper.num_stages, hopper.warps_n) == (128, 1, 1)
            assert hopper.smem_bytes() > MAX_SMEM_BYTES["sm_80"]
            assert (ampere.block_n, ampere.num_stages, ampere.warps_n) == (64, 1, 1)
    for arch in ("sm_80", "sm_90a"):
        for config in fwd_variants(arch=arch):
            assert FlashAttentionForwardSm80.can_implement(config, arch) is None, (config, arch)


def test_sm80_d128_tiles_by_mask():
    """config.py's D=128 re-timing with the kept-max step: one stage without a mask, two under any mask."""
    for dtype in ("bfloat16", "float16"):
        for window, stages in (((-1, -1), 1), ((-1, 0), 2), ((16, -1), 2), ((16, 4), 2)):
            config = fwd_config(128, dtype, window_left=window[0], window_right=window[1], arch="sm_90a")
            assert (config.block_m, config.block_n, config.num_warps, config.num_stages) == (128, 64, 4, stages)
    assert fwd_config(128, "bfloat16", tiles=(128, 64, 4, 2)).num_stages == 2


def test_sm80_split_rows_limits():
    base = fwd_config(256, "bfloat16", arch="sm_90a", tiles=(128, 64, 8, 2, 2))
    cases = {
        (8, 3): "warps_n=3 is not 1 or 2 dividing num_warps=8",
        (8, 4): "warps_n=4 is not 1 or 2 dividing num_warps=8",
        (5, 2): "warps_n=2 is not 1 or 2 dividing num_warps=5",
    }
    for (num_warps, warps_n), message in cases.items():
        config = dataclasses.replace(base, num_warps=num_warps, warps_n=warps_n)
        assert FlashAttentionForwardSm80.can_implement(config, "sm_90a") == message
    narrow = dataclasses.replace(base, block_n=16)
    message = "block_n=16 is not a multiple of 16 * warps_n = 32"
    assert FlashAttentionForwardSm80.can_implement(narrow, "sm_90a") == message
    assert dataclasses.replace(base, warps_n=1).smem_bytes() == base.smem_bytes() - 2 * 128 * 64 - 4 * 2 * 128
