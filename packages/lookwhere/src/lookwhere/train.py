"""Training loops: the optimiser and schedule every model here shares, supervised training (the
teacher, the baselines, LookWhere's fine-tuning) and accuracy.

AdamW with a linear warm-up and a half-cycle cosine decay to zero, as the anchor's
``warmup_cosine_decay_schedule``; gradients clipped to norm 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lookwhere.data import ImageTask


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings.

    Attributes:
        steps: Optimiser steps.
        batch_size: Images per step.
        lr: Peak learning rate.
        weight_decay: AdamW decoupled weight decay.
        warmup: Fraction of the steps spent warming up linearly from 0.
        clip: Gradient-norm clip (0 = none).
        seed: Seeds the batch order and every random choice in training.
    """

    steps: int = 300
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup: float = 0.1
    clip: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be a positive int, got {self.steps!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {self.batch_size!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warmup must be a fraction in [0, 1), got {self.warmup}")
        if not self.clip >= 0:
            raise ValueError(f"clip must be >= 0, got {self.clip}")

    def replace(self, **changes) -> TrainConfig:
        return TrainConfig(**{**asdict(self), **changes})


def warmup_cosine(step: int, total: int, warmup: int, peak: float) -> float:
    """Learning rate at `step` (0-based): `peak * (step + 1) / warmup` while warming up, then a
    half cosine from `peak` to 0 at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * peak * (1.0 + math.cos(math.pi * min(1.0, progress)))


def make_optimizer(
    model: nn.Module, params: Iterable[nn.Parameter], config: TrainConfig
) -> torch.optim.AdamW:
    """AdamW over `params`; only linear and convolution weights carry weight decay (not biases,
    norms, LayerScale, tokens or position embeddings)."""
    weights = {
        id(module.weight) for module in model.modules() if isinstance(module, nn.Linear | nn.Conv2d)
    }
    decay, no_decay = [], []
    for param in params:
        if param.requires_grad:
            (decay if id(param) in weights else no_decay).append(param)
    if not decay and not no_decay:
        raise ValueError("nothing to train: every parameter is frozen")
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
    )


def batches(count: int, config: TrainConfig) -> Iterable[tuple[int, torch.Tensor]]:
    """`(step, indices)` for `config.steps` steps of shuffled epochs over `count` examples."""
    generator = torch.Generator().manual_seed(config.seed)
    order, position = torch.randperm(count, generator=generator), 0
    for step in range(config.steps):
        if position + config.batch_size > count:
            order, position = torch.randperm(count, generator=generator), 0
        yield step, order[position : position + config.batch_size]
        position += config.batch_size


def optimise(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, int, torch.Generator], torch.Tensor],
    count: int,
    config: TrainConfig,
    *,
    params: Iterable[nn.Parameter] | None = None,
    progress: str | None = None,
) -> list[float]:
    """The shared loop: `loss_fn(indices, step, generator)` per step, AdamW, warm-up cosine.

    Returns the loss of every step.
    """
    if config.batch_size > count:
        raise ValueError(f"batch_size {config.batch_size} exceeds the {count} training examples")
    params = list(model.parameters() if params is None else params)
    optimizer = make_optimizer(model, params, config)
    warmup = int(config.warmup * config.steps)
    generator = torch.Generator().manual_seed(config.seed + 1)
    losses = []
    steps = batches(count, config)
    if progress:
        from tqdm.auto import tqdm

        # off when stderr is not a terminal (logs, CI), sparse when it is
        steps = tqdm(
            steps, total=config.steps, desc=progress, leave=False, disable=None, mininterval=5
        )
    model.train()
    for step, indices in steps:
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine(step, config.steps, warmup, config.lr)
        loss = loss_fn(indices, step, generator)
        if not torch.isfinite(loss):
            raise ValueError(
                f"the loss became {loss.item()} at step {step}: lower the learning rate"
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.clip:
            torch.nn.utils.clip_grad_norm_(params, config.clip)
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def train_classifier(
    model: nn.Module,
    task: ImageTask,
    config: TrainConfig,
    *,
    forward: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None,
    params: Iterable[nn.Parameter] | None = None,
    progress: str | None = None,
) -> list[float]:
    """Cross-entropy training on `task`; `forward(images, generator) -> logits` (default
    `model(images)`, a tensor or an object with `.logits`)."""
    call = forward or (lambda images, _generator: logits_of(model(images)))
    device = device_of(model)

    def loss_fn(indices: torch.Tensor, _step: int, generator: torch.Generator) -> torch.Tensor:
        images = task.floats(indices).to(device)
        return F.cross_entropy(call(images, generator), task.labels[indices].to(device))

    return optimise(model, loss_fn, len(task), config, params=params, progress=progress)


def logits_of(output) -> torch.Tensor:
    """A model's logits: the tensor itself, or its `.logits`."""
    return output if isinstance(output, torch.Tensor) else output.logits


def device_of(model: nn.Module) -> torch.device:
    """Where `model`'s parameters live (the CPU for a model without any)."""
    param = next(model.parameters(), None)
    return torch.device("cpu") if param is None else param.device


@torch.no_grad()
def accuracy(
    predict: Callable[[torch.Tensor], torch.Tensor],
    task: ImageTask,
    batch_size: int = 256,
    device: str | torch.device | None = None,
) -> float:
    """Top-1 accuracy of `predict(images) -> logits` over the whole task (images moved to
    `device`, default `predict`'s own when it is a module, else the CPU)."""
    if device is None:
        device = device_of(predict) if isinstance(predict, nn.Module) else "cpu"
    correct = 0
    for start in range(0, len(task), batch_size):
        index = slice(start, start + batch_size)
        logits = logits_of(predict(task.floats(index).to(device)))
        correct += int((logits.argmax(-1).cpu() == task.labels[index]).sum())
    return correct / len(task)


def uniform_k(low: int, high: int, generator: torch.Generator) -> int:
    """An int drawn uniformly from `[low, high]`."""
    return int(torch.randint(low, high + 1, (1,), generator=generator))
