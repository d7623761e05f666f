"""flashcute as a transformers attention implementation on the GPU: a tiny random Llama in bfloat16 against the
same model under transformers' "sdpa".

Each check takes the float32 model under "sdpa" as the reference and lets flashcute's bfloat16 error be at most
twice that of bfloat16 "sdpa", plus a small tolerance (design.md's error budget, for a whole model)."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import flashcute  # noqa: E402
from flashcute.integrations.transformers import register  # noqa: E402
from tests.test_transformers_integration import logits, packed_inputs, per_sequence, tiny_llama  # noqa: E402

pytestmark = pytest.mark.gpu

NAME = register()
ATOL = 2e-3  # relative L2 error allowed above twice the bfloat16 "sdpa" error


def models() -> tuple[torch.nn.Module, torch.nn.Module]:
    """The float32 reference and its bfloat16 copy, on the GPU; head dim 64, which every kernel family runs."""
    reference = tiny_llama(head_dim=64).to("cuda")
    return reference, copy.deepcopy(reference).to(torch.bfloat16)


def relative_error(got: torch.Tensor, reference: torch.Tensor) -> float:
    return ((got.double() - reference.double()).norm() / reference.double().norm()).item()


def assert_within_budget(got, baseline, reference, what: str, atol: float = ATOL) -> None:
    error, base = relative_error(got, reference), relative_error(baseline, reference)
    assert error <= 2 * base + atol, f"{what}: relative error {error:.3g} > 2 x sdpa's {base:.3g} + {atol}"


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids (3, 96) and their mask: right padding, left padding, none."""
    torch.manual_seed(1)
    input_ids = torch.randint(0, 128, (3, 96), device="cuda")
    attention_mask = torch.ones(3, 96, dtype=torch.long, device="cuda")
    attention_mask[0, 41:] = 0
    attention_mask[1, :30] = 0
    return input_ids, attention_mask


def test_logits_of_a_padded_batch():
    reference, model = models()
    input_ids, attention_mask = padded_batch()
    for mask in (attention_mask, None):  # the varlen path, then the dense one
        real = slice(None) if mask is None else attention_mask.bool()
        expected = logits(reference, "sdpa", input_ids, attention_mask=mask)[real]
        baseline = logits(model, "sdpa", input_ids, attention_mask=mask)[real]
        got = logits(model, NAME, input_ids, attention_mask=mask)[real]
        assert_within_budget(got, baseline, expected, f"logits, mask={'padding' if mask is not None else None}")


def gradients(model, implementation, input_ids, attention_mask) -> dict[str, torch.Tensor]:
    """Each parameter's gradient after one training step's backward (loss on the real tokens only)."""
    model.set_attn_implementation(implementation)
    model.train()
    model.zero_grad()
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    model(input_ids, attention_mask=attention_mask, labels=labels, use_cache=False).loss.backward()
    return {name: parameter.grad.clone() for name, parameter in model.named_parameters()}


def test_gradients_of_a_training_step():
    reference, model = models()
    input_ids, attention_mask = padded_batch()
    expected = gradients(reference, "sdpa", input_ids, attention_mask)
    baseline = gradients(model, "sdpa", input_ids, attention_mask)
    got = gradients(model, NAME, input_ids, attention_mask)
    for name in expected:
        assert not got[name].isnan().any(), f"{name}: NaN gradient"
        assert_within_budget(got[name], baseline[name], expected[name], f"gradient of {name}", atol=1e-2)


def test_packed_sequences_take_the_varlen_path(monkeypatch):
    varlen = flashcute.flash_attn_varlen_func
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[3].tolist())  # cu_seqlens_q
        return varlen(*args, **kwargs)

    monkeypatch.setattr(flashcute, "flash_attn_varlen_func", spy)
    reference, model = models()
    lengths = (37, 80, 11)
    torch.manual_seed(2)
    input_ids, position_ids = packed_inputs(lengths, device="cuda")
    got = logits(model, NAME, input_ids, position_ids=position_ids)
    assert calls == [[0, 37, 117, 128]] * model.config.num_hidden_layers
    expected = per_sequence(reference, "sdpa", input_ids, lengths)
    assert_within_budget(got, per_sequence(model, "sdpa", input_ids, lengths), expected, "logits, packed")
