"""Every method as a client of Hugging Face ``Trainer``, with default ``TrainingArguments``.

Columns kept and label names found from the explicit ``forward`` signatures; the loss falls on
learnable data; the frozen base stays bit-identical; ``evaluate()``'s ``eval_loss`` equals a
cross-entropy computed here from the logits; checkpoints hold the adapter alone, reload to the
same logits, and resuming from one reproduces the uninterrupted run exactly; gradient
accumulation gives the gradient of the whole batch (``num_items_in_batch``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import VOCAB, tiny_model
from safetensors.torch import load_file
from transformers import Trainer, TrainingArguments

import peft_zoo as pz

METHODS = {
    "ptmoe": lambda: pz.PTMoEConfig(num_virtual_tokens=4, num_experts=2, rank=4),
    "lope": lambda: pz.LoPEConfig(r=4, num_experts=2),
    "capt": lambda: pz.CaPTConfig(),
    "capt-deep": lambda: pz.CaPTConfig(deep=True),
}
LENGTH = 12
SUBSET = 8  # the data uses 8 of the 96 tokens: any adapter can learn to prefer them


def wrapped(method: str) -> pz.PeftZooModel:
    model = pz.get_peft_model(tiny_model("llama"), METHODS[method]())
    if method == "lope":
        model.set_stage(2)  # task training: A, experts and router
    return model


def dataset(size: int, seed: int) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 3 + SUBSET, (size, LENGTH), generator=generator)
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


def arguments(tmp_path, **overrides) -> TrainingArguments:
    settings = {
        "use_cpu": True,
        "report_to": [],
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 16,  # one evaluation batch: eval_loss is a token mean
        "learning_rate": 5e-2,
        "max_steps": 8,
        "save_steps": 4,
        "logging_steps": 1,
        "seed": 0,
        "disable_tqdm": True,
    }
    return TrainingArguments(str(tmp_path), **(settings | overrides))


def token_cross_entropy(model: pz.PeftZooModel, examples: list[dict]) -> float:
    ids = torch.stack([example["input_ids"] for example in examples])
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1)).item()


def adapter(model: pz.PeftZooModel) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.adapter_state_dict().items()}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_trains_evaluates_checkpoints_and_resumes(method, tmp_path):
    model = wrapped(method)
    names = model.adapter_names()
    base = {k: v.clone() for k, v in model.full_state_dict().items() if k not in names}
    train, held_out = dataset(32, seed=1), dataset(16, seed=2)
    trainer = Trainer(
        model=model, args=arguments(tmp_path), train_dataset=train, eval_dataset=held_out
    )
    assert trainer.label_names == ["labels"]

    before = trainer.evaluate()["eval_loss"]
    assert before == pytest.approx(token_cross_entropy(model, held_out), rel=1e-5)
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    # float32 throughout; the two only differ in the order of the same reductions
    assert after == pytest.approx(token_cross_entropy(model, held_out), rel=1e-5)
    # the base is frozen, so an adapter that does not train keeps eval_loss exactly; 8 steps cut
    # it by 0.07 (CaPT, one width-32 vector) to 0.31 nats (LoPE) from about log(96) = 4.6
    assert after < before - 0.02, (before, after)

    full = model.full_state_dict()
    assert all(torch.equal(full[k], v) for k, v in base.items()), "the base model changed"

    checkpoint = tmp_path / "checkpoint-8"
    saved = load_file(checkpoint / "model.safetensors")
    assert set(saved) == names  # the adapter alone, under the wrapper's own names
    reloaded = wrapped(method)
    reloaded.load_state_dict(saved)  # strict: every adapter tensor is there
    ids = torch.stack([example["input_ids"] for example in held_out])
    model.eval()
    with torch.no_grad():
        assert torch.equal(reloaded.eval()(input_ids=ids).logits, model(input_ids=ids).logits)

    resumed = wrapped(method)
    again = Trainer(model=resumed, args=arguments(tmp_path / "resumed"), train_dataset=train)
    again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    final, continued = adapter(model), adapter(resumed)
    assert all(torch.equal(final[k], continued[k]) for k in final), "resume diverged"


@pytest.mark.parametrize("method", ["ptmoe", "lope", "capt"])
def test_gradient_accumulation_is_the_whole_batch_gradient(method, tmp_path):
    """One SGD step on 4 examples of unequal label counts, as one batch or as 2 accumulated
    micro-batches of 2: the same update, because the loss is summed over tokens and divided by
    the batch's token count (a mean of micro-batch means would weight tokens unequally)."""
    examples = dataset(4, seed=3)
    for i, example in enumerate(examples):
        example["labels"][: 2 + 3 * i] = -100  # 9, 6, 3 and 0 of the 11 targets ignored
    updates = []
    for micro, accumulate in ((4, 1), (2, 2)):
        model = wrapped(method)
        if method == "ptmoe":
            model.adapter.config = pz.PTMoEConfig(4, 2, 4, router_noise_std=0.0)
        args = arguments(
            tmp_path / str(micro),
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=accumulate,
            max_steps=1,
            optim="sgd",
            learning_rate=1.0,
            lr_scheduler_type="constant",
            max_grad_norm=0.0,
            save_strategy="no",
        )
        start = adapter(model)
        Trainer(model=model, args=args, train_dataset=examples).train()
        updates.append({k: v - start[k] for k, v in adapter(model).items()})
    one, accumulated = updates
    scale = max(v.abs().max().item() for v in one.values())
    assert scale > 0
    for key in one:  # float32 sums in another order: 1e-5 of the largest entry
        torch.testing.assert_close(accumulated[key], one[key], rtol=0, atol=1e-5 * scale)


