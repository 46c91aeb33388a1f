"""Hugging Face GPT-2 called the usual way, without ``position_ids``.

GPT-2 builds default positions of shape (1, T), broadcast over the batch; ``make_private`` makes
the model pass them as (B, T), the same positions for every example, so the private position
embedding sees the examples first. Oracles: the brute-force per-example clipping of
``oracle.py`` run on the original model one example at a time (where the default positions are
exactly one example's), at its float32 tolerance (1e-5 relative to the largest entry); and the
original model's own outputs, which the private one must reproduce bit for bit (``torch.equal``:
the same positions index the same embedding rows, only repeated per example).
"""

from __future__ import annotations

import copy
import gc
import inspect
import weakref

import pytest
import torch
from oracle import assert_matches, brute_force
from torch import nn

import flashdp

VOCAB = 32


def tiny_config(**overrides):
    """The tiny untied GPT-2 of the clipping tests."""
    from transformers import GPT2Config

    settings = {
        "vocab_size": VOCAB,
        "n_positions": 16,
        "n_embd": 16,
        "n_layer": 1,
        "n_head": 2,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "attn_implementation": "eager",  # vmap of the oracle has no batching rule for CPU SDPA
    }
    return GPT2Config(**(settings | overrides))


def tiny_gpt2():
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(tiny_config()).eval()  # eval: no dropout, deterministic


def make(model, clipping="per_layer"):
    return flashdp.make_private(
        model, max_grad_norm=1.0, noise_multiplier=0.0, clipping=clipping, backend="reference"
    )


def sample_tokens(batch=3, length=8, seed=1):
    """Token ids in 1..VOCAB-1 (0 is the pad token of the classifier test)."""
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def example_token_loss(logits, ids):
    """One example's loss as GPT-2's ``labels=`` computes it: the mean next-token cross-entropy.
    For equal lengths the batch loss is the mean of these over the batch (reduction "mean")."""
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def record_position_batches(private):
    """The first dimension of every index tensor the private ``wpe`` receives from now on."""
    seen = []
    private.transformer.wpe.register_forward_pre_hook(lambda _, args: seen.append(len(args[0])))
    return seen


class Logits(nn.Module):
    """A GPT-2 head model called with default positions, returning its logits (the oracle runs
    the original one example at a time)."""

    def __init__(self, gpt, keyword, masked=False):
        super().__init__()
        self.gpt, self.keyword, self.masked = gpt, keyword, masked

    def forward(self, x):
        mask = torch.ones(x.shape[:2], dtype=torch.long) if self.masked else None
        return self.gpt(**{self.keyword: x}, attention_mask=mask).logits


@pytest.mark.parametrize("clipping", ["per_layer", "flat"])
def test_default_call_matches_brute_force(clipping):
    """``model(input_ids, labels=...)`` releases Σ_b clip(g_b) / B of the original model."""
    model, tokens = tiny_gpt2(), sample_tokens()
    expected = brute_force(
        Logits(model, "input_ids"), example_token_loss, tokens, tokens, clipping, 1.0
    )
    private = make(copy.deepcopy(model), clipping)
    private(tokens, labels=tokens).loss.backward()
    assert_matches(Logits(private, "input_ids"), expected)


def test_inputs_embeds_with_frozen_wte_matches_brute_force():
    """With the token embedding frozen, the model may be given ``inputs_embeds``."""
    model, tokens = tiny_gpt2(), sample_tokens()
    model.transformer.wte.requires_grad_(False)
    embeds = model.transformer.wte(tokens).detach()
    expected = brute_force(
        Logits(model, "inputs_embeds"), example_token_loss, embeds, tokens, "per_layer", 1.0
    )
    private = make(copy.deepcopy(model))
    private(inputs_embeds=embeds, labels=tokens).loss.backward()
    assert_matches(Logits(private, "inputs_embeds"), expected)


