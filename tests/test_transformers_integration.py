"""flashcute.integrations.transformers on CPU: the registration, and the mapping of transformers' arguments onto
flashcute's calls, with flashcute's attention functions replaced by float64 stand-ins built on the reference.

A tiny random Llama (and a Mistral, for its sliding window) run with the flashcute implementation must give the
logits that transformers' own "sdpa" and "eager" implementations give."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import flashcute  # noqa: E402
from flashcute.integrations.transformers import DEFAULT_NAME, attention_forward, register  # noqa: E402
from flashcute.reference.naive import attention_ref  # noqa: E402

NAME = register()


class Calls:
    """float64 stand-ins for flash_attn_func and flash_attn_varlen_func, recording what they were called with and
    checking the varlen conventions (int32 cu_seqlens of batch + 1 entries from 0 to total, int max_seqlen)."""

    def __init__(self):
        self.dense: list[dict] = []
        self.varlen: list[dict] = []

    def flash_attn_func(self, q, k, v, deterministic=False, **options):
        self.dense.append({**options, "deterministic": deterministic, "dtype": q.dtype})
        return attention_ref(q, k, v, **options).to(q.dtype)

    def flash_attn_varlen_func(
        self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, deterministic=False, **options
    ):
        for cu_seqlens, max_seqlen, rows in ((cu_seqlens_q, max_seqlen_q, q), (cu_seqlens_k, max_seqlen_k, k)):
            assert cu_seqlens.dtype == torch.int32 and cu_seqlens.dim() == 1 and cu_seqlens.device == q.device
            assert cu_seqlens[0] == 0 and cu_seqlens[-1] == rows.shape[0]
            assert type(max_seqlen) is int and max_seqlen == cu_seqlens.diff().max()
        self.varlen.append({**options, "cu_seqlens_q": cu_seqlens_q.tolist(), "cu_seqlens_k": cu_seqlens_k.tolist()})
        out = torch.zeros_like(q)
        for b in range(len(cu_seqlens_q) - 1):
            rows_q = slice(cu_seqlens_q[b], cu_seqlens_q[b + 1])
            rows_k = slice(cu_seqlens_k[b], cu_seqlens_k[b + 1])
            if rows_q.start < rows_q.stop:
                out[rows_q] = attention_ref(q[None, rows_q], k[None, rows_k], v[None, rows_k], **options)[0]
        return out


@pytest.fixture
def calls(monkeypatch) -> Calls:
    calls = Calls()
    monkeypatch.delenv("FLASH_ATTENTION_DETERMINISTIC", raising=False)
    monkeypatch.setattr(flashcute, "flash_attn_func", calls.flash_attn_func)
    monkeypatch.setattr(flashcute, "flash_attn_varlen_func", calls.flash_attn_varlen_func)
    return calls


def tiny_llama(**config) -> torch.nn.Module:
    """Random Llama: hidden 64, 2 layers, 4 heads (of 16 unless config says) sharing 2 kv heads, vocab 128."""
    torch.manual_seed(0)
    sizes = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 128}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2}
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**sizes, **heads, **config)).eval()


def logits(model, implementation, input_ids, **inputs) -> torch.Tensor:
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        return model(input_ids, use_cache=False, **inputs).logits


def test_registered_with_its_mask_format():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert NAME == DEFAULT_NAME
    assert ALL_ATTENTION_FUNCTIONS[NAME] is attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS[NAME] is flash_attention_mask  # a 2-D padding mask or None, as for FA2
    assert register("my_cute") == "my_cute" and "my_cute" in transformers.AttentionInterface().valid_keys()
    with pytest.raises(ValueError, match="must not contain 'flash'"):
        register("flashcute")


def test_padded_batch_matches_sdpa_and_eager(calls):
    model = tiny_llama()
    input_ids = torch.randint(0, 128, (3, 9))
    attention_mask = torch.ones(3, 9, dtype=torch.long)
    attention_mask[0, 6:] = 0  # right padding
    attention_mask[1, :4] = 0  # left padding; row 2 has none
    got = logits(model, NAME, input_ids, attention_mask=attention_mask)
    real = attention_mask.bool()
    for reference in ("sdpa", "eager"):
        expected = logits(model, reference, input_ids, attention_mask=attention_mask)
        torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-5)
    assert not calls.dense
    assert [call["cu_seqlens_q"] for call in calls.varlen] == [[0, 6, 11, 20]] * 2  # once per layer
    assert all(call["causal"] and call["cu_seqlens_k"] == call["cu_seqlens_q"] for call in calls.varlen)


def test_batch_without_padding_takes_the_dense_path(calls):
    model = tiny_llama()
    input_ids = torch.randint(0, 128, (2, 7))
    got = logits(model, NAME, input_ids, attention_mask=torch.ones(2, 7, dtype=torch.long))
    torch.testing.assert_close(got, logits(model, "sdpa", input_ids), rtol=1e-5, atol=1e-5)
    assert not calls.varlen
    assert [call["causal"] for call in calls.dense] == [True, True]
    assert calls.dense[0]["softmax_scale"] == 16**-0.5 and calls.dense[0]["window_size"] == (-1, -1)


PACKED_LENGTHS = (3, 4, 2)


def packed_inputs(lengths, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids (1, sum(lengths)) of sequences packed without padding, and their restarting position_ids."""
    input_ids = torch.randint(0, 128, (1, sum(lengths)), device=device)
    position_ids = torch.cat([torch.arange(n, device=device) for n in lengths])[None]
    return input_ids, position_ids


