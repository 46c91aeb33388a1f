"""Per-example clipping coefficients and what one layer hands to the controller."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# Added to the norm before dividing, as in Opacus: c_b = min(1, C / (‖g_b‖ + 1e-6)) keeps
# ‖c_b g_b‖ < C for any g_b and is finite for g_b = 0.
NORM_EPS = 1e-6


def clip_coefficients(norm2: torch.Tensor, bound: float) -> torch.Tensor:
    """c_b = min(1, bound / (‖g_b‖ + 1e-6)) from squared norms ``norm2: (B,)``."""
    return (bound / (norm2.sqrt() + NORM_EPS)).clamp(max=1.0)


@dataclass(frozen=True)
class Contribution:
    """One trainable parameter's share of a backward pass.

    Attributes:
        name: the parameter's qualified name in the model.
        norm2: ``(B,)`` float32, squared L2 norm of each example's gradient of this parameter.
        clipped_sum: maps coefficients ``(B,)`` to Σ_b c_b g_b, float32, shaped like the
            parameter (it holds the layer's saved input and output gradient until called); or,
            under per-layer clipping, that sum already formed by the layer with the
            coefficients of the parameter's bound (the ``store`` method of
            :mod:`flashdp.plan`).
    """

    name: str
    norm2: torch.Tensor
    clipped_sum: Callable[[torch.Tensor], torch.Tensor] | torch.Tensor

    @classmethod
    def from_per_example(cls, name: str, grads: torch.Tensor) -> Contribution:
        """From materialised per-example gradients ``grads: (B, *shape)`` float32."""
        flat = grads.reshape(grads.shape[0], -1)

        def clipped_sum(coef: torch.Tensor) -> torch.Tensor:
            return (coef @ flat).view(grads.shape[1:])

        return cls(name, flat.square().sum(1), clipped_sum)
