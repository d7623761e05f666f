"""Configs of the Hopper family (TMA, wgmma, warp specialization) and the heuristics that pick them.

A config holds every compile-time choice of one kernel and nothing that changes per call; it is the compile-cache
key. Each heuristic choice carries its reason in one line; the measurements behind it are in docs/tuning-sm90.md,
under the section named beside it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from flashcute.kernels.common.limits import (
    MAX_SMEM_BYTES,
    attention_label,
    head_dim_bucket,
    masks,
    value_fields,
    value_head_dim,
)

SMEM_BYTES = MAX_SMEM_BYTES["sm_90a"]
# K and V tiles in flight: the producer loads one K/V tile ahead of the one the consumers read.
NUM_STAGES = 2
K_DESCRIPTOR_FORMS = ("64bit", "32bit", "uniform")
# One consumer warpgroup's query rows: packed launches whose sequences have no more (decoding's split-KV walks) take
# tiles of this many rows.
SHORT_QUERY_ROWS = 64


@dataclass(frozen=True)
class Sm90FwdConfig:
    """The Hopper forward kernel (kernels/sm90/fwd.py).

    block_m rows of Q per thread block, in block_m / 64 consumer warpgroups of 64 rows; block_n rows of K/V per
    main-loop step, NUM_STAGES shared-memory buffers each for K and V, filled by TMA. Every kernel rescales lazily
    (softmax.RESCALE_THRESHOLD): its steps on unmasked tiles keep each row's max.

    rescale_o_early:    U *= alpha for tile n is applied at the next step, while that step's Q K^T runs, instead
                        of after tile n's P V (worth it where U is large)
    sum_chains:         independent chains for each row's sum in the softmax (its max keeps 4)
    turn_before_k:      a step takes its turn before it waits for its K tile, not after
    pass_turn_after_qk: a step passes the turn once its Q K^T is issued, before its P V, not after
    k_descriptors:      how a step computes K's descriptors from the stage index: one of K_DESCRIPTOR_FORMS
                        (wgmma.stage_steps says what each costs)
    exp_in_place:       the steps of unmasked tiles take E into S's registers while the previous tile's P V still
                        runs, and into P only after it (softmax.online_softmax_in_place); else E goes straight into P,
                        after that P V (softmax.online_softmax_kept_max)
    packed:             the batch is packed variable-length sequences (kernels/common/seqlen.py)
    softcap:            the scores are capped, softcap * tanh(score / softcap) (kernels/common/softcap.py)
    sink:               every row's denominator takes its head's learnable sink (softmax.finalize)
    alibi:              the scores take the ALiBi bias -slope * |i + offset - j| (kernels/common/alibi.py)
    head_dim_v_padded:  v's (and O's) head-dim bucket where it is not q's and k's (at most theirs); None: theirs
    exact_head_dim_v:   v's head dim equals head_dim_v_padded (with head_dim_v_padded only)
    page_rows:          (packed only) K and V lie in the pages of a cache (flash_attn_with_kvcache's block_table), a
                        tile's rows loaded page_rows at a time, each box from its own page (page_rows divides the
                        page size and block_n); 0: the rows lie where the packed batch says
    """

    dtype: str
    head_dim_padded: int
    exact_head_dim: bool
    block_m: int
    block_n: int
    mask_right: bool
    mask_left: bool
    head_dim_v_padded: int | None = None
    exact_head_dim_v: bool = True
    rescale_o_early: bool = False
    sum_chains: int = 4
    turn_before_k: bool = False
    pass_turn_after_qk: bool = False
    k_descriptors: str = "64bit"
    exp_in_place: bool = False
    packed: bool = False
    softcap: bool = False
    sink: bool = False
    alibi: bool = False
    page_rows: int = 0

    @property
    def label(self) -> str:
        """ "sm90-bfloat16-d128-128x128s2-lazy8-right" ("-early": rescale_o_early; "-lazy8e": exp_in_place)."""
        early = "-early" if self.rescale_o_early else ""
        in_place = "e" if self.exp_in_place else ""
        tiles = f"{self.block_m}x{self.block_n}s{NUM_STAGES}"
        return attention_label(self, "sm90", f"{tiles}{early}-lazy8{in_place}")

    @property
    def empty_rows_keep_zero(self) -> bool:
        """Whether the kept-max steps let a row still at -inf keep m = 0 (softmax.online_softmax_kept_max): under a
        mask, with K/V tiles shorter than the Q tile, whose first (diagonal) tile shows no key to many rows
        (docs/tuning-sm90.md, Rows that have seen no key)."""
        return (self.mask_right or self.mask_left) and self.block_m > self.block_n

    @property
    def num_mma_warpgroups(self) -> int:
        return self.block_m // 64

    @property
    def num_threads(self) -> int:
        """One producer warpgroup (TMA) and the consumer warpgroups (wgmma and softmax)."""
        return 128 * (1 + self.num_mma_warpgroups)

    @property
    def o_aliases_q(self) -> bool:
        """O is staged for its TMA store in Q's shared memory (not its own) when both would not fit."""
        return self._smem_bytes(separate_o=True) > SMEM_BYTES

    def smem_bytes(self) -> int:
        """Q, O unless it aliases Q, NUM_STAGES K and V tiles (2 bytes an element), and one KB for the mbarriers
        and alignment."""
        return self._smem_bytes(separate_o=not self.o_aliases_q)

    def _smem_bytes(self, separate_o: bool) -> int:
        d, dv = self.head_dim_padded, value_head_dim(self)
        q_and_k = (self.block_m + NUM_STAGES * self.block_n) * d
        v_and_o = (NUM_STAGES * self.block_n + (self.block_m if separate_o else 0)) * dv
        return 2 * (q_and_k + v_and_o) + 1024


