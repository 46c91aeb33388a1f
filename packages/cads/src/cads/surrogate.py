"""The budget-reachable training loss ``l(|m|)``: CADS's one-dimensional surrogate.

CADS replaces the inner problem's solution by a penalty that pulls the jointly trained model's
training loss on a subset towards the loss a model *could reach* on a subset of that size within
the budget. That target depends on the subset only through its size, so it is one function of one
variable, estimated once: train a model for the whole budget on random subsets of a few sizes
(the paper's fractions ``{0.01, 0.02, 0.05, 0.1, 0.3, 0.5, 0.7, 0.9}`` of the pool, at least one
batch), record each final training loss, and interpolate ``log(l + 1e-10)`` with a piecewise
cubic through the points (the paper's choice over a log-linear fit).

Two cubics are offered. ``"pchip"`` (the default) is the monotone cubic Hermite interpolant
(Fritsch-Carlson slopes, as scipy's ``PchipInterpolator``): it never overshoots between
measured points. ``"cubic"`` is the natural cubic spline (zero curvature at the end knots). The
paper says "cubic spline" without a boundary condition; on the reachable loss, which rises
steeply at small sizes and is measured with noise, a C2 spline oscillates between the knots (the
grid test in ``tests/test_surrogate.py`` measures up to 0.25 nats off where the measurements'
standard error is 0.05), while the monotone form stays within it. Beyond the end knots both
continue along the end tangent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["INTERPOLATIONS", "PAPER_FRACTIONS", "LossSurrogate", "natural_cubic_spline",
           "pchip_slopes"]  # fmt: skip

INTERPOLATIONS = ("pchip", "cubic")

PAPER_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.3, 0.5, 0.7, 0.9)
LOG_EPS = 1e-10


def natural_cubic_spline(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Second derivatives ``(n,)`` at the knots of the natural cubic spline through ``(x, y)``.

    ``x`` strictly increasing, ``n ≥ 2`` (two knots: a straight line). Solves the tridiagonal
    system of the spline's continuity conditions (float64).
    """
    n = x.numel()
    if n < 2:
        raise ValueError("a spline needs at least 2 knots")
    h = x[1:] - x[:-1]
    if (h <= 0).any():
        raise ValueError("spline knots must be strictly increasing")
    second = torch.zeros(n, dtype=torch.float64)
    if n == 2:
        return second
    slope = (y[1:] - y[:-1]) / h
    system = torch.zeros(n - 2, n - 2, dtype=torch.float64)
    idx = torch.arange(n - 2)
    system[idx, idx] = 2 * (h[:-1] + h[1:])
    system[idx[:-1], idx[:-1] + 1] = h[1:-1]
    system[idx[:-1] + 1, idx[:-1]] = h[1:-1]
    second[1:-1] = torch.linalg.solve(system, 6 * (slope[1:] - slope[:-1]))
    return second


def _edge_slope(h0, h1, d0, d1):
    slope = ((2 * h0 + h1) * d0 - h0 * d1) / (h0 + h1)
    if torch.sign(slope) != torch.sign(d0):
        return torch.zeros_like(slope)
    if torch.sign(d0) != torch.sign(d1) and slope.abs() > 3 * d0.abs():
        return 3 * d0
    return slope


