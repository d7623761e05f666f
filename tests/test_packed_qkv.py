"""q, k and v stacked in one tensor (flash_attn's qkvpacked / kvpacked entries): on the CPU, that each entry hands
views of the stacked tensor and every option to flash_attn_func / flash_attn_varlen_func under the right name, and
results through the float64 stand-in launch; on the GPU, forward and backward against the spec."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

import flashcute
from flashcute import interface, packed_qkv
from flashcute.reference import attention_ref, attention_varlen_ref
from tests.helpers import check_against_spec

ENTRIES = {
    "flash_attn_qkvpacked_func": ("flash_attn_func", ["qkv"]),
    "flash_attn_kvpacked_func": ("flash_attn_func", ["q", "kv"]),
    "flash_attn_varlen_qkvpacked_func": ("flash_attn_varlen_func", ["qkv"]),
    "flash_attn_varlen_kvpacked_func": ("flash_attn_varlen_func", ["q", "kv"]),
}


def randn(*shape, seed=0, device="cpu", dtype=torch.float64):
    generator = torch.Generator(device).manual_seed(seed)
    return torch.randn(*shape, generator=generator, device=device, dtype=dtype)


def cu_seqlens(lengths, device="cpu"):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)


@pytest.mark.parametrize("name", ENTRIES)
def test_each_entry_hands_views_and_every_option_on_by_name(monkeypatch, name):
    """Every parameter gets a distinct stand-in value; the call that reaches the unstacked entry, bound to its
    signature, must carry each under the same name, and q, k, v as views of the stacked tensors."""
    target_name, tensors = ENTRIES[name]
    target = getattr(interface, target_name)
    calls = []
    monkeypatch.setattr(interface, target_name, lambda *args, **kwargs: calls.append((args, kwargs)) or "result")
    entry = getattr(flashcute, name)
    varlen = "varlen" in name
    stacked = {
        "qkv": randn(7, 3, 2, 8) if varlen else randn(2, 7, 3, 2, 8),
        "kv": randn(7, 2, 2, 8) if varlen else randn(2, 7, 2, 2, 8),
        "q": randn(7, 2, 8) if varlen else randn(2, 7, 2, 8),
    }
    values = {}
    for parameter in list(inspect.signature(entry).parameters)[len(tensors) :]:
        values[parameter] = object()
    assert entry(*(stacked[t] for t in tensors), *values.values()) == "result"

    ((args, kwargs),) = calls
    bound = inspect.signature(target).bind(*args, **kwargs).arguments
    for parameter, value in values.items():
        if parameter == "cu_seqlens":
            assert bound["cu_seqlens_q"] is value and bound["cu_seqlens_k"] is value
        elif parameter == "max_seqlen":
            assert bound["max_seqlen_q"] is value and bound["max_seqlen_k"] is value
        else:
            assert bound[parameter] is value, parameter
    source = stacked["qkv"] if "qkv" in tensors else stacked["kv"]
    names = "qkv" if "qkv" in tensors else "kv"
    for i, letter in enumerate(names):
        view = bound[letter]
        assert view._base is source and torch.equal(view, source.select(-3, i)), letter
    if "q" in tensors:
        assert bound["q"] is stacked["q"]


@pytest.mark.parametrize(
    "name, shape, layout",
    [
        ("flash_attn_qkvpacked_func", (2, 7, 2, 2, 8), "(batch, seqlen, 3, nheads, headdim)"),
        ("flash_attn_qkvpacked_func", (7, 3, 2, 8), "(batch, seqlen, 3, nheads, headdim)"),
        ("flash_attn_varlen_qkvpacked_func", (2, 7, 3, 2, 8), "(total, 3, nheads, headdim)"),
    ],
)
def test_a_stacked_tensor_of_another_layout_is_refused_by_name(name, shape, layout):
    sequences = [torch.zeros(3, dtype=torch.int32), 7] if "varlen" in name else []
    with pytest.raises(ValueError, match=re.escape(f"qkv must have shape {layout}, got {shape}")):
        getattr(flashcute, name)(torch.zeros(shape), *sequences)
    with pytest.raises(TypeError, match=re.escape("qkv must be a torch.Tensor, got list")):
        packed_qkv.flash_attn_qkvpacked_func([1, 2, 3])


def test_kvpacked_decoding_through_the_stand_in(stand_in):
    """A decoding-shaped call (the split path, which the stand-in runs) against the spec on the unstacked k, v."""
    q, kv = randn(2, 1, 4, 16, seed=1), randn(2, 50, 2, 2, 16, seed=2)
    out, lse = flashcute.flash_attn_kvpacked_func(q, kv, causal=True, return_lse=True)
    ref_out, ref_lse = attention_ref(q, kv[:, :, 0], kv[:, :, 1], causal=True, return_lse=True)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse.float(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("stacking", ["qkv", "kv"])
def test_varlen_entries_through_the_stand_in(stand_in, stacking):
    lens = [3, 0, 6]
    cu = cu_seqlens(lens)
    qkv = randn(sum(lens), 3, 4, 16, seed=3)
    q, k, v = qkv.unbind(1)
    if stacking == "qkv":
        out = flashcute.flash_attn_varlen_qkvpacked_func(qkv, cu, 6, causal=True)
    else:
        out = flashcute.flash_attn_varlen_kvpacked_func(q, qkv[:, 1:], cu, cu, 6, 6, causal=True)
    torch.testing.assert_close(out, attention_varlen_ref(q, k, v, cu, cu, causal=True), rtol=0, atol=1e-12)


# ---- on the GPU ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 59])
def test_forward_and_backward_against_the_spec(causal, head_dim, kernel):
    """qkvpacked and kvpacked, dense and varlen: out and LSE against the spec, and the stacked tensors' gradients
    against float64 autograd through the spec (check_against_spec_grads on the unstacked parts)."""
    from tests.test_bwd import check_against_spec_grads

    dtype = torch.bfloat16
    qkv = randn(2, 173, 3, 4, head_dim, seed=4, device="cuda", dtype=dtype)
    q_alone = randn(2, 173, 4, head_dim, seed=5, device="cuda", dtype=dtype)
    dout = randn(2, 173, 4, head_dim, seed=6, device="cuda", dtype=dtype)
    options = {"causal": causal, "kernel": kernel}
    lens = [173, 0, 173]
    cu = cu_seqlens(lens, "cuda")
    packed = qkv.reshape(2 * 173, 3, 4, head_dim)  # two sequences and an empty one between them
    runs = {
        "qkv": lambda t, q: flashcute.flash_attn_qkvpacked_func(t, return_lse=True, **options),
        "kv": lambda t, q: flashcute.flash_attn_kvpacked_func(q, t[:, :, 1:], return_lse=True, **options),
        "varlen qkv": lambda t, q: flashcute.flash_attn_varlen_qkvpacked_func(
            t.reshape(packed.shape), cu, 173, return_lse=True, **options
        ),
    }
    for label, run in runs.items():
        leaf, q_leaf = (t.detach().clone().requires_grad_() for t in (qkv, q_alone))
        out, lse = run(leaf, q_leaf)
        q, k, v = q_alone if label == "kv" else qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        if label.startswith("varlen"):
            out, lse = out.view(2, 173, 4, head_dim), lse.view(4, 2, 173).transpose(0, 1)
        check_against_spec(out.detach(), lse, q, k, v, causal=causal)
        out.backward(dout)
        dqkv = leaf.grad.unbind(2)
        if label == "kv":
            assert not dqkv[0].any(), "kv: q's part of the stacked tensor is no input"
        check_against_spec_grads((q_leaf.grad if label == "kv" else dqkv[0], *dqkv[1:]), q, k, v, dout, causal=causal)