def _forward_tiles(bucket: int, bucket_v: int) -> tuple[int, int]:
    """(block_m, block_n) for q's and v's head-dim buckets, masked or not (docs/tuning-sm90.md, Forward tiles)."""
    if bucket == 192 and bucket_v <= 128:
        return (128, 128)  # V and O of at most 128 columns leave room for D=128's tiles (O in Q's shared memory)
    if bucket == 64:
        return (192, 128)  # three consumer warpgroups: the short step needs more rows to hide the softmax
    if bucket == 192:
        return (128, 96)  # ahead of 112- and 64-row K/V tiles at 3 of 4 points
    if bucket == 256:
        return (128, 80)  # 80-row K/V tiles with P converted in pairs beat 64-row ones
    return (128, 128)  # D=32, 96, 128: the register budget of two 64-row consumer warpgroups


def _step_order(bucket: int, masked: bool) -> tuple[int, bool, bool]:
    """(sum_chains, turn_before_k, pass_turn_after_qk): ptxas schedules the softmax around the MMA waits
    differently for each order, a few per cent a step (docs/tuning-sm90.md, Step order)."""
    if bucket == 64 and not masked:
        return (1, True, False)  # 0.973 / 0.983 of the default's tile cycles
    if bucket == 128:
        return (1, True, True)  # 0.972-0.983 of the default's tile cycles, masked or not
    return (4, False, False)  # elsewhere no order beat the default (D=256) or none was measured


def _k_descriptors(bucket: int, dtype: str) -> str:
    """Sm90FwdConfig.k_descriptors (docs/tuning-sm90.md, K descriptors)."""
    if bucket == 256:
        return "uniform"  # the lazy D=256 step's descriptors otherwise leave the uniform registers
    return "32bit" if dtype == "float16" else "64bit"  # the fewest SASS instructions a step for each dtype


@functools.cache
def sm90_fwd_config(
    head_dim: int,
    dtype: str,
    window_left: int = -1,
    window_right: int = -1,
    packed: bool = False,
    softcap: bool = False,
    sink: bool = False,
    alibi: bool = False,
    head_dim_v: int | None = None,
    page_size: int = 0,
    short_queries: bool = False,
) -> Sm90FwdConfig:
    """The heuristic for the Hopper forward kernel (window_right = 0 is causal; ``packed``: for packed
    variable-length batches, ``softcap``: for capped scores, ``sink``: with learnable sinks, ``alibi``: with ALiBi
    biases, each with the same tiles; ``head_dim_v``: v's head dim where it is not q's, at most q's bucket;
    ``page_size``: packed, K and V in pages of that many rows (a multiple of 8); ``short_queries``: packed, without
    a mask, no sequence has more than SHORT_QUERY_ROWS query rows)."""
    bucket = head_dim_bucket(head_dim)
    values = value_fields(head_dim, head_dim_v)
    bucket_v = values.get("head_dim_v_padded", bucket)
    mask_right, mask_left = masks(window_left, window_right)
    masked = mask_right or mask_left
    block_m, block_n = _forward_tiles(bucket, bucket_v)
    if short_queries and packed and not masked:  # one warpgroup: a second would only compute rows past every sequence
        block_m = SHORT_QUERY_ROWS  # (Tiles for short queries)
    sum_chains, turn_before_k, pass_turn_after_qk = _step_order(bucket, masked)
    return Sm90FwdConfig(
        dtype=dtype,
        head_dim_padded=bucket,
        exact_head_dim=head_dim == bucket,
        block_m=block_m,
        block_n=block_n,
        mask_right=mask_right,
        mask_left=mask_left,
        # U is 128 registers a thread at v's D=256: rescaled under the next Q K^T (FlashAttention-4's rule)
        rescale_o_early=bucket_v > 128,
        sum_chains=sum_chains,
        turn_before_k=turn_before_k,
        pass_turn_after_qk=pass_turn_after_qk,
        k_descriptors=_k_descriptors(bucket, dtype),
        # under a mask with V of 192 columns or more P V is as long as Q K^T: E goes ahead of it (docs/tuning-sm90.md,
        # E in place of S)
        exp_in_place=masked and bucket_v >= 192,
        packed=packed,
        softcap=softcap,
        sink=sink,
        alibi=alibi,
        # a page's rows are a whole number of boxes, and so are a tile's: the largest box that divides both
        page_rows=math.gcd(page_size, block_n) if page_size else 0,
        **values,
    )


