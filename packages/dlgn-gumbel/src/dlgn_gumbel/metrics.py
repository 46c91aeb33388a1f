"""Discretization gap and gate usage of a logic gate network."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from dlgn_gumbel.discrete import alive_masks, discretize
from dlgn_gumbel.gates import GATE_NAMES, PASS_THROUGH_OR_CONSTANT

__all__ = ["DiscretizationGap", "GateUsage", "accuracy", "discretization_gap", "gate_usage"]


@torch.no_grad()
def accuracy(net, x: torch.Tensor, y: torch.Tensor, *, train_mode: bool, batch_size: int = 1024):
    """Accuracy of ``net`` on ``(x, y)`` in training mode (relaxed, or Gumbel-sampled with one
    sample per batch) or eval mode (discretized); the module's mode is restored afterwards."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"x and y need the same non-zero length, got {x.shape[0]}, {y.shape[0]}")
    was_training = net.training
    net.train(train_mode)
    try:
        correct = 0
        for start in range(0, x.shape[0], batch_size):
            scores = net(x[start : start + batch_size])
            correct += int((scores.argmax(1) == y[start : start + batch_size]).sum())
    finally:
        net.train(was_training)
    return correct / x.shape[0]


@dataclass(frozen=True)
class DiscretizationGap:
    """``gap = train_accuracy - discrete_accuracy`` (fractions in [0, 1])."""

    train_accuracy: float
    discrete_accuracy: float

    @property
    def gap(self) -> float:
        return self.train_accuracy - self.discrete_accuracy


def discretization_gap(
    net, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 1024
) -> DiscretizationGap:
    """Training-mode accuracy minus discretized (argmax-gate) accuracy on ``(x, y)``.

    Args:
        net: a :class:`~dlgn_gumbel.LogicNet`.
        x: ``(B, in_dim)`` float inputs; y: ``(B,)`` int64 labels.
    """
    return DiscretizationGap(
        accuracy(net, x, y, train_mode=True, batch_size=batch_size),
        accuracy(net, x, y, train_mode=False, batch_size=batch_size),
    )


@dataclass(frozen=True)
class GateUsage:
    """Gate statistics of the discretized network.

    Attributes:
        gate_counts: ``{gate name: count}`` over all neurons (all 16 names present).
        total: number of neurons.
        pass_through_or_constant: neurons whose gate is 0, 1, A, B, not A or not B.
        dead: neurons with no path to any output through gates that read them.
        unused: neurons that are pass-through/constant, dead, or both.
        per_layer_dead: dead count per layer.
    """

    gate_counts: dict[str, int]
    total: int
    pass_through_or_constant: int
    dead: int
    unused: int
    per_layer_dead: tuple[int, ...]

    @property
    def unused_fraction(self) -> float:
        return self.unused / self.total


def gate_usage(net) -> GateUsage:
    """Gate types, pass-through/constant and dead neurons of ``net``'s argmax gates."""
    layers = discretize(net)
    masks = alive_masks(layers, net.config.in_dim)
    counts = Counter()
    trivial = dead = unused = 0
    per_layer = []
    for layer, alive in zip(layers, masks[1:], strict=True):
        counts.update(int(g) for g in layer.gates)
        is_trivial = np.isin(layer.gates, sorted(PASS_THROUGH_OR_CONSTANT))
        trivial += int(is_trivial.sum())
        per_layer.append(int((~alive).sum()))
        dead += per_layer[-1]
        unused += int((is_trivial | ~alive).sum())
    return GateUsage(
        {name: counts.get(i, 0) for i, name in enumerate(GATE_NAMES)},
        sum(layer.width for layer in layers),
        trivial,
        dead,
        unused,
        tuple(per_layer),
    )