def test_sequence_classifier_matches_brute_force():
    """The GPT2Model inside another head (GPT2ForSequenceClassification) gets the same fix."""
    from transformers import GPT2ForSequenceClassification

    torch.manual_seed(0)
    config = tiny_config(num_labels=3, pad_token_id=0)  # no token of the batch is a pad (0)
    model = GPT2ForSequenceClassification(config).eval()
    tokens, labels = sample_tokens(), torch.tensor([0, 2, 1])
    # with a mask, GPT-2 skips its padding check, which vmap cannot run (data-dependent)
    oracle_model = Logits(model, "input_ids", masked=True)
    expected = brute_force(
        oracle_model, nn.functional.cross_entropy, tokens, labels, "per_layer", 1.0
    )
    private = make(copy.deepcopy(model))
    private(tokens, attention_mask=torch.ones_like(tokens), labels=labels).loss.backward()
    assert_matches(Logits(private, "input_ids"), expected)


def test_logits_equal_the_original():
    """Default positions (ids positional or keyword), explicit (B, T) positions and
    inputs_embeds give the original model's logits exactly."""
    model, tokens = tiny_gpt2(), sample_tokens()
    private = make(copy.deepcopy(model))
    batches = record_position_batches(private)
    explicit = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
    embeds = model.transformer.wte(tokens).detach()
    calls = [
        ((tokens,), {}),
        ((), {"input_ids": tokens}),
        ((tokens,), {"position_ids": explicit}),
        ((), {"inputs_embeds": embeds}),
    ]
    for args, kwargs in calls:
        assert torch.equal(private(*args, **kwargs).logits, model(*args, **kwargs).logits)
    assert batches == [len(tokens)] * len(calls)


def test_key_value_cache_gives_the_same_tokens():
    """Greedy decoding with a cache (positions offset by the cached length) matches the
    original step by step, through the LM head and through GPT2Model with the cache given
    positionally; ``generate`` gives the same tokens."""
    model, prompt = tiny_gpt2(), sample_tokens(length=5)
    private = make(copy.deepcopy(model))
    batches = record_position_batches(private)
    # transformers 5 renamed the argument past_key_values (and the output field) to cache
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        ids, caches = {"original": prompt, "private": prompt}, {}
        for _ in range(4):
            logits = {}
            for key, gpt in (("original", model), ("private", private)):
                extra = {} if key not in caches else {name: caches[key]}
                out = gpt(ids[key][:, -1:] if extra else ids[key], use_cache=True, **extra)
                logits[key], caches[key] = out.logits, out[name]
                ids[key] = torch.cat([ids[key], out.logits[:, -1].argmax(-1, keepdim=True)], 1)
            assert torch.equal(logits["private"], logits["original"])
        assert torch.equal(ids["private"], ids["original"])
        # GPT2Model's second positional argument is the cache in every supported version
        first = [gpt.transformer(prompt[:, :3], use_cache=True) for gpt in (model, private)]
        hidden = [
            gpt.transformer(prompt[:, 3:], out[name]).last_hidden_state
            for gpt, out in zip((model, private), first, strict=True)
        ]
        assert torch.equal(hidden[1], hidden[0])
        assert batches == [len(prompt)] * 6
        generated = private.generate(prompt, max_new_tokens=4, do_sample=False)
        assert torch.equal(generated, model.generate(prompt, max_new_tokens=4, do_sample=False))


def test_explicit_broadcast_positions_are_still_refused():
    """A (1, T) ``position_ids`` given explicitly is one input shared by the batch: refused."""
    private, tokens = make(tiny_gpt2()), sample_tokens()
    shared = torch.arange(tokens.shape[1])[None]
    with pytest.raises(ValueError, match="saw a batch of 1 examples"):
        private(tokens, position_ids=shared, labels=tokens).loss.backward()
    private.zero_grad()
    private(tokens, labels=tokens).loss.backward()  # the default call after the refusal works


def test_frozen_position_embedding_is_left_alone():
    """No hook where ``wpe`` is not private: its (1, T) output carries no parameter gradient."""
    model, tokens = tiny_gpt2(), sample_tokens()
    model.transformer.wpe.requires_grad_(False)
    private = make(model)
    assert not private.transformer._forward_pre_hooks
    private(tokens, labels=tokens).loss.backward()
    assert private.transformer.wpe.weight.grad is None


def test_hook_keeps_no_reference_and_state_dict():
    """The hook holds no reference to the model (it is freed once unreferenced) and leaves the
    state dict unchanged."""
    model = tiny_gpt2()
    before = model.state_dict().keys()
    private = make(model)
    assert private.state_dict().keys() == before
    freed = weakref.ref(private)
    del model, private
    gc.collect()
    assert freed() is None