@dataclass(frozen=True)
class Sm90BwdConfig:
    """The Hopper backward kernels (kernels/sm90/bwd.py; over head dim 128, kernels/sm90/bwd_wide.py: ``wide``).

    block_n rows of K/V per thread block, split between two consumer warpgroups (64 key rows each, or when wide
    half of S's key columns each); block_m rows of Q per step, num_stages shared-memory buffers of Q, dO, LSE and D
    (filled by TMA) and of dS. The dQ GEMM of a step is split between the two consumer warpgroups along its rows
    when block_m is 128, along the head dim when block_m is 64; at block_m = 80 (no warpgroup's M) they compute
    dQ^T = K^T dS, 64 head-dim rows each (dq_transposed).
    packed: the batch is packed variable-length sequences (kernels/common/seqlen.py).
    softcap: the scores are capped, softcap * tanh(score / softcap) (kernels/common/softcap.py).
    alibi: the scores take the ALiBi bias (kernels/common/alibi.py).
    deterministic: the K/V tiles add into each Q tile's dQ in a fixed order (kernels/common/semaphore.py), so dQ is
    the same bit for bit from run to run.
    dv_before_ds: dV's MMA is issued as soon as P^T is in registers and runs while dS^T is computed; else once dS^T
    is in registers, before the dS^T barrier (P^T's registers are then free while dS^T is computed).
    dk_after_dq: dK's MMA is issued after dQ's and runs while dQ goes to shared memory; else with dV's (after it),
    and dQ waits for both (dS^T's registers are then free while dQ goes to shared memory). Both the keys-as-rows
    kernel's only: the wide one issues dV^T's and dK^T's MMAs before dQ's.
    lse_ahead: the step reads its Q tile's LSE from shared memory into registers before it waits for S^T, so
    that the loads' latency hides under the MMAs; else at its use, after the wait (fewer registers live across
    it). Keys-as-rows only.
    """

    dtype: str
    head_dim_padded: int
    exact_head_dim: bool
    block_m: int
    block_n: int
    mask_right: bool
    mask_left: bool
    packed: bool = False
    softcap: bool = False
    alibi: bool = False
    deterministic: bool = False
    dv_before_ds: bool = True
    dk_after_dq: bool = True
    lse_ahead: bool = False

    @property
    def label(self) -> str:
        """ "sm90bwd-bfloat16-d128-64x128s2-right" ("-dvlate": not dv_before_ds; "-dkearly": not dk_after_dq;
        "-lse": lse_ahead; "-det": deterministic)."""
        order = ("" if self.dv_before_ds else "-dvlate") + ("" if self.dk_after_dq else "-dkearly")
        order += "-lse" if self.lse_ahead else ""
        order += "-det" if self.deterministic else ""
        tiles = f"{self.block_m}x{self.block_n}s{self.num_stages}{order}"
        return attention_label(self, "sm90bwd", tiles)

    @property
    def num_stages(self) -> int:
        """Shared-memory buffers of Q, dO, LSE and D (and of dS): the wide kernel's K/V, P, dS and dQ tiles leave
        room for one (D=192's 96-key tiles, D=256's 64 KB dQ tile)."""
        return 1 if self.wide else NUM_STAGES

    @property
    def wide(self) -> bool:
        """Head dims over 128 run with the queries as rows and dK, dV transposed (kernels/sm90/bwd_wide.py): two
        consumer warpgroups whatever block_n, which they split."""
        return self.head_dim_padded > 128

    @property
    def num_mma_warpgroups(self) -> int:
        return 2 if self.wide else self.block_n // 64

    @property
    def num_threads(self) -> int:
        """One producer warpgroup (TMA) and the consumer warpgroups (wgmma)."""
        return 128 * (1 + self.num_mma_warpgroups)

    @property
    def dq_split_rows(self) -> bool:
        """The consumer warpgroups split dQ's rows (True) or its head dim (False)."""
        return self.block_m == 64 * self.num_mma_warpgroups

    @property
    def dq_transposed(self) -> bool:
        """A Q tile's rows are no multiple of a warpgroup's 64: the step computes dQ^T, the head dim as rows."""
        return self.block_m % 64 != 0

    def smem_bytes(self) -> int:
        """K and V tiles, num_stages Q and dO tiles, dS tiles (num_stages of them; when wide two of P and two of
        dS; 2 bytes an element), num_stages LSE and D rows and a dQ tile (4 bytes an element), and one KB for the
        mbarriers and alignment."""
        d, stages = self.head_dim_padded, self.num_stages
        score_tiles = 4 if self.wide else stages
        tiles = 2 * (2 * self.block_n * d + stages * 2 * self.block_m * d + score_tiles * self.block_n * self.block_m)
        return tiles + 4 * (2 * stages * self.block_m + self.block_m * d) + 1024


