"""Synthetic learning curves with known continuations, and a surrogate that knows them.

`KnownCurvesSurrogate` samples each configuration's true curve plus one Gaussian offset per sample
path (joint curves), so the distribution of every continuation is known in closed form and tests
can compute acquisitions and stopping decisions by brute force.
"""

from __future__ import annotations

import numpy as np
import torch

from freeze_thaw_bo.benchmark import CurveTable
from freeze_thaw_bo.space import Float, SearchSpace


def saturating_curves(n: int, epochs: int, seed: int = 0) -> np.ndarray:
    """(n, epochs) curves y = a − b·exp(−e/τ) in [0, 1], diverse in asymptote and speed."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.3, 0.95, n)
    b = rng.uniform(0.05, 0.3, n)
    tau = rng.uniform(1.0, epochs / 2, n)
    e = np.arange(1, epochs + 1)
    return np.clip(a[:, None] - b[:, None] * np.exp(-e[None, :] / tau[:, None]), 0.0, 1.0)


def curve_table(n: int = 12, epochs: int = 8, seed: int = 0) -> CurveTable:
    space = SearchSpace({"lr": Float(1e-4, 1e-1, log=True), "wd": Float(0.0, 1.0)})
    return CurveTable(
        name="synthetic",
        space=space,
        configs=tuple(space.sample(n, seed=seed)),
        values=saturating_curves(n, epochs, seed),
        costs=np.ones((n, epochs)),
    )


class KnownCurvesSurrogate:
    """Samples `curves[n] + sigma·z_s` (one z per path), clipped to [0, 1]."""

    def __init__(self, curves: np.ndarray, sigma: float = 0.05) -> None:
        self.curves = torch.as_tensor(curves, dtype=torch.float32)
        self.sigma = sigma

    def sample_curves(self, observations, num_samples, generator):
        n, t = self.curves.shape
        assert observations.num_configs == n
        assert observations.horizon == t
        z = torch.randn(n, num_samples, 1, generator=generator)
        return (self.curves[:, None, :] + self.sigma * z).clamp(0.0, 1.0)
