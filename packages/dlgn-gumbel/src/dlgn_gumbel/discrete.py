"""The discretized network: each neuron's argmax gate and its two inputs, and which neurons matter.

Shared by the metrics (:func:`dlgn_gumbel.gate_usage`) and the compiler.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlgn_gumbel.gates import gate_depends_on

__all__ = ["DiscreteLayer", "alive_masks", "discretize"]

# DEPENDS[g] = (depends on A, depends on B) for gate g
_DEPENDS = np.array([gate_depends_on(g) for g in range(16)], dtype=bool)


@dataclass(frozen=True)
class DiscreteLayer:
    """One discretized layer: ``idx_a``, ``idx_b`` (int64, ``(N,)``) and ``gates`` (uint8 0..15)."""

    idx_a: np.ndarray
    idx_b: np.ndarray
    gates: np.ndarray

    @property
    def width(self) -> int:
        return int(self.gates.shape[0])


def discretize(net) -> list[DiscreteLayer]:
    """The argmax gates and connections of every layer of a :class:`~dlgn_gumbel.LogicNet`."""
    return [
        DiscreteLayer(
            layer.idx_a.detach().cpu().numpy().astype(np.int64),
            layer.idx_b.detach().cpu().numpy().astype(np.int64),
            layer.gates().cpu().numpy().astype(np.uint8),
        )
        for layer in net.layers
    ]


def alive_masks(layers: list[DiscreteLayer], in_dim: int) -> list[np.ndarray]:
    """Which neurons have a path to an output through gates that depend on their input.

    Returns one bool mask per level, input first: ``masks[0]`` over the ``in_dim`` inputs,
    ``masks[i + 1]`` over layer ``i``'s neurons. Every neuron of the last layer is alive (it feeds
    GroupSum); a neuron of an earlier layer is alive when an alive neuron's gate depends on it.
    """
    masks: list[np.ndarray] = [np.ones(layers[-1].width, dtype=bool)]
    for level in range(len(layers) - 1, -1, -1):
        layer, alive = layers[level], masks[0]
        width = layers[level - 1].width if level else in_dim
        used = np.zeros(width, dtype=bool)
        deps = _DEPENDS[layer.gates]
        used[layer.idx_a[alive & deps[:, 0]]] = True
        used[layer.idx_b[alive & deps[:, 1]]] = True
        masks.insert(0, used)
    return masks