def _backward_tiles(bucket: int, softcap: bool, alibi: bool, masked: bool) -> tuple[int, int]:
    """(block_m, block_n) of a head-dim bucket (docs/tuning-sm90.md, Backward tiles; over 128, Backward at D=192
    and D=256); ``masked``: a causal or window mask."""
    keeps_t = softcap and alibi  # the step holds a copy of the capped scores beside the bias
    if bucket <= 64:
        return (128, 128)  # at 32 and 64 the Q tile can be 128 rows
    if bucket == 96:
        return (64, 128)  # FlashAttention-3's D=96 tile; dQ's head dim split 48 + 48 (K in 16-column swizzle atoms)
    if bucket == 128 and not (masked or softcap or alibi):
        return (80, 128)  # FlashAttention-3's: a step's fixed costs over 80 rows (dQ^T); cap, bias: spills or serial
    if bucket == 128:
        return (64, 128)  # under a mask both references' too; the 80-row masked kernel spills and serializes wgmmas
    if bucket == 192:
        if keeps_t:
            return (64, 64)  # with the capped scores' copy, 96-key tiles spill (2-6 registers), 64-key ones do not
        return (64, 96)  # FlashAttention-3's: S, dP, dK^T and dV^T 48 keys wide a warpgroup; one Q/dO stage fits
    return (64, 64)  # D=256: dK^T and dV^T of 256 x 32 a warpgroup; one Q/dO stage beside the 64 KB dQ tile


@functools.cache
def sm90_bwd_config(
    head_dim: int,
    dtype: str,
    window_left: int = -1,
    window_right: int = -1,
    packed: bool = False,
    softcap: bool = False,
    alibi: bool = False,
    deterministic: bool = False,
) -> Sm90BwdConfig:
    """The heuristic for the Hopper backward kernel (window_right = 0 is causal; ``packed`` and ``softcap`` as in
    sm90_fwd_config; ``deterministic``: dQ added in a fixed order)."""
    bucket = head_dim_bucket(head_dim)
    mask_right, mask_left = masks(window_left, window_right)
    tiles = _backward_tiles(bucket, softcap, alibi, mask_right or mask_left)
    return Sm90BwdConfig(
        dtype=dtype,
        head_dim_padded=bucket,
        exact_head_dim=head_dim == bucket,
        block_m=tiles[0],
        block_n=tiles[1],
        mask_right=mask_right,
        mask_left=mask_left,
        packed=packed,
        softcap=softcap,
        alibi=alibi,
        deterministic=deterministic,
        # D=128: dV under dS^T, 1.03-1.07x; D=64: P^T (32 registers) held through dS^T spills (tuning-sm90.md),
        # and so does D=128's 80-row P^T (and serializes the wgmmas); D=96 spills in neither order: D=128's
        dv_before_ds=bucket >= 96 and tiles[0] != 80,
        # D=64: dS^T (32 registers) held through dQ's MMA spills (2 spill instructions without a mask, 27 causal);
        # measured 0.97-1.03x
        dk_after_dq=bucket != 64,
        # D=128 causal: 1.00-1.03x; D=32 and D=96 (D read ahead too): 0.94-0.96x and 0.93-1.02x; D=64 (32 values
        # a thread), the 80-row tiles, two-sided windows of packed batches, capped or biased scores spill
        lse_ahead=bucket == 128 and mask_right and not (mask_left or softcap or alibi),
    )
