"""PT-MoE: parameter count, the prompt against a hand computation, routing, SVD init, save/load."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import batch, left_pad, tiny_model

import peft_zoo as pz
from peft_zoo.ptmoe import PTMoEPrompt

# float32 forward passes of the same math in a different order: agreement to 1e-5 (logits ~1)
ATOL = 1e-5
CFG = pz.PTMoEConfig(num_virtual_tokens=6, num_experts=3, rank=4)


def test_trainable_parameters_equal_formula(causal_lm):
    h = causal_lm.get_input_embeddings().embedding_dim
    model = pz.get_peft_model(causal_lm, CFG)
    n, t, r = CFG.num_experts, CFG.num_virtual_tokens, CFG.rank
    trainable, total = model.get_nb_trainable_parameters()
    assert trainable == n * t * r + r * h + n * h + n
    assert total == trainable + sum(p.numel() for p in causal_lm.base_model.parameters()) + (
        0
        if causal_lm.lm_head.weight is causal_lm.get_input_embeddings().weight
        else causal_lm.lm_head.weight.numel()
    )


def manual_prompt(adapter, embeds: torch.Tensor) -> torch.Tensor:
    """P for one unpadded row (eval mode: no router noise), written out term by term."""
    logits = embeds.mean(0) @ adapter.router.weight.T + adapter.router.bias
    probs = torch.softmax(logits, -1)
    k = int(probs.argmax())
    return probs[k] * adapter.A[k] @ adapter.B


def test_logits_equal_base_model_on_manual_prompt(causal_lm):
    base = copy.deepcopy(causal_lm)
    model = pz.get_peft_model(causal_lm, CFG).eval()
    ids = batch()
    with torch.no_grad():
        got = model(input_ids=ids).logits
        for row in range(len(ids)):
            embeds = base.get_input_embeddings()(ids[row])
            prompt = manual_prompt(model.adapter, embeds)
            full = torch.cat([prompt, embeds])[None]
            want = base(inputs_embeds=full).logits[0, CFG.num_virtual_tokens :]
            torch.testing.assert_close(got[row], want, atol=ATOL, rtol=0)


def test_left_padding_matches_unpadded_rows(causal_lm):
    model = pz.get_peft_model(causal_lm, CFG).eval()
    rows = [batch(1, 1, 7)[0], batch(2, 1, 4)[0]]
    ids, mask = left_pad(rows)
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask).logits
        for i, row in enumerate(rows):
            alone = model(input_ids=row[None]).logits[0]
            torch.testing.assert_close(padded[i, -len(row) :], alone, atol=ATOL, rtol=0)


def test_one_expert_selected_and_router_gets_gradients():
    model = pz.get_peft_model(tiny_model("llama"), CFG).train()
    embeds = torch.randn(5, 7, 32)
    weights = model.adapter.weights(embeds.mean(1))
    assert ((weights != 0).sum(-1) == 1).all()
    torch.testing.assert_close(weights.sum(-1), weights.max(-1).values)  # w_k = softmax prob
    ids = batch(size=4)
    model(input_ids=ids, labels=ids).loss.backward()
    assert model.adapter.router.weight.grad.abs().sum() > 0
    chosen = set(model.adapter.last_expert.tolist())
    for expert in range(CFG.num_experts):  # only selected experts' A_i receive gradients
        touched = model.adapter.A.grad[expert].abs().sum() > 0
        assert touched == (expert in chosen)


def test_router_noise_only_in_training():
    torch.manual_seed(0)
    adapter = pz.get_peft_model(
        tiny_model("gpt2"), pz.PTMoEConfig(6, 2, 4, router_noise_std=0.5)
    ).adapter
    mean = torch.randn(64, 32)
    adapter.eval()
    assert torch.equal(adapter.weights(mean), adapter.weights(mean))
    adapter.train()
    assert not torch.equal(adapter.weights(mean), adapter.weights(mean))


class _CharTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [3 + (ord(c) % 90) for c in text]}


def test_svd_init_is_the_best_rank_r_approximation():
    base = tiny_model("llama")
    text = "Answer the arithmetic question with a number."
    model = pz.get_peft_model(
        copy.deepcopy(base), pz.PTMoEConfig(8, 2, 3, init_text=text), tokenizer=_CharTokenizer()
    )
    ids = _CharTokenizer()(text)["input_ids"][:8]
    embeds = base.get_input_embeddings().weight[ids].detach()
    a, b = model.adapter.A.detach(), model.adapter.B.detach()
    torch.testing.assert_close(a[0], a[1])  # every expert starts from the same factor
    singular = torch.linalg.svdvals(embeds)
    error = torch.linalg.matrix_norm(a[0] @ b - embeds)  # Eckart–Young: the tail's norm
    torch.testing.assert_close(error, singular[3:].square().sum().sqrt(), atol=1e-5, rtol=1e-4)
    full = pz.get_peft_model(
        copy.deepcopy(base), pz.PTMoEConfig(8, 1, 8, init_text=text), tokenizer=_CharTokenizer()
    )
    torch.testing.assert_close(full.adapter.A[0] @ full.adapter.B, embeds, atol=1e-5, rtol=0)


def test_save_load_round_trip(tmp_path):
    model = pz.get_peft_model(tiny_model("qwen2"), CFG).eval()
    with torch.no_grad():
        model.adapter.router.weight.normal_()
    ids = batch()
    before = model(input_ids=ids).logits
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    loaded = pz.from_pretrained(tiny_model("qwen2"), tmp_path).eval()
    assert isinstance(loaded, pz.PTMoEModel)
    assert loaded.peft_config == CFG
    assert torch.equal(loaded(input_ids=ids).logits, before)


def test_bert_classification_runs_with_prompt():
    model = pz.get_peft_model(tiny_model("bert"), CFG)
    ids = batch()
    out = model(input_ids=ids, token_type_ids=torch.zeros_like(ids), labels=torch.tensor([0, 1, 2]))
    assert out.logits.shape == (3, 3)
    out.loss.backward()
    assert model.adapter.B.grad is not None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 50, "num_virtual_tokens": 40}, "rank"),
        ({"num_experts": 0}, "num_experts"),
        ({"router_noise_std": -1.0}, "router_noise_std"),
        ({"init_text": "  "}, "init_text"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pz.PTMoEConfig(**kwargs)


def test_prompt_runs_per_example_under_vmap():
    """The router works under torch.func.vmap (per-example gradients, e.g. DP clipping): each
    example's prompt equals its row of the batched prompt."""
    from torch.func import vmap

    torch.manual_seed(0)
    adapter = PTMoEPrompt(CFG, width=16, scale=0.1).eval()
    embeds, mask = torch.randn(5, 7, 16), torch.ones(5, 7, dtype=torch.long)
    mask[2, :3] = 0
    per_example = vmap(lambda e, m: adapter(e[None], m[None])[0])(embeds, mask)
    torch.testing.assert_close(per_example, adapter(embeds, mask), rtol=0, atol=ATOL)
