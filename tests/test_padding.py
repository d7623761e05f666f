"""flashcute.padding against flash_attn's bert_padding conventions, on CPU."""

import pytest
import torch

import flashcute
from flashcute.padding import pad_input, unpad_input


def naive_unpad(hidden_states, attention_mask, unused_mask=None):
    """unpad_input's results built token by token from the definition."""
    batch, seqlen = attention_mask.shape
    unused = torch.zeros_like(attention_mask) if unused_mask is None else unused_mask
    rows, indices, cu_seqlens, seqlens, seqused = [], [], [0], [], []
    for b in range(batch):
        kept = [s for s in range(seqlen) if attention_mask[b, s] or unused[b, s]]
        rows += [hidden_states[b, s] for s in kept]
        indices += [b * seqlen + s for s in kept]
        cu_seqlens.append(cu_seqlens[-1] + len(kept))
        seqlens.append(len(kept))
        seqused.append(sum(bool(attention_mask[b, s]) for s in range(seqlen)))
    packed = torch.stack(rows) if rows else hidden_states.new_zeros((0, *hidden_states.shape[2:]))
    return packed, torch.tensor(indices), torch.tensor(cu_seqlens), max(seqlens), torch.tensor(seqused)


def naive_pad(hidden_states, indices, batch, seqlen):
    out = torch.zeros((batch * seqlen, *hidden_states.shape[1:]), dtype=hidden_states.dtype)
    for row, index in zip(hidden_states, indices.tolist(), strict=True):
        out[index] = row
    return out.view(batch, seqlen, *hidden_states.shape[1:])


def lengths_mask(lengths, seqlen, left=False):
    """(batch, seqlen) bool: the first (or, with left=True, the last) lengths[b] tokens of row b."""
    positions = torch.arange(seqlen)[None, :]
    lengths = torch.tensor(lengths)[:, None]
    return positions >= seqlen - lengths if left else positions < lengths


MASKS = {
    "right padding": lengths_mask([5, 2, 7], 7),
    "left padding": lengths_mask([5, 2, 7], 7, left=True),
    "no padding": lengths_mask([7, 7, 7], 7),
    "an all-padding row": lengths_mask([3, 0, 6], 7),
    "holes, int mask": torch.tensor([[1, 0, 1, 1, 0, 0, 1], [0, 1, 1, 0, 1, 1, 0], [1, 1, 1, 1, 1, 1, 0]]),
}


def assert_same_unpad(got, expected):
    packed, indices, cu_seqlens, max_seqlen, seqused = got
    torch.testing.assert_close(packed, expected[0], rtol=0, atol=0)
    assert indices.dtype == torch.int64 and indices.tolist() == expected[1].tolist()
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == expected[2].tolist()
    assert type(max_seqlen) is int and max_seqlen == expected[3]
    assert seqused.dtype == torch.int32 and seqused.tolist() == expected[4].tolist()


@pytest.mark.parametrize("name", MASKS)
@pytest.mark.parametrize("trailing", [(), (4,), (3, 2)], ids=["no trailing dim", "1 trailing dim", "2 trailing dims"])
def test_unpad_matches_the_naive_loop_and_pads_back(name, trailing):
    mask = MASKS[name]
    hidden = torch.randn(*mask.shape, *trailing)
    got = unpad_input(hidden, mask)
    assert_same_unpad(got, naive_unpad(hidden, mask))
    packed, indices = got[0], got[1]
    padded = pad_input(packed, indices, *mask.shape)
    torch.testing.assert_close(padded, naive_pad(packed, indices, *mask.shape), rtol=0, atol=0)
    expected = torch.where(mask.bool().view(*mask.shape, *[1] * len(trailing)), hidden, 0.0)
    torch.testing.assert_close(padded, expected, rtol=0, atol=0)  # the round trip: real tokens back, zeros elsewhere


def test_known_values():
    """flash_attn's own conventions, written out: cu_seqlens starts at 0, indices index the flattened batch."""
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [0, 1, 1]], dtype=torch.bool)
    hidden = torch.arange(9.0).view(3, 3, 1)
    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, mask)
    assert packed.flatten().tolist() == [0.0, 1.0, 7.0, 8.0]
    assert indices.tolist() == [0, 1, 7, 8]
    assert cu_seqlens.tolist() == [0, 2, 2, 4]
    assert max_seqlen == 2
    assert seqused.tolist() == [2, 0, 2]


def test_unused_tokens_are_packed_but_not_used():
    attention_mask = lengths_mask([3, 1, 4], 6)
    unused_mask = lengths_mask([5, 1, 6], 6) & ~attention_mask  # the slots after the used tokens, row 1 has none
    hidden = torch.randn(3, 6, 2, 4)
    got = unpad_input(hidden, attention_mask, unused_mask)
    assert_same_unpad(got, naive_unpad(hidden, attention_mask, unused_mask))
    assert got[2].tolist() == [0, 5, 6, 12]
    assert got[3] == 6
    assert got[4].tolist() == [3, 1, 4]


def test_all_padding_batch():
    mask = torch.zeros(2, 4, dtype=torch.bool)
    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(torch.randn(2, 4, 3), mask)
    assert packed.shape == (0, 3) and indices.numel() == 0
    assert cu_seqlens.tolist() == [0, 0, 0] and max_seqlen == 0 and seqused.tolist() == [0, 0]
    assert torch.equal(pad_input(packed, indices, 2, 4), torch.zeros(2, 4, 3))
    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(torch.randn(0, 4, 3), mask[:0])
    assert packed.shape == (0, 3) and cu_seqlens.tolist() == [0] and max_seqlen == 0 and seqused.numel() == 0


def test_gradients_flow_through_unpad_and_pad():
    mask = MASKS["holes, int mask"]
    hidden = torch.randn(*mask.shape, 2, 3, dtype=torch.float64, requires_grad=True)
    packed, indices, *_ = unpad_input(hidden, mask)
    weights = torch.randn(packed.shape, dtype=torch.float64)
    (grad,) = torch.autograd.grad((packed * weights).sum(), hidden)
    expected = torch.zeros_like(hidden).flatten(0, 1)
    expected[indices] = weights
    torch.testing.assert_close(grad, expected.view_as(hidden), rtol=0, atol=0)  # padding gets no gradient

    rows = torch.randn(packed.shape, dtype=torch.float64, requires_grad=True)
    outer = torch.randn(*mask.shape, 2, 3, dtype=torch.float64)
    (grad_rows,) = torch.autograd.grad((pad_input(rows, indices, *mask.shape) * outer).sum(), rows)
    torch.testing.assert_close(grad_rows, outer.flatten(0, 1)[indices], rtol=0, atol=0)

    torch.autograd.gradcheck(lambda x: pad_input(unpad_input(x, mask)[0], indices, *mask.shape), (hidden,))


def test_mask_shape_is_checked():
    with pytest.raises(ValueError, match=r"attention_mask must be \(batch, seqlen\) = \(2, 5\)"):
        unpad_input(torch.randn(2, 5, 3), torch.ones(2, 4))


def test_exported_from_the_package():
    assert flashcute.unpad_input is unpad_input and flashcute.pad_input is pad_input
    assert {"unpad_input", "pad_input"} <= set(flashcute.__all__)
