"""LoPE: parameter counts per stage, zero-init identity, the layer against a hand computation,
poisoning-expert masking and freezing, target errors, save/load."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import batch, tiny_model

import peft_zoo as pz

# float32, same math in a different order: 1e-5 absolute on outputs of size ~1
ATOL = 1e-5
CFG = pz.LoPEConfig(r=4, num_experts=3, lora_alpha=8.0)
# (in, out) of the default targets of each tiny model, per layer
SHAPES = {"llama": [(32, 32), (32, 16)], "qwen2": [(32, 32), (32, 16)], "gpt2": [(32, 96)]}


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
def test_trainable_parameters_per_stage_equal_formula(kind):
    model = pz.get_peft_model(tiny_model(kind), CFG)
    r, n, layers = CFG.r, CFG.num_experts, 2
    stage1 = layers * sum(r * i + o * r for i, o in SHAPES[kind])  # A and B_D
    stage2 = layers * sum(r * i + n * o * r + (n + 1) * i for i, o in SHAPES[kind])
    assert model.get_nb_trainable_parameters()[0] == stage1
    model.set_stage(2)
    assert model.get_nb_trainable_parameters()[0] == stage2
    assert len(model.adapter_state_dict()) == 4 * layers * len(SHAPES[kind])


@pytest.mark.parametrize("training", [True, False])
def test_zero_initialised_experts_give_the_base_model(causal_lm, training):
    base = copy.deepcopy(causal_lm)
    model = pz.get_peft_model(causal_lm, CFG).train(training)
    ids = batch()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, base(input_ids=ids).logits)


def randomize(model) -> None:
    with torch.no_grad():
        for layer in model.lope_layers():
            layer.lope_B.normal_()
            layer.lope_B_D.normal_()


def manual_delta(layer: pz.LoPELinear, x: torch.Tensor, with_poison: bool) -> torch.Tensor:
    """s·(ω_D·B_D + Σ_i ω_i·B_i) A x, term by term."""
    gate = torch.softmax(x @ layer.lope_gate.T, -1)
    h = x @ layer.lope_A.T
    out = sum(gate[..., i, None] * (h @ layer.lope_B[i].T) for i in range(len(layer.lope_B)))
    if with_poison:
        out = out + gate[..., -1, None] * (h @ layer.lope_B_D.T)
    return layer.scaling * out


def test_layer_equals_hand_computation_and_poison_is_masked_at_inference():
    model = pz.get_peft_model(tiny_model("llama"), CFG)
    randomize(model)
    layer = model.lope_layers()[0]
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        model.train()
        torch.testing.assert_close(
            layer(x), layer.base(x) + manual_delta(layer, x, True), atol=ATOL, rtol=0
        )
        model.eval()
        torch.testing.assert_close(
            layer(x), layer.base(x) + manual_delta(layer, x, False), atol=ATOL, rtol=0
        )
        model.set_poison_mask(False)  # forced on in eval
        torch.testing.assert_close(
            layer(x), layer.base(x) + manual_delta(layer, x, True), atol=ATOL, rtol=0
        )
        model.set_poison_mask(None)
        # B_D has no effect at inference: changing it changes nothing
        ids = batch()
        before = model(input_ids=ids).logits
        for layer in model.lope_layers():
            layer.lope_B_D.mul_(5.0)
        torch.testing.assert_close(model(input_ids=ids).logits, before, atol=0, rtol=0)


def test_stage_two_freezes_poisoning_expert_but_keeps_it_in_training_forward():
    model = pz.get_peft_model(tiny_model("gpt2"), CFG)
    randomize(model)
    model.set_stage(2)
    model.train()
    frozen = {n: p.detach().clone() for n, p in model.adapter_state_dict().items() if "B_D" in n}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = batch()
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    state = model.adapter_state_dict()
    for name, value in frozen.items():
        assert torch.equal(state[name], value)
        assert not state[name].requires_grad
    changed = [n for n, v in state.items() if "lope_B" in n and "B_D" not in n]
    assert changed
    assert all(state[n].abs().sum() > 0 for n in changed)
    layer = model.lope_layers()[0]
    x = torch.randn(3, 32)
    with torch.no_grad():  # training forward still uses B_D
        torch.testing.assert_close(layer.delta(x), manual_delta(layer, x, True), atol=ATOL, rtol=0)


def test_stage_one_trains_only_a_and_poison():
    model = pz.get_peft_model(tiny_model("llama"), CFG).train()
    ids = batch()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for _ in range(2):  # step 1 moves B_D off zero (as LoRA's B), step 2 then reaches A
        optimizer.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
    for name, p in model.adapter_state_dict().items():
        has_grad = p.grad is not None and p.grad.abs().sum() > 0
        assert has_grad == any(key in name for key in ("lope_A", "lope_B_D")), name


def test_save_load_round_trip(tmp_path):
    model = pz.get_peft_model(tiny_model("qwen2"), CFG)
    randomize(model)
    model.set_stage(2)
    model.eval()
    ids = batch()
    before = model(input_ids=ids).logits
    model.save_pretrained(tmp_path)
    loaded = pz.from_pretrained(tiny_model("qwen2"), tmp_path).eval()
    assert loaded.stage == 2
    assert torch.equal(loaded(input_ids=ids).logits, before)


def test_bert_targets():
    model = pz.get_peft_model(tiny_model("bert"), CFG)
    assert sorted({n.rsplit(".", 1)[-1] for n in model.targeted}) == ["query", "value"]


def test_unknown_target_names_what_exists():
    with pytest.raises(ValueError, match=r"\['nope'\] not found.*'q_proj'"):
        pz.get_peft_model(tiny_model("llama"), pz.LoPEConfig(target_modules=("q_proj", "nope")))


def test_non_linear_target_is_refused():
    with pytest.raises(ValueError, match=r"Embedding; LoPE supports nn\.Linear"):
        pz.get_peft_model(tiny_model("llama"), pz.LoPEConfig(target_modules=("embed_tokens",)))


def test_unsupported_architecture_names_supported_ones():
    from transformers import T5Config, T5ForConditionalGeneration

    t5 = T5ForConditionalGeneration(
        T5Config(d_model=16, d_ff=32, num_layers=1, num_heads=2, vocab_size=32)
    )
    for config in (CFG, pz.CaPTConfig(), pz.PTMoEConfig(4, 2, 2)):
        with pytest.raises(ValueError, match=r"'t5'.*not supported.*'gpt2', 'llama'"):
            pz.get_peft_model(t5, config)
    with pytest.raises(TypeError, match=r"nn\.Module"):
        pz.get_peft_model("gpt2", CFG)
    with pytest.raises(TypeError, match="LoPEConfig"):
        pz.get_peft_model(tiny_model("gpt2"), {"r": 4})


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"r": 0}, ValueError, "r must"),
        ({"lora_dropout": 1.0}, ValueError, "lora_dropout"),
        ({"target_modules": "q_proj"}, TypeError, "target_modules"),
        ({"target_modules": ()}, ValueError, "target_modules"),
    ],
)
def test_bad_config(kwargs, error, message):
    with pytest.raises(error, match=message):
        pz.LoPEConfig(**kwargs)


def test_bad_stage_and_missing_files(tmp_path):
    model = pz.get_peft_model(tiny_model("gpt2"), CFG)
    with pytest.raises(ValueError, match="stage must be one of"):
        model.set_stage(3)
    with pytest.raises(FileNotFoundError, match=r"adapter_config\.json"):
        pz.from_pretrained(tiny_model("gpt2"), tmp_path)
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="saved for a 'gpt2' model, got 'llama'"):
        pz.from_pretrained(tiny_model("llama"), tmp_path)
