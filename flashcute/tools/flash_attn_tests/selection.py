"""Which of flash-attention 2's tests run against flashcute, as pytest hooks: `flashcute flash-attn-tests` writes a
conftest.py that imports this module beside its copy of the test file.

Importing it puts the stand-in ``flash_attn`` package (adapter/) first on ``sys.path``. Deselected, with the reason
printed: every case with dropout (flashcute has none); the tests of flash-attention 2's own internals
(NO_COUNTERPART); those that expect what flashcute does otherwise by design (DIFFERENT_BY_DESIGN); and the cases a
test skips at its start (skipped_by_the_test). The rest is sampled: the run keeps FLASHCUTE_FA_SAMPLE cases ("all":
every one), at least MIN_PER_TEST of each test function and the rest in proportion to their counts, drawn from
FLASHCUTE_FA_SEED and the test ids alone, so that every pytest-xdist worker keeps the same cases. The counts go to
selection.txt beside the conftest, which the command prints.
"""

from __future__ import annotations

import os
import random
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "adapter"))

MIN_PER_TEST = 20
NO_COUNTERPART = {
    "test_flash_attn_varlen_paged_kv_num_splits": "calls flash-attention 2's private _flash_attn_varlen_forward",
    "test_flash_attn_generator_arg_must_be_none": "calls flash-attention 2's compiled extension",
}
DIFFERENT_BY_DESIGN = {
    "test_flash_attn_kvcache_paged_block_table_bounds": "expects an error from cache_seqlens past the block table, "
    "which flashcute would need a host sync to read (its calls read no device value on the host)",
}


def skipped_by_the_test(name: str, params: dict) -> bool:
    """The cases that test_flash_attn_kvcache skips at its start (half of its grid): not drawn into the sample."""
    if name != "test_flash_attn_kvcache":
        return False
    paged = params["paged_kv_block_size"] is not None
    return (
        (params["seqlen_q"] > params["seqlen_k"] and params["new_kv"])
        or (not params["new_kv"] and params["rotary_fraction"] > 0.0)
        or (paged and (params["has_batch_idx"] or params["has_leftpad"]))
    )


def why_not(name: str, params: dict) -> str | None:
    """Why the case of test function ``name`` with ``params`` does not run against flashcute, or None."""
    if name in NO_COUNTERPART:
        return NO_COUNTERPART[name]
    if name in DIFFERENT_BY_DESIGN:
        return DIFFERENT_BY_DESIGN[name]
    if params.get("dropout_p", 0.0) > 0:
        return "dropout (flashcute has none)"
    if skipped_by_the_test(name, params):
        return "the test skips it"
    return None


def shares(counts: dict[str, int], budget: int) -> dict[str, int]:
    """Cases to keep per test function: min(MIN_PER_TEST, its count) each, the rest of ``budget`` in proportion to
    the cases left (largest remainders first), never more than a function has."""
    take = {name: min(MIN_PER_TEST, n) for name, n in counts.items()}
    left = {name: counts[name] - take[name] for name in counts}
    spare = min(max(budget - sum(take.values()), 0), sum(left.values()))
    if spare:
        exact = {name: spare * n / sum(left.values()) for name, n in left.items()}
        extra = {name: int(value) for name, value in exact.items()}
        by_remainder = sorted(exact, key=lambda name: (exact[name] - extra[name], name), reverse=True)
        for name in by_remainder[: spare - sum(extra.values())]:
            extra[name] += 1
        take = {name: take[name] + extra[name] for name in take}
    return take


@pytest.hookimpl(trylast=True)  # after -k and -m
def pytest_collection_modifyitems(config, items):
    sample = os.environ.get("FLASHCUTE_FA_SAMPLE", "all")
    seed = os.environ.get("FLASHCUTE_FA_SEED", "0")
    collected = Counter(item.originalname for item in items)
    reasons: dict[str, Counter] = defaultdict(Counter)
    runnable: dict[str, list] = defaultdict(list)
    for item in items:
        callspec = getattr(item, "callspec", None)
        reason = why_not(item.originalname, callspec.params if callspec else {})
        if reason is None:
            runnable[item.originalname].append(item)
        else:
            reasons[item.originalname][reason] += 1
    if sample == "all":
        kept = [item for group in runnable.values() for item in group]
    else:
        take = shares({name: len(group) for name, group in runnable.items()}, int(sample))
        kept = []
        for name, group in runnable.items():
            ordered = sorted(group, key=lambda item: item.nodeid)
            kept += random.Random(f"{seed}:{name}").sample(ordered, take[name])
    chosen = {id(item) for item in kept}
    config.hook.pytest_deselected(items=[item for item in items if id(item) not in chosen])
    items[:] = [item for item in items if id(item) in chosen]
    if getattr(config, "workerinput", {}).get("workerid", "gw0") == "gw0":  # one writer under pytest-xdist
        kept_by = Counter(item.originalname for item in items)
        lines = [f"sample {sample}, seed {seed}: {len(items)} of {sum(collected.values())} cases"]
        for name, n in collected.items():
            why = "; ".join(f"{count} not run: {reason}" for reason, count in reasons[name].items())
            lines.append(f"  {name}: {kept_by[name]} of {n}{', ' + why if why else ''}")
        (Path(str(config.rootpath)) / "selection.txt").write_text("\n".join(lines) + "\n")
