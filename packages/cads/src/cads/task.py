"""A data-selection problem: a training pool split into sources, validation and test data, a
model factory and a per-example loss.

Selection sees only the pool and the validation split; the test split is for the one final
report (:func:`cads.evaluate_selection`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["SelectionTask", "classification_loss", "evaluate", "token_loss"]

ModelFn = Callable[[int], torch.nn.Module]  # seed -> freshly initialised model


def classification_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-example cross-entropy ``(B,)`` of a classifier's logits ``(B, classes)``."""
    return F.cross_entropy(model(x), y, reduction="none")


def token_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-example mean next-token cross-entropy ``(B,)`` of an LM's logits ``(B, T, V)``."""
    logits = model(x)
    losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
    return losses.view(y.shape).mean(-1)


@dataclass
class SelectionTask:
    """The pool ``(N, ...)`` with its source id per example, validation and test splits.

    Attributes:
        inputs: the training pool, ``(N, ...)``.
        targets: its targets, ``(N, ...)``.
        sources: ``(N,)`` integer source ids in ``0..len(source_names)-1`` (stored as int64; float
            or bool ids are refused, never truncated); every source non-empty.
        source_names: one name per source.
        val_inputs: the validation inputs (selection reads them).
        val_targets: their targets.
        test_inputs: the test inputs (only :func:`cads.evaluate_selection` reads them).
        test_targets: their targets.
        model_fn: ``model_fn(seed)`` returns a freshly initialised model.
        loss_fn: ``loss_fn(model, x, y) -> (B,)`` per-example losses.
        metric: ``"accuracy"`` (classification: higher is better) or ``"loss"`` (lower is).
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    sources: torch.Tensor
    source_names: tuple[str, ...]
    val_inputs: torch.Tensor
    val_targets: torch.Tensor
    test_inputs: torch.Tensor
    test_targets: torch.Tensor
    model_fn: ModelFn
    loss_fn: Callable = classification_loss
    metric: str = "accuracy"

    def __post_init__(self) -> None:
        n = len(self.inputs)
        if n == 0:
            raise ValueError("the training pool is empty")
        for name, inputs, targets in (
            ("training", self.inputs, self.targets),
            ("validation", self.val_inputs, self.val_targets),
            ("test", self.test_inputs, self.test_targets),
        ):
            if len(inputs) != len(targets):
                raise ValueError(f"{name} split: {len(inputs)} inputs but {len(targets)} targets")
            if len(inputs) == 0:
                raise ValueError(f"the {name} split is empty")
        sources = torch.as_tensor(self.sources)
        if sources.dtype == torch.bool or sources.is_floating_point() or sources.is_complex():
            raise ValueError(f"sources must be integer source ids, got dtype {sources.dtype}")
        if sources.shape != (n,):
            raise ValueError(f"sources must be ({n},), one id per pool example")
        self.source_names = tuple(self.source_names)
        if sources.min() < 0 or sources.max() >= len(self.source_names):
            raise ValueError(
                f"source ids must lie in 0..{len(self.source_names) - 1} (one per source name), "
                f"got ids from {int(sources.min())} to {int(sources.max())}"
            )
        self.sources = sources.long()
        counts = self.source_sizes()
        empty = [self.source_names[j] for j, c in enumerate(counts.tolist()) if c == 0]
        if empty:
            raise ValueError(f"source(s) {empty} hold no example")
        if self.metric not in ("accuracy", "loss"):
            raise ValueError(f"metric must be 'accuracy' or 'loss', got {self.metric!r}")

    def __len__(self) -> int:
        return len(self.inputs)

    def source_sizes(self) -> torch.Tensor:
        """``(n_sources,)`` examples per source."""
        return torch.bincount(self.sources, minlength=len(self.source_names))


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable,
    batch_size: int = 1024,
) -> dict[str, float]:
    """Mean loss (and accuracy, for a classifier's ``(B, classes)`` logits) over a split; the
    model is left in the mode it came in."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, correct = 0.0, 0
    for start in range(0, len(inputs), batch_size):
        x = inputs[start : start + batch_size].to(device)
        y = targets[start : start + batch_size].to(device)
        total += float(loss_fn(model, x, y).sum())
        if y.dim() == 1:
            correct += int((model(x).argmax(-1) == y).sum())
    model.train(was_training)
    result = {"loss": total / len(inputs)}
    if targets.dim() == 1:
        result["accuracy"] = correct / len(inputs)
    return result


@torch.no_grad()
def per_example_losses(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable,
    batch_size: int = 1024,
    *,
    training: bool = False,
) -> torch.Tensor:
    """``(N,)`` losses of every example, in evaluation mode, or in training mode with
    ``training=True`` (dropout active, BatchNorm on each chunk's statistics, its running
    statistics updated); the model's mode is restored."""
    was_training = model.training
    model.train(training)
    device = next(model.parameters()).device
    parts = [
        loss_fn(
            model, inputs[i : i + batch_size].to(device), targets[i : i + batch_size].to(device)
        )
        for i in range(0, len(inputs), batch_size)
    ]
    model.train(was_training)
    return torch.cat(parts).cpu()
