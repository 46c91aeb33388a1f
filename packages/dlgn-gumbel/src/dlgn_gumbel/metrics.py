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
    sample per batch) or eval mode (discretized); the module's mode is restored afterwards. Each
    batch is moved to the network's device."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"x and y need the same non-zero length, got {x.shape[0]}, {y.shape[0]}")
    was_training = net.training
    net.train(train_mode)
    device = next(net.parameters()).device
    try:
        correct = 0
        for start in range(0, x.shape[0], batch_size):
            scores = net(x[start : start + batch_size].to(device))
            predicted = scores.argmax(1).cpu()
            correct += int((predicted == y[start : start + batch_size].cpu()).sum())
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
    """Gate statistics of a network, under each definition of an "unused" neuron.

    Structural counts, from the discretized (argmax-gate) network:

    Attributes:
        gate_counts: ``{gate name: count}`` over all neurons (all 16 names present).
        total: number of neurons.
        constant: neurons whose gate is ``0`` or ``1`` (reads neither input).
        pass_through: neurons whose gate is ``A`` or ``B`` (copies one input).
        negation: neurons whose gate is ``not A`` or ``not B`` (inverts one input).
        pass_through_or_constant: the sum of the three above (the gate ignores an input).
        dead: neurons with no path to any output through gates that read them.
        unused: neurons that are pass-through/negation/constant, dead, or both -- the
            structural definition: a neuron that computes no two-input function, or whose value
            reaches no output.
        per_layer_dead: dead count per layer.

    From the gate distributions the logits define (``softmax(w)``: the softmax relaxation's
    mixture and exactly the Gumbel sampler's distribution of ``argmax(w + g)``; the Dirichlet
    relaxation's mean ``softplus(w) / sum``):

    Attributes:
        uncollapsed: neurons whose most probable gate has probability below
            ``collapse_threshold`` -- a neuron that has not settled on one gate; the paper
            describes unused neurons by how far their gate distribution is from collapsing.
        collapse_threshold: the probability used for ``uncollapsed``.
        mean_entropy_bits: mean entropy of the neurons' gate distributions, in bits (0 when
            every neuron is certain, 4 when uniform over the 16 gates).
        per_layer_uncollapsed: uncollapsed count per layer.
    """

    gate_counts: dict[str, int]
    total: int
    constant: int
    pass_through: int
    negation: int
    dead: int
    unused: int
    per_layer_dead: tuple[int, ...]
    uncollapsed: int
    collapse_threshold: float
    mean_entropy_bits: float
    per_layer_uncollapsed: tuple[int, ...]

    @property
    def pass_through_or_constant(self) -> int:
        return self.constant + self.pass_through + self.negation

    @property
    def unused_fraction(self) -> float:
        return self.unused / self.total

    @property
    def uncollapsed_fraction(self) -> float:
        return self.uncollapsed / self.total


CONSTANT_GATES = frozenset({0, 15})
PASS_THROUGH_GATES = frozenset({3, 5})  # A, B
NEGATION_GATES = frozenset({10, 12})  # not B, not A


def gate_usage(net, *, collapse_threshold: float = 0.5) -> GateUsage:
    """Gate types, constant / pass-through / negation, dead and uncollapsed neurons of ``net``.

    Args:
        net: a :class:`~dlgn_gumbel.LogicNet`.
        collapse_threshold: a neuron is uncollapsed while its most probable gate has probability
            below this (default 0.5: no gate holds a majority). This threshold is this package's
            choice; the paper reports the distribution of the gate entropies.
    """
    if not 0 < collapse_threshold <= 1:
        raise ValueError(f"collapse_threshold must be in (0, 1], got {collapse_threshold}")
    layers = discretize(net)
    masks = alive_masks(layers, net.config.in_dim)
    counts = Counter()
    kinds = {"constant": 0, "pass_through": 0, "negation": 0}
    dead = unused = 0
    per_layer_dead, per_layer_uncollapsed = [], []
    entropy_sum = 0.0
    for module, layer, alive in zip(net.layers, layers, masks[1:], strict=True):
        counts.update(int(g) for g in layer.gates)
        for kind, gates in (
            ("constant", CONSTANT_GATES),
            ("pass_through", PASS_THROUGH_GATES),
            ("negation", NEGATION_GATES),
        ):
            kinds[kind] += int(np.isin(layer.gates, sorted(gates)).sum())
        is_trivial = np.isin(layer.gates, sorted(PASS_THROUGH_OR_CONSTANT))
        per_layer_dead.append(int((~alive).sum()))
        dead += per_layer_dead[-1]
        unused += int((is_trivial | ~alive).sum())
        with torch.no_grad():
            probs = module.gate_distribution().double()
            per_layer_uncollapsed.append(int((probs.max(1).values < collapse_threshold).sum()))
            logs = torch.where(probs > 0, probs.log2(), torch.zeros_like(probs))
            entropy_sum += float(-(probs * logs).sum())
    total = sum(layer.width for layer in layers)
    return GateUsage(
        gate_counts={name: counts.get(i, 0) for i, name in enumerate(GATE_NAMES)},
        total=total,
        **kinds,
        dead=dead,
        unused=unused,
        per_layer_dead=tuple(per_layer_dead),
        uncollapsed=sum(per_layer_uncollapsed),
        collapse_threshold=float(collapse_threshold),
        mean_entropy_bits=entropy_sum / total,
        per_layer_uncollapsed=tuple(per_layer_uncollapsed),
    )