def per_sequence(model, implementation, input_ids, lengths) -> torch.Tensor:
    """The logits of packed sequences, each run alone."""
    pieces = input_ids.split(lengths, dim=1)
    return torch.cat([logits(model, implementation, piece) for piece in pieces], dim=1)


def test_packed_sequences_from_restarting_position_ids(calls):
    model = tiny_llama()
    input_ids, position_ids = packed_inputs(PACKED_LENGTHS)
    got = logits(model, NAME, input_ids, position_ids=position_ids)
    torch.testing.assert_close(got, per_sequence(model, "sdpa", input_ids, PACKED_LENGTHS), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, logits(model, "sdpa", input_ids, position_ids=position_ids), rtol=1e-5, atol=1e-5)
    assert not calls.dense
    assert [call["cu_seqlens_q"] for call in calls.varlen] == [[0, 3, 7, 9]] * 2


def test_packed_sequences_from_cu_seqlens_kwargs(calls):
    model = tiny_llama()
    input_ids, position_ids = packed_inputs(PACKED_LENGTHS)
    cu_seqlens = torch.tensor([0, 3, 7, 9])  # int64, as a collator may build it
    packed = {"cu_seq_lens_q": cu_seqlens, "cu_seq_lens_k": cu_seqlens, "max_length_q": 4, "max_length_k": 4}
    got = logits(model, NAME, input_ids, position_ids=position_ids, **packed)
    torch.testing.assert_close(got, per_sequence(model, "sdpa", input_ids, PACKED_LENGTHS), rtol=1e-5, atol=1e-5)
    assert [call["cu_seqlens_k"] for call in calls.varlen] == [[0, 3, 7, 9]] * 2


def test_one_sequence_of_positions_is_not_packed(calls):
    model = tiny_llama()
    input_ids = torch.randint(0, 128, (1, 6))
    got = logits(model, NAME, input_ids, position_ids=torch.arange(3, 9)[None])
    torch.testing.assert_close(got, logits(model, "sdpa", input_ids, position_ids=torch.arange(3, 9)[None]))
    assert len(calls.dense) == 2 and not calls.varlen


def test_sliding_window_matches_sdpa(calls):
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        sliding_window=3,
    )
    model = transformers.MistralForCausalLM(config).eval()
    input_ids = torch.randint(0, 128, (2, 9))
    attention_mask = torch.ones(2, 9, dtype=torch.long)
    attention_mask[1, :2] = 0
    real = attention_mask.bool()
    for mask in (None, attention_mask):
        got = logits(model, NAME, input_ids, attention_mask=mask)
        expected = logits(model, "sdpa", input_ids, attention_mask=mask)
        torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-5)
    assert {call["window_size"] for call in calls.dense + calls.varlen} == {(2, 2)}  # causal cuts it to (2, 0)


class Attention(torch.nn.Module):
    """The attributes of a transformers attention module that the attention function reads."""

    def __init__(self, is_causal=True, dtype=torch.float32):
        super().__init__()
        self.is_causal = is_causal
        self.proj = torch.nn.Linear(8, 8, dtype=dtype)


def qkv(batch=2, seqlen_q=5, seqlen_k=5, dtype=torch.float32):
    """query (batch, 4 heads, seqlen_q, 8), key and value with 2 heads: transformers' layout."""
    shapes = [(batch, 4, seqlen_q, 8), (batch, 2, seqlen_k, 8), (batch, 2, seqlen_k, 8)]
    return [torch.randn(shape, dtype=dtype) for shape in shapes]


