"""The utility of stopping: what a result is worth once its cost is paid.

U(b, ỹ_b) = ỹ_b − α·(b/B)^c, where b is the budget spent so far, B the total budget and ỹ_b the
best performance found within b. α = 0 is ordinary (cost-blind) freeze-thaw BO; c shapes how the
penalty grows (c < 1: early spending hurts most, c > 1: late spending does). As in the authors'
code, spending beyond B is worth −∞.

`fit_utility` learns (α, c) from a user's pairwise preferences between (budget, performance)
outcomes with a Bradley–Terry model: P(first ≻ second) = σ((U₁ − U₂)/τ), τ = 0.05, fitted by
binary cross-entropy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Preference", "Utility", "fit_utility"]


@dataclass(frozen=True)
class Utility:
    """U(b, y) = y − alpha·(b/budget)^c; −∞ where b > budget.

    Works elementwise on floats, numpy arrays and torch tensors (broadcasting b against y).

    Example:
        >>> u = Utility(alpha=2**-4, c=1.0, budget=300)
        >>> round(u(150, 0.9), 5)
        0.86875
    """

    alpha: float
    c: float = 1.0
    budget: float = 300.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"alpha must be a finite number >= 0, got {self.alpha}")
        if not (math.isfinite(self.c) and self.c > 0):
            raise ValueError(f"c must be a finite number > 0, got {self.c}")
        if not (math.isfinite(self.budget) and self.budget > 0):
            raise ValueError(f"budget must be a finite number > 0, got {self.budget}")

    def penalty(self, b):
        """alpha·(b/budget)^c for b >= 0 (floats, arrays or tensors)."""
        return self.alpha * (b / self.budget) ** self.c

    def __call__(self, b, y):
        over = b > self.budget
        value = y - self.penalty(b)
        if isinstance(value, torch.Tensor):
            return value.masked_fill(torch.as_tensor(over, device=value.device), -math.inf)
        if np.ndim(value) == 0:
            return -math.inf if bool(over) else float(value)
        return np.where(over, -np.inf, value)


@dataclass(frozen=True)
class Preference:
    """The user preferred outcome `winner` = (budget, performance) over `loser`."""

    winner: tuple[float, float]
    loser: tuple[float, float]


def _as_pairs(preferences) -> tuple[torch.Tensor, torch.Tensor]:
    winners, losers = [], []
    for i, pref in enumerate(preferences):
        if isinstance(pref, Preference):
            w, l = pref.winner, pref.loser
        else:
            try:
                w, l = pref
            except (TypeError, ValueError):
                raise ValueError(
                    f"preference {i} must be a Preference or a pair ((b, y), (b, y)) with the "
                    f"preferred outcome first, got {pref!r}"
                ) from None
        winners.append(tuple(map(float, w)))
        losers.append(tuple(map(float, l)))
    if not winners:
        raise ValueError("fit_utility needs at least one preference")
    w = torch.tensor(winners, dtype=torch.float64)
    l = torch.tensor(losers, dtype=torch.float64)
    if w.shape[1] != 2 or l.shape[1] != 2:
        raise ValueError("each outcome must be a (budget, performance) pair")
    if not (torch.isfinite(w).all() and torch.isfinite(l).all()):
        raise ValueError("preferences hold a non-finite budget or performance")
    if (w[:, 0] < 0).any() or (l[:, 0] < 0).any():
        raise ValueError("budgets in preferences must be >= 0")
    return w, l


def fit_utility(
    preferences,
    budget: float,
    *,
    temperature: float = 0.05,
    max_iter: int = 200,
) -> Utility:
    """Fit (alpha, c) of U(b, y) = y − alpha·(b/budget)^c to pairwise preferences.

    Bradley–Terry: P(w ≻ l) = σ((U(w) − U(l)) / temperature); the negative log-likelihood (binary
    cross-entropy with every label "first wins") is minimised over log alpha and log c by L-BFGS,
    started from a grid of (alpha, c) so the non-convex fit does not stop in a poor basin.

    Args:
        preferences: iterable of `Preference` or ((b_w, y_w), (b_l, y_l)) with the preferred outcome
            first. About 30 pairs pin (alpha, c) down well (the paper's figure).
        budget: B, the total budget the budgets are fractions of.
        temperature: the Bradley–Terry temperature (the paper's 0.05).

    Returns:
        the fitted `Utility`.
    """
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not (budget > 0 and math.isfinite(budget)):
        raise ValueError(f"budget must be > 0, got {budget}")
    w, l = _as_pairs(preferences)
    frac_w, frac_l = w[:, 0] / budget, l[:, 0] / budget
    gap_y = w[:, 1] - l[:, 1]

    def loss_of(log_alpha: torch.Tensor, log_c: torch.Tensor) -> torch.Tensor:
        alpha, c = log_alpha.exp(), log_c.exp()
        gap_u = gap_y - alpha * (frac_w**c - frac_l**c)
        return torch.nn.functional.softplus(-gap_u / temperature).mean()

    best: tuple[float, float, float] | None = None
    for alpha0 in (2**-6, 2**-4, 2**-2, 1.0):
        for c0 in (0.5, 1.0, 2.0):
            log_alpha = torch.tensor(math.log(alpha0), dtype=torch.float64, requires_grad=True)
            log_c = torch.tensor(math.log(c0), dtype=torch.float64, requires_grad=True)
            optimizer = torch.optim.LBFGS(
                [log_alpha, log_c], max_iter=max_iter, line_search_fn="strong_wolfe"
            )

            def closure(la=log_alpha, lc=log_c, opt=optimizer) -> torch.Tensor:
                opt.zero_grad()
                value = loss_of(la, lc)
                value.backward()
                return value

            optimizer.step(closure)
            with torch.no_grad():
                value = float(loss_of(log_alpha, log_c))
            if math.isfinite(value) and (best is None or value < best[0]):
                best = (value, math.exp(log_alpha.item()), math.exp(log_c.item()))
    assert best is not None  # every start is finite: the loss is a softplus of finite numbers
    # the log-parametrisation keeps both positive; clamp c into a sane range for extreme data
    return Utility(alpha=best[1], c=min(max(best[2], 1e-3), 1e3), budget=float(budget))