def pchip_slopes(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Slopes ``(n,)`` at the knots of the monotone cubic Hermite interpolant (Fritsch-Carlson:
    zero where the data turn, a weighted harmonic mean of the neighbouring secants elsewhere;
    the three-point end formula), as scipy's ``PchipInterpolator``."""
    h = x[1:] - x[:-1]
    if (h <= 0).any():
        raise ValueError("spline knots must be strictly increasing")
    secant = (y[1:] - y[:-1]) / h
    if x.numel() == 2:
        return secant.repeat(2)
    slopes = torch.zeros_like(y)
    w1, w2 = 2 * h[1:] + h[:-1], h[1:] + 2 * h[:-1]
    left, right = secant[:-1], secant[1:]
    same = (left * right) > 0
    harmonic = (w1 + w2) / (w1 / torch.where(same, left, 1.0) + w2 / torch.where(same, right, 1.0))
    slopes[1:-1] = torch.where(same, harmonic, 0.0)
    slopes[0] = _edge_slope(h[0], h[1], secant[0], secant[1])
    slopes[-1] = _edge_slope(h[-1], h[-2], secant[-1], secant[-2])
    return slopes


@dataclass(frozen=True)
class LossSurrogate:
    """``l(size)``: the interpolated final training loss of budget-``C`` training on a random
    subset of ``size`` examples. ``sizes`` and ``losses`` are the measured points."""

    sizes: tuple[float, ...]
    losses: tuple[float, ...]
    interpolation: str = "pchip"

    def __post_init__(self) -> None:
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"interpolation must be one of {INTERPOLATIONS}, got {self.interpolation!r}"
            )
        if len(self.sizes) != len(self.losses) or len(self.sizes) < 2:
            raise ValueError("a loss surrogate needs at least 2 (size, loss) points, paired")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:], strict=False)):
            raise ValueError(f"sizes must be strictly increasing, got {self.sizes}")
        if not all(math.isfinite(v) and v >= 0 for v in self.losses):
            raise ValueError(f"losses must be finite and non-negative, got {self.losses}")

    def __call__(self, size: torch.Tensor | float) -> torch.Tensor:
        """``l`` at ``size`` (any shape, float64 out)."""
        x = torch.tensor(self.sizes, dtype=torch.float64)
        y = torch.log(torch.tensor(self.losses, dtype=torch.float64) + LOG_EPS)
        t = torch.as_tensor(size, dtype=torch.float64)
        u = t.flatten()
        i = (torch.searchsorted(x, u, right=True) - 1).clamp(0, x.numel() - 2)
        h = x[i + 1] - x[i]
        if self.interpolation == "cubic":
            m = natural_cubic_spline(x, y)
            a, b = (x[i + 1] - u) / h, (u - x[i]) / h
            value = a * y[i] + b * y[i + 1] + ((a**3 - a) * m[i] + (b**3 - b) * m[i + 1]) * h**2 / 6
            gaps = x[1:] - x[:-1]
            end_slopes = (
                (y[1] - y[0]) / gaps[0] - gaps[0] * (2 * m[0] + m[1]) / 6,
                (y[-1] - y[-2]) / gaps[-1] + gaps[-1] * (m[-2] + 2 * m[-1]) / 6,
            )
        else:
            d = pchip_slopes(x, y)
            s = (u - x[i]) / h
            value = (2 * s**3 - 3 * s**2 + 1) * y[i] + (s**3 - 2 * s**2 + s) * h * d[i]
            value = value + (3 * s**2 - 2 * s**3) * y[i + 1] + (s**3 - s**2) * h * d[i + 1]
            end_slopes = (d[0], d[-1])
        # beyond the end knots: the end tangent
        value = torch.where(u < x[0], y[0] + end_slopes[0] * (u - x[0]), value)
        value = torch.where(u > x[-1], y[-1] + end_slopes[1] * (u - x[-1]), value)
        return (torch.exp(value) - LOG_EPS).clamp_min(0.0).view(t.shape)

    def to_json(self) -> dict:
        return {"sizes": list(self.sizes), "losses": list(self.losses),
                "interpolation": self.interpolation}  # fmt: skip


def surrogate_sizes(pool: int, batch_size: int, fractions: Sequence[float] = PAPER_FRACTIONS):
    """Distinct subset sizes: each fraction of ``pool``, at least one batch, at most the pool."""
    if not fractions or any(not 0 < f <= 1 for f in fractions):
        raise ValueError(f"surrogate fractions must lie in (0, 1], got {tuple(fractions)}")
    sizes = sorted({min(pool, max(batch_size, round(f * pool))) for f in fractions})
    if len(sizes) < 2:
        raise ValueError(
            f"the fractions give fewer than 2 distinct subset sizes for a pool of {pool} "
            f"examples and batches of {batch_size}"
        )
    return sizes


def fit_loss_surrogate(
    task,
    budget,
    inner,
    *,
    fractions: Sequence[float] = PAPER_FRACTIONS,
    interpolation: str = "pchip",
    seed: int = 0,
    progress=None,
) -> LossSurrogate:
    """Measure ``l`` at each fraction's size: a fresh model trained for the whole ``budget`` on a
    seeded random subset of the pool, its final mean loss on that subset, in training mode
    (dropout active, BatchNorm on batch statistics), the mode in which CADS computes the
    training loss ``L_trn(θ, m)`` that the penalty compares with ``l``."""
    from cads.budget import train_under_budget
    from cads.task import per_example_losses

    generator = torch.Generator().manual_seed(seed)
    sizes = surrogate_sizes(len(task), inner.batch_size, fractions)
    losses = []
    for size in sizes:
        subset = torch.randperm(len(task), generator=generator)[:size]
        model = task.model_fn(seed)
        train_under_budget(
            model,
            task.inputs,
            task.targets,
            subset,
            budget,
            task.loss_fn,
            inner,
            generator=generator,
        )
        # in training mode, as CADS computes the L_trn(θ, m) this target is compared with
        loss = per_example_losses(
            model, task.inputs[subset], task.targets[subset], task.loss_fn, training=True
        )
        losses.append(float(loss.mean()))
        if progress is not None:
            progress.update(1)
    return LossSurrogate(tuple(float(s) for s in sizes), tuple(losses), interpolation)
