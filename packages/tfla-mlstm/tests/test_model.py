"""xLSTM layer, block and LM: recurrent stepping equals the chunkwise pass; generation; config."""

from __future__ import annotations

import pytest
import torch

from tfla_mlstm import mLSTMLayer, xLSTMConfig, xLSTMLM

# float32 layers on O(1) activations; stepping and chunkwise differ only in summation order
ATOL = RTOL = 1e-5


def model(cell: str, **overrides) -> xLSTMLM:
    torch.manual_seed(0)
    config = {"vocab_size": 40, "d_model": 32, "num_heads": 2, "chunk_size": 16}
    config = {**config, "backend": "reference", **overrides}
    return xLSTMLM(xLSTMConfig(cell=cell, **config)).eval()


@pytest.mark.parametrize("cell", ["mlstm", "mlstmsig"])
def test_prefill_then_steps_equal_one_chunkwise_pass(cell):
    lm = model(cell)
    tokens = torch.randint(0, 40, (2, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = lm(tokens)
        logits, states = lm(tokens[:, :20], return_states=True)
        stepped = [logits]
        for t in range(20, 37):
            step_logits, states = lm.step(tokens[:, t], states)
            stepped.append(step_logits[:, None])
    torch.testing.assert_close(torch.cat(stepped, dim=1), full, atol=ATOL, rtol=RTOL)


def test_greedy_generation_follows_the_full_forward_pass():
    lm = model("mlstm")
    prompt = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(2))
    out = lm.generate(prompt, max_new_tokens=6, temperature=0)
    assert out.shape == (2, 11)
    assert torch.equal(out[:, :5], prompt)
    with torch.no_grad():
        expected = lm(out[:, :-1]).argmax(-1)[:, 4:]
    assert torch.equal(out[:, 5:], expected)


def test_generation_state_does_not_grow_with_the_sequence():
    lm = model("mlstmsig")
    _, short = lm(torch.zeros(1, 3, dtype=torch.long), return_states=True)
    _, long = lm(torch.zeros(1, 300, dtype=torch.long), return_states=True)
    sizes = [[t.numel() for t in state] for state in short]
    assert sizes == [[t.numel() for t in state] for state in long]
    sampled = lm.generate(
        torch.zeros(1, 2, dtype=torch.long), 4, generator=torch.Generator().manual_seed(0)
    )
    assert sampled.shape == (1, 6)


def test_generation_runs_the_prompt_once_then_one_step_per_token(monkeypatch):
    lm = model("mlstm")
    seen = []
    forward, step = lm.forward, lm.step

    def counting_forward(tokens, **kwargs):
        seen.append(("forward", tokens.shape[1]))
        return forward(tokens, **kwargs)

    def counting_step(token, states):
        seen.append(("step", token.numel()))
        return step(token, states)

    monkeypatch.setattr(lm, "forward", counting_forward)
    monkeypatch.setattr(lm, "step", counting_step)
    lm.generate(torch.zeros(1, 7, dtype=torch.long), max_new_tokens=5, temperature=0)
    assert seen == [("forward", 7)] + [("step", 1)] * 4


def test_training_step_reaches_every_parameter():
    lm = model("mlstm").train()
    tokens = torch.randint(0, 40, (2, 24), generator=torch.Generator().manual_seed(3))
    loss = torch.nn.functional.cross_entropy(
        lm(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()
    )
    loss.backward()
    missing = [n for n, p in lm.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"d_model": 30, "num_heads": 4}, r"num_heads \(4\) must divide d_model \(30\)"),
        ({"cell": "slstm"}, r"cell must be one of \('mlstm', 'mlstmsig'\)"),
        ({"chunk_size": 24}, r"power of two >= 16, got 24"),
        ({"gate_soft_cap": 0.0}, r"gate_soft_cap must be positive or None"),
        ({"num_layers": 0}, r"num_layers must be a positive int"),
    ],
)
def test_config_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        xLSTMConfig(**overrides)


def test_chunk_size_none_runs_the_default_chunk_of_each_length(chunk_sizes_seen):
    """``chunk_size=None`` reaches the chunkwise op, which picks ``default_chunk_size(S)``: a
    prompt of 20 tokens runs in one chunk of 32, equal to the model with ``chunk_size=32``."""
    auto, fixed = model("mlstm", chunk_size=None), model("mlstm", chunk_size=32)
    tokens = torch.randint(0, 40, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(auto(tokens), fixed(tokens))
    assert chunk_sizes_seen == [32] * (2 * auto.config.num_layers)
    with pytest.raises(ValueError, match=r"power of two >= 16, got 24"):
        mLSTMLayer(32, 2, 8, 16, chunk_size=24)


def test_bad_tokens():
    lm = model("mlstm")
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 40\)"):
        lm(torch.full((1, 3), 40))
    with pytest.raises(ValueError, match=r"tokens must be int64 of shape \(B, S\)"):
        lm(torch.zeros(3, dtype=torch.long))


def test_untied_head_starts_as_the_tied_model_and_trains_on_its_own():
    tied, untied = model("mlstm"), model("mlstm", tie_embeddings=False)
    tokens = torch.randint(0, 40, (2, 20), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(untied(tokens), tied(tokens), atol=0, rtol=0)
    assert untied.head.weight is not untied.embedding.weight
    assert set(untied.state_dict()) - set(tied.state_dict()) == {"head.weight"}
    untied(tokens).logsumexp(-1).sum().backward()
    assert untied.head.weight.grad is not None
    assert untied.generate(tokens[:, :4], max_new_tokens=3, temperature=0).shape == (2, 7)
    with pytest.raises(TypeError, match="tie_embeddings must be a bool"):
        xLSTMConfig(tie_embeddings="no")
