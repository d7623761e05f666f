import zlib
from collections.abc import Iterator

import pytest
import torch

from flashcute import interface, kvcache, splitkv, validation
from flashcute.kernels import registry
from flashcute.kernels.common import prepost
from tests.helpers import PackedLaunchStandIn, append_plainly, combine_plainly


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def seeded_by_name(request) -> None:
    """Random inputs drawn from PyTorch's global generator depend on the test alone, not on which tests ran before it
    in the same worker: a failure comes back when that test runs again by itself."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(params=registry.FAMILIES)
def kernel(request) -> str:
    """Each kernel family by name, on the GPUs that run it: a test taking it runs once per family."""
    if request.param not in registry.available():
        pytest.skip(f"kernel {request.param} does not run on this GPU")
    return request.param


@pytest.fixture
def stand_in(monkeypatch) -> Iterator[PackedLaunchStandIn]:
    """The split-KV path (flash_attn_with_kvcache, flash_attn_func) on CPU tensors: the CUDA kernels' input checks
    pass them through, the packed launch is the float64 stand-in (reading a paged cache where it lies, as the
    Hopper kernels do: registry.reads_pages says yes; on the split path SplitPlan.attend's), the combine
    ``combine_plainly``, the cache's writes ``append_plainly``, and split-KV cuts keys into chunks of 2 (at least 4
    to a split, for a GPU of 132 SMs), so that small caches split."""
    launch = PackedLaunchStandIn()
    monkeypatch.setattr(interface, "varlen_outputs", launch)
    monkeypatch.setattr(prepost, "combine", combine_plainly)
    monkeypatch.setattr(prepost, "append", append_plainly)

    def attend(split, queries, keys, values, key_chunks, softmax_scale, kernel, softcap, pages):
        cu_seqlens_q, seqused_q = split.query_rows()
        out, lse = launch(
            queries[0], keys, values, cu_seqlens_q, key_chunks[0], seqused_q, key_chunks[1], split.rows, split.chunk,
            softmax_scale, -1, -1, kernel, softcap, pages=pages,
        )  # fmt: skip
        return out[None], lse[None]  # (the launch's batch of one)

    monkeypatch.setattr(splitkv.SplitPlan, "attend", attend)  # the split path's packed launch
    for module in (validation, interface):
        monkeypatch.setattr(module, "validate_cuda_inputs", lambda q, k, v, args: (q, k, v))
    monkeypatch.setattr(validation, "check_cuda_tensors", lambda tensors, args: None)
    for module in (splitkv, interface):
        monkeypatch.setattr(module, "num_sms", lambda device: 132)
    monkeypatch.setattr(registry, "reads_pages", lambda device, kernel, head_dim, head_dim_v, page_size: True)
    monkeypatch.setattr(splitkv, "KEY_TILE", 2)
    monkeypatch.setattr(splitkv, "MIN_SPLIT_KEYS", 4)
    splitkv.plan.cache_clear()  # plans made under these sizes stay with these tests
    interface._plans.clear()
    yield launch
    splitkv.plan.cache_clear()
    interface._plans.clear()


@pytest.fixture(autouse=True)
def fresh_kvcache_checks():
    """flash_attn_with_kvcache checks each call signature once (kvcache._checked): every test starts without the
    checks of another, which may have passed under stand-ins or patched checks."""
    kvcache._checked.clear()
