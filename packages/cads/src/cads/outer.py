"""The outer variable ``s`` shared by every bilevel method: Adam on ``s``, the gradient's norm
clipped, then back into the feasible set (the box, or the budget polytope when an expected
selection size is imposed)."""

from __future__ import annotations

import torch

from cads.projection import project_budget

__all__ = ["OuterVariable"]


class OuterVariable:
    """Selection parameters ``s: (n,)`` with their optimizer and feasible set.

    Args:
        init: ``(n,)`` starting values in ``[0, 1]``.
        lr: Adam's learning rate (the paper: 5e-2).
        clip_norm: the largest gradient norm applied (larger ones are scaled down); ``None``: off.
        bounds: ``(low, high)`` the box kept after each step (Bernoulli scores need ``0 < s < 1``).
        size: impose ``Σ w_i s_i = size`` by projection after each step (``None``: only the box).
        weights: ``w`` for ``size`` (default ones).
    """

    def __init__(
        self,
        init: torch.Tensor,
        lr: float,
        clip_norm: float | None,
        bounds: tuple[float, float],
        size: float | None = None,
        weights: torch.Tensor | None = None,
    ) -> None:
        self.s = init.detach().clone().double().requires_grad_(True)
        self.optimizer = torch.optim.Adam([self.s], lr=lr)
        self.clip_norm = clip_norm
        self.bounds = bounds
        self.size = size
        self.weights = weights.double() if weights is not None else torch.ones_like(self.s)
        self._constrain()

    @property
    def value(self) -> torch.Tensor:
        return self.s.detach().clone()

    def expected_size(self) -> float:
        return float((self.weights * self.s.detach()).sum())

    def _constrain(self) -> None:
        with torch.no_grad():
            if self.size is not None:  # onto {Σ w s = size} within the box, exactly
                self.s.copy_(project_budget(self.s, self.size, self.weights, self.bounds))
            else:
                self.s.clamp_(*self.bounds)

    def step(self, grad: torch.Tensor) -> float:
        """One update with gradient ``grad`` (n,); returns the gradient's norm before clipping."""
        grad = grad.detach().double()
        norm = float(grad.norm())
        if self.clip_norm is not None and norm > self.clip_norm:
            grad = grad * (self.clip_norm / norm)
        self.s.grad = grad
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._constrain()
        return norm
