"""Distillation of a tiny hybrid against its tiny Llama source: what the hooks capture, that both
stages lower their losses, and the held-out loss against a plain cross-entropy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from jet_nemotron.distill import (
    DistillConfig,
    attention_io,
    distill,
    heldout_loss,
    jet_blocks,
)
from jet_nemotron.models.convert import from_pretrained_llama

VOCAB = 64


@pytest.fixture(autouse=True)
def reference_ops(monkeypatch):
    monkeypatch.setenv("KERNELS_COMMON_BACKEND", "reference")


def teacher() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def rows(n: int = 16, length: int = 24) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, length), generator=torch.Generator().manual_seed(3))


def test_hooks_capture_the_attention_input_and_output():
    model = teacher()
    ids = rows(2)
    pairs = attention_io(model, [0, 1], ids)
    assert sorted(pairs) == [0, 1]
    x0, _ = pairs[0]
    expected = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))
    torch.testing.assert_close(x0, expected, rtol=0, atol=0)
    # a decoder layer's output is its input plus attention output plus the MLP of the sum
    layer = model.model.layers[1]
    x1, y1 = pairs[1]
    hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
    residual = hidden[1] + y1
    torch.testing.assert_close(
        hidden[2], residual + layer.mlp(layer.post_attention_layernorm(residual)),
        rtol=1e-5, atol=1e-5,
    )  # fmt: skip
    torch.testing.assert_close(x1, layer.input_layernorm(hidden[1]), rtol=0, atol=0)


@torch.no_grad()
def _heldout_kl(student, teacher, data: torch.Tensor) -> float:
    """KL(teacher ‖ student) per token on rows the distillation never saw."""
    p = F.log_softmax(teacher(input_ids=data).logits, -1)
    q = F.log_softmax(student(input_ids=data).logits, -1)
    return (p.exp() * (p - q)).sum(-1).mean().item()


def test_both_stages_lower_their_losses_and_only_jetblocks_move():
    source = teacher()
    student = from_pretrained_llama(source, ["attn", "jet", "jet"])
    blocks = {id(p) for block in jet_blocks(student).values() for p in block.parameters()}
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    heldout = torch.randint(0, VOCAB, (4, 24), generator=torch.Generator().manual_seed(9))
    kl_before = _heldout_kl(student, source, heldout)
    config = DistillConfig(layerwise_steps=40, end_to_end_steps=40, batch_size=4, lr=3e-3)
    history = distill(student, source, rows(), config, progress=False)
    assert len(history.layerwise) == 40
    assert len(history.end_to_end) == 40
    assert sum(history.layerwise[-5:]) < 0.8 * sum(history.layerwise[:5])
    assert sum(history.end_to_end[-5:]) < sum(history.end_to_end[:5])
    assert _heldout_kl(student, source, heldout) < kl_before
    for name, parameter in student.named_parameters():
        moved = not torch.equal(parameter, before[name])
        assert moved == (id(parameter) in blocks), name
    # what distill switched off meanwhile is trainable again (the MLPs stay frozen)
    assert all(p.requires_grad == (".mlp." not in n) for n, p in student.named_parameters())


def test_heldout_loss_is_the_mean_next_token_cross_entropy():
    model = teacher()
    data = rows(5, 10)
    logits = model(input_ids=data).logits
    expected = F.cross_entropy(logits[:, :-1].flatten(0, 1), data[:, 1:].flatten()).item()
    assert heldout_loss(model, data, batch_size=2) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"layerwise_steps": -1}, "layerwise_steps"),
        ({"batch_size": 0}, "batch_size"),
        ({"lr": 0.0}, "lr must be positive"),
        ({"hidden_weight": -1.0}, "hidden_weight"),
    ],
)
def test_bad_settings_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        DistillConfig(**fields)


def test_bad_rows_and_students_are_refused():
    source = teacher()
    with pytest.raises(ValueError, match="int64"):
        distill(from_pretrained_llama(source, ["jet"] * 3), source, rows().float())
    with pytest.raises(ValueError, match="no JetBlock"):
        distill(from_pretrained_llama(source, ["attn"] * 3), source, rows())
    other = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB + 1, hidden_size=32,
                             intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                             num_key_value_heads=1))  # fmt: skip
    with pytest.raises(ValueError, match=r"not a hybrid of this teacher.*vocab_size"):
        distill(from_pretrained_llama(source, ["jet"] * 3), other, rows())


def test_attention_importance_is_the_loss_without_that_attention():
    """Oracle: a copy whose layer-i o_proj is zero (so its attention adds nothing)."""
    import copy

    from jet_nemotron.reproduce.importance import attention_importance

    model, data = teacher(), rows(3, 12)
    importance = attention_importance(model, data)
    base = heldout_loss(model, data)
    for index in range(3):
        ablated = copy.deepcopy(model)
        torch.nn.init.zeros_(ablated.model.layers[index].self_attn.o_proj.weight)
        expected = heldout_loss(ablated, data) - base
        assert importance[index] == pytest.approx(expected, rel=1e-5, abs=1e-6)
