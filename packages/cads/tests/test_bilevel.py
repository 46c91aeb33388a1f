"""The implicit-differentiation hypergradient against finite differences of a closed-form inner
solution, and the conventional solvers end to end."""

from __future__ import annotations

import pytest
import torch

import cads
from cads import implicit_hypergradient

DIM, N, RIDGE = 4, 12, 0.3
generator = torch.Generator().manual_seed(0)
X = torch.randn(N, DIM, generator=generator, dtype=torch.float64)
Y = X @ torch.randn(DIM, generator=generator, dtype=torch.float64) + 0.3 * torch.randn(
    N, generator=generator, dtype=torch.float64
)
XV = torch.randn(20, DIM, generator=generator, dtype=torch.float64)
YV = XV @ torch.randn(DIM, generator=generator, dtype=torch.float64)


def inner_loss(theta, w):
    return (w * (X @ theta - Y) ** 2).sum() / w.sum() + RIDGE * (theta**2).sum()


def solve(w):
    """θ*(w) of the weighted ridge regression, in closed form."""
    a = (X.T * w) @ X / w.sum() + RIDGE * torch.eye(DIM, dtype=torch.float64)
    return torch.linalg.solve(a, (X.T * w) @ Y / w.sum())


def val_loss(theta):
    return ((XV @ theta - YV) ** 2).mean()


def finite_differences(w, h=1e-6):
    grad = torch.zeros_like(w)
    for i in range(w.numel()):
        step = torch.zeros_like(w)
        step[i] = h
        grad[i] = (val_loss(solve(w + step)) - val_loss(solve(w - step))) / (2 * h)
    return grad


@pytest.mark.parametrize(
    ("method", "iterations", "tolerance"), [("cg", DIM, 1e-7), ("neumann", 3000, 1e-6)]
)
def test_hypergradient_matches_finite_differences(method, iterations, tolerance):
    w = 0.2 + torch.rand(N, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    w.requires_grad_(True)
    theta = solve(w.detach()).clone().requires_grad_(True)
    weights = w.detach()
    top = float(torch.linalg.eigvalsh(X.T @ X).max())
    hessian_bound = 2 * top * float(weights.max() / weights.sum()) + 2 * RIDGE
    grad = implicit_hypergradient(
        [theta],
        lambda: inner_loss(theta, w),
        lambda: val_loss(theta),
        w,
        method=method,
        iterations=iterations,
        neumann_scale=1.0 / hessian_bound,
    )
    # CG is exact in DIM steps on a quadratic; the Neumann series converges geometrically
    torch.testing.assert_close(grad, finite_differences(w.detach()), rtol=tolerance, atol=tolerance)


def test_negative_curvature_stops_conjugate_gradients():
    """A saddle: CG must not divide by a non-positive curvature (the answer stays finite)."""
    theta = torch.tensor([0.1, -0.2], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    grad = implicit_hypergradient(
        [theta],
        lambda: w[0] * (theta[0] ** 2 - theta[1] ** 2),
        lambda: theta.sum(),
        w,
        iterations=5,
    )
    assert torch.isfinite(grad).all()
    # the first direction has zero curvature (H = diag(2w, −2w), rhs = (1, 1)): CG returns the
    # right-hand side itself, so the hypergradient is −∂_w[(2wθ0, −2wθ1)·(1, 1)] = −2(θ0 − θ1)
    torch.testing.assert_close(grad, torch.tensor([-0.6], dtype=torch.float64))


def test_planted_noise_conventional_solvers_drop_the_noisy_source():
    task = cads.toy_task(per_source=48, seed=1)
    inner = cads.InnerConfig(batch_size=16, lr=0.05)
    config = cads.SelectConfig(outer_steps=8, samples=3)
    for method in ("bilevel-s", "implicit-s"):
        selection = cads.select(task, 20, method, config=config, inner=inner, progress=False)
        clean, noisy = selection.probabilities.tolist()
        assert noisy < 0.5 < clean, (method, clean, noisy)  # both started at 0.5
        assert len(selection.trace) == config.outer_steps


def test_bilevel_draws_train_for_the_whole_budget(monkeypatch):
    """K full inner runs of C steps per outer step: the cost the paper's speed claim is about."""
    import cads.bilevel

    calls = []
    original = cads.bilevel.train_under_budget

    def counted(*args, **kwargs):
        log = original(*args, **kwargs)
        calls.append(log.steps)
        return log

    monkeypatch.setattr(cads.bilevel, "train_under_budget", counted)
    task = cads.toy_task(per_source=16)
    config = cads.SelectConfig(outer_steps=3, samples=4)
    cads.select(task, 7, "bilevel-e", config=config, progress=False)
    nonempty = [c for c in calls if c]
    assert len(calls) == 12
    assert all(c == 7 for c in nonempty)