def test_argument_mapping(calls):
    q, k, v = qkv()
    out, weights = attention_forward(Attention(), q, k, v, None, scaling=0.3, sliding_window=4, softcap=20.0)
    assert out.shape == (2, 5, 4, 8) and weights is None
    expected = attention_ref(*(x.transpose(1, 2) for x in (q, k, v)), 0.3, True, window_size=(3, 3), softcap=20.0)
    torch.testing.assert_close(out, expected.float())
    assert calls.dense[-1] == {
        "softmax_scale": 0.3,
        "causal": True,
        "window_size": (3, 3),
        "softcap": 20.0,
        "deterministic": False,
        "dtype": torch.float32,
    }
    attention_forward(Attention(is_causal=True), q, k, v, None, is_causal=False)
    assert calls.dense[-1]["causal"] is False  # the caller's is_causal wins over the module's
    attention_forward(Attention(is_causal=False), q, k, v, None)
    assert calls.dense[-1]["causal"] is False
    attention_forward(Attention(), *qkv(seqlen_q=1), None)
    assert calls.dense[-1]["causal"] is False  # one query row sees every key either way
    attention_forward(Attention(), q, k, v, None)
    assert calls.dense[-1]["softmax_scale"] is None and calls.dense[-1]["softcap"] == 0.0


def test_deterministic_from_the_caller_or_the_environment(calls, monkeypatch):
    attention_forward(Attention(), *qkv(), None, deterministic=True)
    assert calls.dense[-1]["deterministic"] is True
    monkeypatch.setenv("FLASH_ATTENTION_DETERMINISTIC", "1")  # what transformers' enable_full_determinism() sets
    attention_forward(Attention(), *qkv(), None)
    assert calls.dense[-1]["deterministic"] is True
    attention_forward(Attention(), *qkv(), None, deterministic=False)
    assert calls.dense[-1]["deterministic"] is False


def test_float32_inputs_cast_like_transformers_flash_path(calls):
    attention_forward(Attention(dtype=torch.bfloat16), *qkv(), None)
    assert calls.dense[-1]["dtype"] == torch.bfloat16  # the module's weights' dtype
    attention_forward(Attention(), *qkv(), None)
    assert calls.dense[-1]["dtype"] == torch.float32  # a float32 model stays float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        attention_forward(Attention(), *qkv(), None)
    assert calls.dense[-1]["dtype"] == torch.bfloat16


def test_queries_at_the_end_of_a_padded_cache(calls):
    """Generation with a cache: 2 new queries, keys longer than the mask (static cache slots), left padding."""
    q, k, v = qkv(batch=2, seqlen_q=2, seqlen_k=8)
    attention_mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    out, _ = attention_forward(Attention(), q, k, v, attention_mask)
    assert calls.varlen[-1]["cu_seqlens_q"] == [0, 2, 4] and calls.varlen[-1]["cu_seqlens_k"] == [0, 4, 10]
    for b, first in enumerate((2, 0)):
        rows = [x.transpose(1, 2)[b : b + 1] for x in (q, k[:, :, first:6], v[:, :, first:6])]
        torch.testing.assert_close(out[b : b + 1], attention_ref(*rows, causal=True).float())


def test_refusals():
    q, k, v = qkv()
    training = Attention().train()
    with pytest.raises(ValueError, match=r"dropout must be 0 in training, got dropout=0\.1"):
        attention_forward(training, q, k, v, None, dropout=0.1)
    with pytest.raises(ValueError, match=r"2-D padding attention_mask .* got shape \(2, 1, 5, 5\)"):
        attention_forward(Attention(), q, k, v, torch.zeros(2, 1, 5, 5))


def test_attention_sinks_become_learnable_sinks(calls):
    """gpt-oss's s_aux, one logit per query head: the dense and the padded paths pass it as learnable_sink."""
    q, k, v = qkv()
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    out, _ = attention_forward(Attention(), q, k, v, None, s_aux=sinks)
    assert calls.dense[-1]["learnable_sink"] is sinks
    rows = [x.transpose(1, 2) for x in (q, k, v)]
    torch.testing.assert_close(out, attention_ref(*rows, causal=True, learnable_sink=sinks).float())
    attention_mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    attention_forward(Attention(), q, k, v, attention_mask, s_aux=sinks)
    assert calls.varlen[-1]["learnable_sink"] is sinks


def test_dropout_is_ignored_outside_training(calls):
    attention_forward(Attention().eval(), *qkv(), None, dropout=0.1)
    assert len(calls.dense) == 1
