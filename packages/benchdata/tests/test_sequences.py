import numpy as np
import pytest
import torch

from benchdata import token_sequences, zipf_pmf


def test_fresh_tokens_follow_the_zipf_law():
    vocab, exponent = 300, 1.1
    data = token_sequences(100, 500, vocab, zipf_exponent=exponent, seed=0)
    assert not data.copied.any()
    frequency = np.bincount(data.tokens.numpy().ravel(), minlength=vocab) / data.tokens.numel()
    # 50,000 draws: the expected total-variation distance to the pmf is about 0.02 here
    assert 0.5 * np.abs(frequency - zipf_pmf(vocab, exponent)).sum() < 0.04
    # the rank-frequency slope of the 20 most frequent ids recovers the exponent
    ranks = np.arange(1, 21)
    slope = np.polyfit(np.log(ranks), np.log(frequency[:20]), 1)[0]
    assert slope == pytest.approx(-exponent, abs=0.1)


@pytest.mark.parametrize(("copy_prob", "copy_span"), [(0.05, 1), (0.05, 4), (0.2, 8)])
def test_copies_repeat_earlier_tokens_at_the_expected_rate(copy_prob, copy_span):
    data = token_sequences(200, 400, 1000, copy_prob=copy_prob, copy_span=copy_span, seed=1)
    mask, source = data.copied, data.source
    positions = torch.arange(400).expand(200, -1)
    assert torch.equal(mask, source >= 0)
    assert (source[mask] < positions[mask]).all()
    assert torch.equal(data.tokens.gather(1, source.clamp(min=0))[mask], data.tokens[mask])
    assert not mask[:, 0].any()
    # renewal argument: each copy covers `span` tokens, then (1-p)/p fresh ones on average
    expected = copy_span * copy_prob / (copy_span * copy_prob + 1 - copy_prob)
    assert mask.double().mean().item() == pytest.approx(expected, abs=0.02)


def test_seeded_and_validated():
    first = token_sequences(2, 50, 10, copy_prob=0.3, seed=7)
    again = token_sequences(2, 50, 10, copy_prob=0.3, seed=7)
    assert torch.equal(first.tokens, again.tokens)
    assert not torch.equal(first.tokens, token_sequences(2, 50, 10, copy_prob=0.3, seed=8).tokens)
    uniform = token_sequences(1, 20_000, 4, zipf_exponent=0.0, seed=0).tokens
    assert np.bincount(uniform.numpy().ravel()).min() > 4_700  # 5,000 each expected
    with pytest.raises(ValueError, match="copy_prob"):
        token_sequences(1, 10, 10, copy_prob=1.0)
    with pytest.raises(ValueError, match="vocab_size"):
        token_sequences(1, 10, 1)
    with pytest.raises(ValueError, match="copy_span"):
        token_sequences(1, 10, 10, copy_span=0)
