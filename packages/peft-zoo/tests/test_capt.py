"""CaPT: one capsule token, its value, the deep variant's per-layer capsule, padding, generate."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import batch, left_pad, tiny_model

import peft_zoo as pz

# float32 forward passes of the same math in a different order: agreement to 1e-5 (logits ~1)
ATOL = 1e-5


def test_parameter_count_shallow_and_deep(causal_lm):
    h = causal_lm.get_input_embeddings().embedding_dim
    layers = causal_lm.config.num_hidden_layers
    shallow = pz.get_peft_model(copy.deepcopy(causal_lm), pz.CaPTConfig())
    deep = pz.get_peft_model(causal_lm, pz.CaPTConfig(deep=True))
    assert shallow.get_nb_trainable_parameters()[0] == h
    assert deep.get_nb_trainable_parameters()[0] == layers * h


def test_exactly_one_token_inserted_with_manual_value(causal_lm):
    base = copy.deepcopy(causal_lm)
    model = pz.get_peft_model(causal_lm, pz.CaPTConfig(init_std=0.5)).eval()
    seen = []
    hook = model.base_model.get_input_embeddings().register_forward_hook(
        lambda module, args, out: seen.append(out.shape)
    )
    ids = batch(length=6)
    lengths = []
    handle = model.base_model.register_forward_pre_hook(
        lambda module, args, kwargs: lengths.append(kwargs["inputs_embeds"].shape[1]),
        with_kwargs=True,
    )
    with torch.no_grad():
        got = model(input_ids=ids).logits
    hook.remove()
    handle.remove()
    assert lengths == [7]
    assert got.shape[:2] == (3, 6)
    assert len(seen) == 1
    task = model.adapter.task_vectors[0]
    with torch.no_grad():
        embeds = base.get_input_embeddings()(ids)
        capsule = (task + embeds.mean(1)).unsqueeze(1)  # S_1 = p_1 + Mean(E)
        want = base(inputs_embeds=torch.cat([capsule, embeds], 1)).logits[:, 1:]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_padded_batches_match_unpadded_rows(causal_lm):
    model = pz.get_peft_model(causal_lm, pz.CaPTConfig(deep=True, init_std=0.5)).eval()
    rows = [batch(1, 1, 6)[0], batch(2, 1, 3)[0]]
    left_ids, left_mask = left_pad(rows)
    right_ids = torch.zeros_like(left_ids)
    right_mask = torch.zeros_like(left_mask)
    for i, row in enumerate(rows):
        right_ids[i, : len(row)] = row
        right_mask[i, : len(row)] = 1
    labels = right_ids.masked_fill(right_mask == 0, -100)
    with torch.no_grad():
        left = model(input_ids=left_ids, attention_mask=left_mask).logits
        right = model(input_ids=right_ids, attention_mask=right_mask, labels=labels)
        for i, row in enumerate(rows):
            alone = model(input_ids=row[None]).logits[0]
            torch.testing.assert_close(left[i, -len(row) :], alone, atol=ATOL, rtol=0)
            torch.testing.assert_close(right.logits[i, : len(row)], alone, atol=ATOL, rtol=0)
        # the loss covers only real next tokens: the mean of the per-row sums
        total, count = 0.0, 0
        for row in rows:
            logits = model(input_ids=row[None]).logits[0]
            total += torch.nn.functional.cross_entropy(logits[:-1], row[1:], reduction="sum")
            count += len(row) - 1
    torch.testing.assert_close(right.loss, total / count, atol=ATOL, rtol=0)


def test_deep_capsule_state_per_layer():
    """Layer i > 1 sees S_i = p_i + Mean(S_{i-1} ⊕ H_{i-1}) at the capsule position."""
    model = pz.get_peft_model(tiny_model("llama"), pz.CaPTConfig(deep=True, init_std=0.5)).eval()
    ids, mask = left_pad([batch(1, 1, 5)[0], batch(2, 1, 3)[0]])
    layers = model.base_model.model.layers
    inputs = {}

    def capture(module, args, kwargs):  # registered after the capsule hook: sees S_2
        inputs["layer1"] = args[0]

    handle = layers[1].register_forward_pre_hook(capture, with_kwargs=True)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    handle.remove()
    previous = out.hidden_states[1]  # output of layer 0 with the capsule at row start
    p = model.adapter.task_vectors[1]
    for row, start in enumerate((0, 2)):  # capsule index: after the row's left pads
        real = torch.cat([mask[row, :start], torch.ones(1, dtype=torch.long), mask[row, start:]])
        expected = p + previous[row][real.bool()].mean(0)
        torch.testing.assert_close(inputs["layer1"][row, start], expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("deep", [False, True])
def test_generate_with_left_padding_matches_greedy_by_hand(causal_lm, deep):
    base = copy.deepcopy(causal_lm)
    model = pz.get_peft_model(causal_lm, pz.CaPTConfig(deep=deep, init_std=0.5)).eval()
    rows = [batch(3, 1, 6)[0], batch(4, 1, 2)[0]]
    ids, mask = left_pad(rows)
    out = model.generate(
        ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0
    )
    assert out.shape == (2, ids.shape[1] + 4)
    assert torch.equal(out[:, : ids.shape[1]], ids)
    for i, row in enumerate(rows):
        tokens = row.tolist()
        with torch.no_grad():
            capsule = None
            for _ in range(4):  # no cache: full recomputation of the capsule model each step
                if deep:
                    logits = model(input_ids=torch.tensor([tokens])).logits[0, -1]
                else:
                    embeds = base.get_input_embeddings()(torch.tensor(tokens))
                    if capsule is None:  # the capsule is the prompt's: fixed while decoding
                        capsule = model.adapter.task_vectors[0] + embeds.mean(0)
                    full = torch.cat([capsule[None], embeds])[None]
                    logits = base(inputs_embeds=full).logits[0, -1]
                tokens.append(int(logits.argmax()))
        if not deep:
            assert out[i, ids.shape[1] :].tolist() == tokens[len(row) :]
        else:  # deep: the capsule re-averages over the tokens seen so far without a cache;
            # with a cache it is fixed at the prompt's value, so only the first token must agree
            assert out[i, ids.shape[1]].item() == tokens[len(row)]


def test_bert_classification_with_capsule():
    model = pz.get_peft_model(tiny_model("bert"), pz.CaPTConfig(deep=True))
    ids = batch()
    out = model(input_ids=ids, labels=torch.tensor([0, 1, 2]))
    out.loss.backward()
    assert model.adapter.task_vectors.grad.abs().sum() > 0


def test_save_load_round_trip(tmp_path):
    model = pz.get_peft_model(tiny_model("gpt2"), pz.CaPTConfig(deep=True, init_std=0.3)).eval()
    ids = batch()
    before = model(input_ids=ids).logits
    model.save_pretrained(tmp_path)
    loaded = pz.from_pretrained(tiny_model("gpt2"), tmp_path).eval()
    assert torch.equal(loaded(input_ids=ids).logits, before)


def test_bad_config():
    with pytest.raises(TypeError, match="deep"):
        pz.CaPTConfig(deep="yes")
    with pytest.raises(ValueError, match="init_std"):
        pz.CaPTConfig(init_std=-1.0)


def test_context_mask_keeps_targets_out_of_the_capsule():
    """With the context limited to the first 3 tokens, changing later tokens leaves the logits
    at the first 3 positions unchanged (no look-ahead through the capsule), deep variant too."""
    model = pz.get_peft_model(tiny_model("llama"), pz.CaPTConfig(deep=True, init_std=0.5)).eval()
    ids = batch(length=6)
    other = ids.clone()
    other[:, 3:] = (other[:, 3:] + 1) % 96
    context = torch.zeros_like(ids)
    context[:, :3] = 1
    with torch.no_grad():
        a = model(input_ids=ids, context_mask=context).logits[:, :3]
        b = model(input_ids=other, context_mask=context).logits[:, :3]
        c = model(input_ids=other).logits[:, :3]
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    assert (a - c).abs().max() > 1e-3  # without it, later tokens leak into earlier positions


@pytest.mark.parametrize("deep", [False, True])
def test_task_vectors_are_used_only_through_the_adapter_module(deep):
    """Every use of the task vectors goes through ``CaPTPrompt.forward`` (once per layer in the
    deep variant), so module wrappers (per-example clipping) see all of them: with the
    adapter's forward replaced by a detached copy, no gradient reaches the task vectors."""
    model = pz.get_peft_model(tiny_model("llama"), pz.CaPTConfig(deep=deep, init_std=0.5))
    calls = []
    original = model.adapter.forward

    def detached(summary, layer=0):
        calls.append(layer)
        return original(summary, layer).detach()

    model.adapter.forward = detached
    ids = batch()
    out = model(input_ids=ids, labels=ids)
    assert calls == (list(range(2)) if deep else [0])
    assert not out.loss.requires_grad
