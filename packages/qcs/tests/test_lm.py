"""Response losses: the cached-prefix path against the model's own logits, token weighting
against a hand computation, LoRA's identity at init, fine-tuning."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_llama, tiny_task

from qcs import LoraSettings, ResponseScorer, TrainConfig, add_lora, finetune
from qcs.train import lora_state


def direct_token_nll(model, data, i):
    """The oracle: the whole sequence through the model, cross-entropy by hand."""
    ids = torch.cat([data.prompt_ids[i], data.response_ids[i]])[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    start = len(data.prompt_ids[i])
    return F.cross_entropy(logits[start - 1 : -1], ids[0, start:], reduction="none")


@pytest.fixture
def setup():
    tokenizer, pool, _ = tiny_task()
    model = add_lora(tiny_llama(len(tokenizer), layers=3), LoraSettings(layers=1), seed=0)
    with torch.no_grad():  # non-zero adapters, so the adapted layer changes the output
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model, pool


def test_cached_prefix_equals_the_whole_model(setup):
    model, pool = setup
    cached = ResponseScorer(model, pool, batch_size=3)
    plain = ResponseScorer(model, pool, cache_prefix=False)
    assert cached.start == 2
    assert plain.start == 0
    nll_cached, _, rows = cached.token_losses(range(len(pool)))
    nll_plain, _, _ = plain.token_losses(range(len(pool)))
    # float32 through different batch paddings: rounding only
    torch.testing.assert_close(nll_cached, nll_plain, rtol=1e-5, atol=1e-5)
    for i in range(len(pool)):
        torch.testing.assert_close(nll_cached[rows == i].double(), direct_token_nll(model, pool, i),
                                   rtol=1e-5, atol=1e-5)  # fmt: skip


def test_token_weighted_loss_by_hand(setup):
    model, pool = setup
    scorer = ResponseScorer(model, pool)
    generator = torch.Generator().manual_seed(0)
    weights = [torch.rand(len(r), generator=generator) for r in pool.response_ids]
    indices = [4, 1, 6]
    got = scorer.weighted_loss(indices, weights)
    num = sum(float((weights[i].double() * direct_token_nll(model, pool, i)).sum())
              for i in indices)  # fmt: skip
    den = sum(float(weights[i].sum()) for i in indices)
    assert abs(got.item() - num / den) < 1e-5
    means = scorer.per_example_loss()
    for i in range(len(pool)):
        assert abs(float(means[i]) - float(direct_token_nll(model, pool, i).mean())) < 1e-5


def test_lora_starts_as_the_identity_and_only_adapters_train():
    tokenizer, pool, _ = tiny_task()
    base = tiny_llama(len(tokenizer), layers=3)
    expected = [direct_token_nll(base, pool, i) for i in range(3)]
    model = add_lora(base, LoraSettings(layers=2), seed=0)
    for i in range(3):
        torch.testing.assert_close(direct_token_nll(model, pool, i), expected[i])
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names
    assert all("lora_" in n for n in names)
    assert all(".layers.0." not in n for n in names)  # only the top two layers
    with pytest.raises(ValueError, match="top 5 layers"):
        add_lora(tiny_llama(len(tokenizer), layers=3), LoraSettings(layers=5))


def test_finetune_lowers_the_loss_and_is_seeded(setup):
    model, pool = setup
    scorer = ResponseScorer(model, pool)
    start = lora_state(model)
    before = scorer.mean_loss([0, 1])
    config = TrainConfig(steps=15, batch_size=2, lr=1e-2)
    losses = finetune(scorer, [0, 1], config, seed=3)
    assert scorer.mean_loss([0, 1]) < before - 0.1
    trained = lora_state(model)
    for name, value in start.items():  # back to the start, same seed: the same run
        dict(model.named_parameters())[name].data.copy_(value)
    assert finetune(scorer, [0, 1], config, seed=3) == losses
    for name, value in trained.items():
        assert torch.equal(dict(model.named_parameters())[name], value)
    with pytest.raises(ValueError, match="empty"):
        finetune(scorer, [], config)
