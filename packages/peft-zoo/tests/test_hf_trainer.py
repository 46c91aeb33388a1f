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
