"""LoRA fine-tuning on a weighted coreset, and the target task's exact match.

:func:`finetune` trains only the trainable (LoRA) parameters with Adam on the token-weighted
response loss ``Σ_{i ∈ S} Σ_t v_it ℓ_it / Σ v_it`` of the selected examples ``S``; minibatches
are drawn without replacement, epoch after epoch, in a seeded order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from qcs.data import extract_answer
from qcs.lm import ResponseScorer, base_model

__all__ = ["TrainConfig", "exact_match", "finetune", "load_lora_state", "lora_state"]


@dataclass(frozen=True)
class TrainConfig:
    """Adam on the adapters: ``steps`` updates of ``batch_size`` examples at learning rate
    ``lr`` (constant), ``clip_norm`` on the gradient (``None``: no clipping)."""

    steps: int = 50
    batch_size: int = 8
    lr: float = 1e-3
    clip_norm: float | None = 1.0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not (isinstance(self.lr, int | float) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr!r}")
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise ValueError(f"clip_norm must be None or > 0, got {self.clip_norm!r}")


def trainable(model) -> list[torch.nn.Parameter]:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (add LoRA adapters first)")
    return params


def lora_state(model) -> dict[str, torch.Tensor]:
    """A copy of the trainable parameters, by name."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@torch.no_grad()
def load_lora_state(model, state: dict[str, torch.Tensor]) -> None:
    """Set the trainable parameters back to ``state`` (from :func:`lora_state`)."""
    for name, param in model.named_parameters():
        if param.requires_grad:
            param.copy_(state[name])


def minibatches(indices: torch.Tensor, config: TrainConfig, generator: torch.Generator):
    """``config.steps`` minibatches of ``indices``: seeded epochs, each a fresh permutation cut
    into batches of ``batch_size`` (the last one of an epoch shorter when it does not divide)."""
    step = 0
    while True:
        order = indices[torch.randperm(len(indices), generator=generator)].tolist()
        for start in range(0, len(order), config.batch_size):
            if step == config.steps:
                return
            yield order[start : start + config.batch_size]
            step += 1


def finetune(
    scorer: ResponseScorer,
    indices,
    config: TrainConfig,
    *,
    token_weights: list[torch.Tensor] | None = None,
    seed: int = 0,
    progress: bool | None = False,
    checkpoints: list | None = None,
    checkpoint_every: int | None = None,
) -> list[float]:
    """Train ``scorer.model``'s adapters in place on the examples at ``indices``.

    Args:
        token_weights: one weight vector per example of ``scorer.data`` (over its response
            tokens); ``None``: every token weighs 1.
        checkpoints: when a list, ``(lora_state, exp_avg, exp_avg_sq)`` is appended after
            every ``checkpoint_every`` steps: the adapters and Adam's moments (flattened over the
            trainable parameters), LESS's checkpoints.
    Returns:
        The training loss of each step.
    """
    indices = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
    if indices.numel() == 0:
        raise ValueError("the selection is empty: there is nothing to train on")
    model = scorer.model
    params = trainable(model)
    optimizer = torch.optim.Adam(params, lr=config.lr)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    every = checkpoint_every or config.steps
    batches = minibatches(indices, config, generator)
    try:
        for step, batch in enumerate(tqdm(batches, total=config.steps, disable=_bar(progress),
                                          desc="fine-tune", mininterval=5)):  # fmt: skip
            loss = scorer.weighted_loss(batch, token_weights)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, config.clip_norm)
            optimizer.step()
            losses.append(loss.item())
            if checkpoints is not None and (step + 1) % every == 0:
                checkpoints.append((lora_state(model), *_adam_moments(optimizer, params)))
    finally:
        optimizer.zero_grad(set_to_none=True)  # no stale gradients left on the model
        model.eval()
    if not all(math.isfinite(v) for v in losses):
        raise FloatingPointError("fine-tuning diverged (a non-finite loss); lower the lr")
    return losses


def _adam_moments(optimizer: torch.optim.Adam, params) -> tuple[torch.Tensor, torch.Tensor]:
    state = [optimizer.state[p] for p in params]
    return (torch.cat([s["exp_avg"].reshape(-1) for s in state]).clone(),
            torch.cat([s["exp_avg_sq"].reshape(-1) for s in state]).clone())  # fmt: skip


def _bar(progress: bool | None) -> bool | None:
    return None if progress is None else not progress


@torch.no_grad()
def exact_match(model, tokenizer, data, *, max_new_tokens: int = 40, batch_size: int = 16
                ) -> float:  # fmt: skip
    """Fraction of ``data``'s examples (with gold ``answers``) whose greedy generation states
    the gold number after ``answer is``."""
    if any(a is None for a in data.answers):
        raise ValueError("exact match needs every example to carry a gold answer")
    lm = base_model(model) if not hasattr(model, "generate") else model
    device = getattr(lm, "device", torch.device("cpu"))
    correct = 0
    pad = data.pad_id
    for chunk in torch.arange(len(data)).split(batch_size):
        prompts = [data.prompt_ids[int(i)] for i in chunk]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):  # left padding for generation
            ids[row, width - len(p) :] = p
            mask[row, width - len(p) :] = 1
        out = lm.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                          max_new_tokens=max_new_tokens,
                          do_sample=False, pad_token_id=pad)  # fmt: skip
        for row, i in enumerate(chunk.tolist()):
            text = tokenizer.decode(out[row, width:].cpu(), skip_special_tokens=True)
            correct += extract_answer(text) == data.answers[i]
    return correct / len(data)
