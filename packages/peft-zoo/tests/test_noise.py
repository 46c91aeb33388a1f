"""LoPE's noise generators: rates, bounds, masks."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import tiny_model

import peft_zoo as pz


def test_char_noise_rate_zero_is_identity_and_rate_changes_length_as_expected():
    rng = random.Random(0)
    text = "abcdefghij" * 200
    assert pz.char_noise(text, 0.0, rng) == text
    # each hit inserts (+1), deletes (−1) or swaps (±0) with equal chance: E[len change] = 0,
    # and the share of positions changed is clearly above zero at rate 0.2
    lengths = [len(pz.char_noise(text, 0.2, random.Random(s))) for s in range(20)]
    mean = sum(lengths) / len(lengths)
    assert abs(mean - len(text)) < 15  # sd of one draw ≈ sqrt(2000·0.2·2/3) ≈ 16; of the mean ≈ 4
    noisy = pz.char_noise(text, 0.2, random.Random(1))
    assert sorted(set(noisy) - set(text))  # inserted characters appear
    with pytest.raises(ValueError, match="rate"):
        pz.char_noise(text, 1.5, rng)


def test_embedding_noise_bounds_and_token_mask():
    embeds = torch.zeros(4, 50, 8)
    generator = torch.Generator().manual_seed(0)
    noisy = pz.embedding_noise(embeds, alpha=0.05, token_rate=0.5, generator=generator)
    assert noisy.abs().max() <= 0.05
    touched = (noisy != 0).any(-1).float().mean().item()
    assert 0.35 < touched < 0.65  # Bernoulli(0.5) over 200 tokens: sd 0.035
    full = pz.embedding_noise(embeds, alpha=0.05, generator=generator)
    assert 0.024 < full.abs().mean().item() < 0.026  # E|α·U(−1,1)| = α/2, 1600 draws
    with pytest.raises(ValueError, match="alpha"):
        pz.embedding_noise(embeds, alpha=-1.0)


def test_embedding_noise_hook_is_removed_after_the_block():
    model = tiny_model("llama")
    ids = torch.arange(3, 9)[None]
    with torch.no_grad():
        clean = model(input_ids=ids).logits
        with pz.embedding_noise_hook(model, alpha=0.05, generator=torch.Generator().manual_seed(0)):
            noisy = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
    assert not torch.equal(clean, noisy)
    assert torch.equal(clean, after)
