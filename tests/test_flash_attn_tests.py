"""`flashcute flash-attn-tests`: the stand-in flash_attn package that runs flash-attention 2's own tests against
flashcute, the cases it keeps, and the command end to end on a small test file of the same shape (on the GPU host
it runs flash-attention's tests/test_flash_attn.py; docs/compatibility.md)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

import flashcute
from flashcute.cli import main
from flashcute.kvcache import apply_rotary
from flashcute.tools import flash_attn_tests
from flashcute.tools.flash_attn_tests import selection

ADAPTER = Path(flash_attn_tests.__file__).parent / "adapter" / "flash_attn"


def adapter_module(relative: str):
    """A module of the stand-in package, loaded from its file under a name of its own, so that nothing named
    flash_attn enters this process's imports."""
    spec = importlib.util.spec_from_file_location(f"stand_in_{relative.replace('/', '_')[:-3]}", ADAPTER / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# flash-attention 2's signatures (flash_attn/flash_attn_interface.py): the arguments after the tensors, in order
FA2_OPTIONS = ["dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes", "deterministic"]
FA2_CALLS = {
    "flash_attn_func": ["q", "k", "v", *FA2_OPTIONS, "return_attn_probs"],
    "flash_attn_qkvpacked_func": ["qkv", *FA2_OPTIONS, "return_attn_probs"],
    "flash_attn_kvpacked_func": ["q", "kv", *FA2_OPTIONS, "return_attn_probs"],
    "flash_attn_varlen_qkvpacked_func": ["qkv", "cu_seqlens", "max_seqlen", *FA2_OPTIONS, "return_attn_probs"],
    "flash_attn_varlen_kvpacked_func": [
        "q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", *FA2_OPTIONS, "return_attn_probs",
    ],
    "flash_attn_varlen_func": [
        "q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", *FA2_OPTIONS,
        "return_attn_probs", "block_table",
    ],
    "flash_attn_with_kvcache": [
        "q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens", "cache_batch_idx",
        "cache_leftpad", "block_table", "softmax_scale", "causal", "window_size", "softcap", "rotary_interleaved",
        "alibi_slopes", "num_splits", "return_softmax_lse",
    ],
}  # fmt: skip
# flashcute's name for a flash-attention 2 argument where they differ (dropout_p: only 0 maps, and is not passed)
RENAMED = {"return_attn_probs": "return_lse"}


@pytest.mark.parametrize("entry", list(FA2_CALLS))
def test_positional_calls_reach_flashcute_by_name(monkeypatch, entry):
    """Each argument of a call made positionally in flash-attention 2's order reaches flashcute's entry under
    flashcute's name for it (flashcute takes softmax_scale where flash-attention 2 takes dropout_p)."""
    seen = {}

    def stand_in(*args, **kwargs):
        seen.update(zip(FA2_CALLS[entry], args, strict=False), **kwargs)
        return "out", "lse"

    monkeypatch.setattr(flashcute, entry, stand_in)
    flags = {"dropout_p": 0.0, "return_attn_probs": True, "return_softmax_lse": True}
    values = {name: flags.get(name, f"<{name}>") for name in FA2_CALLS[entry]}
    result = getattr(adapter_module("flash_attn_interface.py"), entry)(*values.values())
    expected = {RENAMED.get(name, name): value for name, value in values.items() if name != "dropout_p"}
    assert seen == expected
    assert result == (("out", "lse") if entry == "flash_attn_with_kvcache" else ("out", "lse", None))


def test_dropout_is_refused_by_name():
    interface = adapter_module("flash_attn_interface.py")
    q = torch.zeros(1, 1, 1, 8)
    with pytest.raises(NotImplementedError, match=re.escape("dropout_p must be 0, got 0.1")):
        interface.flash_attn_func(q, q, q, 0.1)


@pytest.mark.parametrize("interleaved", [True, False])
def test_the_reference_rotary_turns_as_flashcute_and_not_past_its_table(interleaved):
    """The stand-in apply_rotary_emb (the tests' reference, written apart from flashcute's) agrees with
    kvcache.apply_rotary at offsets per sequence, packed or not, and leaves positions past its table unturned."""
    rotary = adapter_module("layers/rotary.py").apply_rotary_emb
    x = torch.randn(3, 5, 2, 16)  # (float32, in which both turn it)
    cos, sin = torch.randn(9, 6), torch.randn(9, 6)
    offsets = torch.tensor([0, 2, 4])
    positions = offsets[:, None] + torch.arange(5)
    expected = apply_rotary(x, cos, sin, positions, interleaved)
    torch.testing.assert_close(rotary(x, cos, sin, interleaved, seqlen_offsets=offsets), expected, rtol=0, atol=0)
    packed = rotary(
        x.flatten(0, 1), cos, sin, interleaved, seqlen_offsets=offsets, cu_seqlens=torch.tensor([0, 5, 10, 15])
    )
    torch.testing.assert_close(packed, expected.flatten(0, 1), rtol=0, atol=0)
    past = rotary(x, cos, sin, interleaved, seqlen_offsets=7)  # positions 7 .. 11 of a 9-row table
    torch.testing.assert_close(past[:, 2:], x[:, 2:], rtol=0, atol=0)
    inside = apply_rotary(x[:, :2], cos, sin, torch.tensor([[7, 8]]).expand(3, 2), interleaved)
    torch.testing.assert_close(past[:, :2], inside, rtol=0, atol=0)


def test_each_test_keeps_its_floor_and_the_rest_goes_by_size():
    take = selection.shares({"a": 5, "b": 100, "c": 300}, 85)
    assert take == {"a": 5, "b": 29, "c": 51}  # 5 + 20 + 20, then 40 more as 80 : 280 (8.9 and 31.1, rounded)
    assert selection.shares({"a": 5, "b": 100}, 10) == {"a": 5, "b": 20}  # the floors win over a small budget
    assert selection.shares({"a": 5, "b": 30}, 1000) == {"a": 5, "b": 30}


def test_dropout_and_internals_are_not_run():
    assert selection.why_not("test_flash_attn_output", {"dropout_p": 0.17}) == "dropout (flashcute has none)"
    assert selection.why_not("test_flash_attn_output", {"dropout_p": 0.0}) is None
    kvcache = {"seqlen_q": 1, "seqlen_k": 128, "new_kv": True, "rotary_fraction": 0.5, "paged_kv_block_size": 256}
    kvcache |= {"has_batch_idx": False, "has_leftpad": False}
    assert selection.why_not("test_flash_attn_kvcache", kvcache) is None
    for change in ({"seqlen_q": 129}, {"new_kv": False}, {"has_batch_idx": True}, {"has_leftpad": True}):
        assert selection.why_not("test_flash_attn_kvcache", kvcache | change) == "the test skips it"
    for name in (*selection.NO_COUNTERPART, *selection.DIFFERENT_BY_DESIGN):
        assert selection.why_not(name, {}) is not None


SMALL_SUITE = """
import flash_attn
import pytest


@pytest.mark.parametrize("dropout_p", [0.0, 0.17])
@pytest.mark.parametrize("d", range(40))
def test_flash_attn_output(d, dropout_p):
    assert "adapter" in flash_attn.__file__ and dropout_p == 0.0


@pytest.mark.parametrize("n", range(6))
def test_flash_attn_bwd_overflow(n):
    pass


def test_flash_attn_generator_arg_must_be_none():
    raise AssertionError("a test of flash-attention 2's extension")
"""


@pytest.mark.parametrize("sample, kept", [("30", (24, 6)), ("all", (40, 6))])
def test_the_command_runs_the_kept_cases_against_the_stand_in(tmp_path, monkeypatch, capfd, sample, kept):
    monkeypatch.setattr(flash_attn_tests, "REQUIRED", ())  # (the small suite imports no einops)
    tests = tmp_path / "test_flash_attn.py"
    tests.write_text(SMALL_SUITE)
    assert main(["flash-attn-tests", "--sample", sample, "--workers", "1", str(tests)]) == 0
    out = capfd.readouterr().out
    assert f"{sum(kept)} passed" in out
    assert f"test_flash_attn_output: {kept[0]} of 80, 40 not run: dropout (flashcute has none)" in out
    assert f"test_flash_attn_bwd_overflow: {kept[1]} of 6\n" in out
    assert "test_flash_attn_generator_arg_must_be_none: 0 of 1, 1 not run: calls flash-attention 2's" in out
    assert out.splitlines()[-1] == "flashcute flash-attn-tests: every case run passed (0)"


def test_the_outcome_is_the_last_line_when_a_case_fails(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(flash_attn_tests, "REQUIRED", ())
    tests = tmp_path / "test_flash_attn.py"
    tests.write_text(SMALL_SUITE.replace("    pass\n", "    assert n != 3\n"))
    assert main(["flash-attn-tests", "--sample", "all", "--workers", "1", str(tests)]) == 1
    out = capfd.readouterr().out
    assert "1 failed" in out and out.splitlines()[-1] == "flashcute flash-attn-tests: some cases failed (1)"


def test_bad_arguments_are_named(tmp_path, capsys):
    assert main(["flash-attn-tests", str(tmp_path / "missing.py")]) == 2
    assert "missing.py is not a file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["flash-attn-tests", "--sample", "0", str(tmp_path)])
    assert "--sample must be 'all' or a number of cases above 0, got '0'" in capsys.readouterr().err