def test_state_dict_round_trips_and_full_state_dict_has_the_base():
    model = wrapped("lope")
    state = model.state_dict()
    assert set(state) == model.adapter_names()
    assert all(".lope_" in key for key in state)
    assert set(model.full_state_dict()) > set(state)
    model.load_state_dict(state)  # strict
    broken = dict(state)
    broken.pop(next(iter(state)))
    with pytest.raises(RuntimeError, match="Missing key"):
        model.load_state_dict(broken)
    full = model.full_state_dict()
    model.load_state_dict(full)  # a whole checkpoint loads too


def bert_classifier() -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=3,
        hidden_dropout_prob=0.0,  # one batch and two micro-batches must see the same network
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config).eval()


def pair_rows(size: int) -> list[dict]:
    generator = torch.Generator().manual_seed(4)
    ids = torch.randint(3, VOCAB, (size, LENGTH), generator=generator)
    segments = (torch.arange(LENGTH) >= LENGTH // 2).long().expand(size, -1)
    labels = torch.randint(0, 3, (size,), generator=generator)
    return [
        {"input_ids": i, "token_type_ids": t, "labels": y}
        for i, t, y in zip(ids, segments, labels, strict=True)
    ]


@pytest.mark.parametrize("method", ["ptmoe", "lope", "capt"])
def test_classification_base_keeps_columns_and_accumulates_exactly(method, tmp_path):
    """A BERT sentence-pair classifier: ``token_type_ids`` reach the base under default
    arguments, and 2 accumulated micro-batches of 2 equal one batch of 4 (HF's own BERT loss
    ignores ``num_items_in_batch``; the wrappers rescale its mean loss themselves).

    In float64: an update is read as ``after - before`` of weights ~100x larger than it, so in
    float32 the rounding of the weights themselves (~1e-8 here) is as large as a tolerance tight
    enough to mean anything. In float64 what remains is a float32 rounding of the loss's scalar
    scale on the way through the Trainer (3e-8 of the update, measured)."""
    rows = pair_rows(4)
    rows[1]["labels"] = torch.tensor(-100)  # unequal labelled counts per micro-batch: 1 and 2
    updates = []
    for micro, accumulate in ((4, 1), (2, 2)):
        model = pz.get_peft_model(bert_classifier(), METHODS[method]()).double()
        if method == "lope":
            model.set_stage(2)
        if method == "ptmoe":
            model.adapter.config = pz.PTMoEConfig(4, 2, 4, router_noise_std=0.0)
        seen: list[set] = []

        def record(module, args, kwargs, seen=seen):
            seen.append(set(kwargs))

        model.base_model.register_forward_pre_hook(record, with_kwargs=True)
        args = arguments(
            tmp_path / f"{method}{micro}",
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=accumulate,
            max_steps=1,
            optim="sgd",
            learning_rate=1.0,
            lr_scheduler_type="constant",
            max_grad_norm=0.0,
            save_strategy="no",
        )
        start = adapter(model)
        Trainer(model=model, args=args, train_dataset=rows).train()
        assert all("token_type_ids" in keys for keys in seen), seen
        updates.append({k: v - start[k] for k, v in adapter(model).items()})
    one, accumulated = updates
    scale = max(v.abs().max().item() for v in one.values())
    assert scale > 0
    for key in one:
        # 1e-6: 30x the float32 rounding of the scalar loss scale; a wrongly scaled micro-batch
        # loss would be off by a third of the update
        torch.testing.assert_close(accumulated[key], one[key], rtol=0, atol=1e-6 * scale)


def test_micro_batch_without_labels_gives_zero_loss_and_finite_gradients():
    for method in ("ptmoe", "lope"):
        model = pz.get_peft_model(bert_classifier(), METHODS[method]())
        if method == "lope":
            model.set_stage(2)
        ids = torch.randint(3, VOCAB, (2, LENGTH))
        out = model(input_ids=ids, labels=torch.tensor([-100, -100]), num_items_in_batch=3)
        assert out.loss.item() == 0.0
        out.loss.backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
        assert grads
        assert all(torch.isfinite(g).all() for g in grads)


def test_assign_load_and_a_tied_base_leave_the_base_untouched(tmp_path):
    """``load_state_dict(assign=True)`` of an adapter-only dict replaces no base parameter (a
    GPT-2 base keeps its tied head), and such a base checkpoints under Trainer (safetensors
    refuses shared tensors, which a whole state dict of a tied model has)."""
    model = pz.get_peft_model(tiny_model("gpt2"), pz.LoPEConfig(r=4, num_experts=2))
    base = model.base_model
    before = {name: id(p) for name, p in model.named_parameters() if ".lope_" not in name}
    assert base.lm_head.weight is base.transformer.wte.weight
    model.load_state_dict(model.state_dict(), assign=True)
    after = {name: id(p) for name, p in model.named_parameters() if ".lope_" not in name}
    assert after == before
    assert base.lm_head.weight is base.transformer.wte.weight
    model.set_stage(2)
    args = arguments(tmp_path, max_steps=2, save_steps=2)
    Trainer(model=model, args=args, train_dataset=dataset(8, seed=5)).train()
    assert set(load_file(tmp_path / "checkpoint-2" / "model.safetensors")) == model.adapter_names()


@pytest.mark.parametrize("method", sorted(METHODS))
def test_positional_inputs_are_ids_mask_labels(method):
    model = wrapped(method).eval()
    ids = torch.randint(3, VOCAB, (2, LENGTH))
    mask = torch.ones_like(ids)
    positional = model(ids, mask, ids)
    named = model(input_ids=ids, attention_mask=mask, labels=ids)
    torch.testing.assert_close(positional.loss, named.loss, rtol=0, atol=0)
