"""How much signal a stochastic relaxation's gradient carries, layer by layer.

For one batch, the gradient of the loss with respect to each layer's logits is taken once under
the softmax relaxation (deterministic) and ``draws`` times under the stochastic relaxation (fresh
noise each time). Per layer, three cosines:

* ``cos_draw_softmax``: one noisy draw against the softmax gradient (mean over draws) -- does a
  single step point where the relaxed network's gradient points?
* ``cos_draw_mean``: one draw against the mean of all draws (mean over draws). Noiseless draws
  give 1; draws of pure zero-mean noise give about ``1/sqrt(draws)``, because the mean is then
  itself mostly noise and shares with each draw only that draw's own ``1/draws`` part.
* ``cos_mean_softmax``: the mean of the draws against the softmax gradient -- whether averaging
  over noise recovers the relaxed gradient's direction.

The noise of draw ``d`` is seeded with ``torch.manual_seed(seed + d)`` inside a forked RNG, so the
caller's random state is left as it was.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from dlgn_gumbel.choices import NOISES, RELAXATIONS, check_choice

__all__ = ["GradientAgreement", "LayerAgreement", "gradient_agreement"]


@dataclass(frozen=True)
class LayerAgreement:
    """The three cosines of one layer (see the module docstring)."""

    layer: int
    cos_draw_softmax: float
    cos_draw_mean: float
    cos_mean_softmax: float


@dataclass(frozen=True)
class GradientAgreement:
    """Per-layer cosines of one diagnosis, with what was compared."""

    layers: tuple[LayerAgreement, ...]
    draws: int
    relaxation: str
    noise: str
    batch_size: int

    @property
    def pure_noise_reference(self) -> float:
        """``cos_draw_mean`` of draws that are pure zero-mean noise: about ``1/sqrt(draws)``."""
        return 1.0 / math.sqrt(self.draws)

    def to_markdown(self) -> str:
        head = (
            f"| layer | cos(draw, softmax) | cos(draw, mean of {self.draws}) | "
            "cos(mean, softmax) |\n|---:|---:|---:|---:|\n"
        )
        rows = "".join(
            f"| {row.layer} | {row.cos_draw_softmax:.3f} | {row.cos_draw_mean:.3f} | "
            f"{row.cos_mean_softmax:.3f} |\n"
            for row in self.layers
        )
        return head + rows


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine of two flattened float64 vectors; 0 when either is zero."""
    norm = float(a.norm() * b.norm())
    return float(a @ b) / norm if norm > 0 else 0.0


@contextmanager
def _relaxed(net, relaxation: str, noise: str | None) -> Iterator[None]:
    """Every layer of ``net`` with ``relaxation`` (and ``noise``) for the duration; the layers'
    own settings and the module's mode are restored afterwards."""
    saved = [(layer.relaxation, layer.noise) for layer in net.layers]
    was_training = net.training
    try:
        net.train()
        for layer in net.layers:
            layer.relaxation = relaxation
            if noise is not None:
                layer.noise = noise
        yield
    finally:
        for layer, (rel, noi) in zip(net.layers, saved, strict=True):
            layer.relaxation, layer.noise = rel, noi
        net.train(was_training)


def _logit_gradients(net, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    loss = torch.nn.functional.cross_entropy(net(x), y)
    grads = torch.autograd.grad(loss, [layer.weights for layer in net.layers])
    return [g.detach().double().flatten() for g in grads]


def gradient_agreement(
    net,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    draws: int = 64,
    relaxation: str = "gumbel",
    noise: str | None = None,
    seed: int = 0,
) -> GradientAgreement:
    """Cosines between noisy and softmax logit gradients of ``net`` on the batch ``(x, y)``.

    Args:
        net: a :class:`~dlgn_gumbel.LogicNet`; its logits are not changed.
        x: ``(B, in_dim)`` float inputs; y: ``(B,)`` int64 labels.
        draws: number of noisy gradients (>= 2).
        relaxation: the relaxation whose noisy gradients are compared (``"gumbel"`` by default;
            ``"softmax"`` gives cosines of exactly 1, a check of the measurement itself).
        noise: ``"shared"`` or ``"per_example"``; ``None`` keeps each layer's own setting.
        seed: draw ``d`` runs under ``torch.manual_seed(seed + d)``.
    """
    check_choice("relaxation", relaxation, RELAXATIONS)
    if noise is not None:
        check_choice("noise", noise, NOISES)
        if relaxation == "softmax":
            raise ValueError("noise applies to a stochastic relaxation, not 'softmax'")
    if not isinstance(draws, int) or draws < 2:
        raise ValueError(f"draws must be an int >= 2, got {draws!r}")
    if x.dim() != 2 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(
            f"x (B, in_dim) and y (B,) must be non-empty and agree: {tuple(x.shape)}, "
            f"{tuple(y.shape)}"
        )
    with _relaxed(net, "softmax", None):
        reference = _logit_gradients(net, x, y)
    samples: list[list[torch.Tensor]] = []
    devices = [x.device.index or 0] if x.is_cuda else []
    with _relaxed(net, relaxation, noise), torch.random.fork_rng(devices=devices):
        for d in range(draws):
            torch.manual_seed(seed + d)
            samples.append(_logit_gradients(net, x, y))
        used_noise = net.layers[0].noise
    rows = []
    for i, soft in enumerate(reference):
        layer_draws = [sample[i] for sample in samples]
        mean = torch.stack(layer_draws).mean(0)
        rows.append(
            LayerAgreement(
                layer=i + 1,
                cos_draw_softmax=sum(_cosine(g, soft) for g in layer_draws) / draws,
                cos_draw_mean=sum(_cosine(g, mean) for g in layer_draws) / draws,
                cos_mean_softmax=_cosine(mean, soft),
            )
        )
    return GradientAgreement(tuple(rows), draws, relaxation, used_noise, int(x.shape[0]))
