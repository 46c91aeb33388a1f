"""The budget projection against a brute-force solver of the same problem, and its invariants."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cads import project_budget


def brute_force(v: torch.Tensor, size: float, w: torch.Tensor, a=0.0, b=1.0) -> torch.Tensor:
    """Every split of the coordinates into at-a / at-b / free; the free ones are ``v − λw`` for
    the λ that meets the constraint; the feasible candidate nearest to ``v`` wins."""
    best, best_distance = None, float("inf")
    for states in itertools.product((0, 1, 2), repeat=v.numel()):
        states = torch.tensor(states)
        free, top, bottom = states == 2, states == 1, states == 0
        s = torch.full(v.shape, a, dtype=torch.float64)
        s[top] = b
        if free.any():
            fixed = a * w[bottom].sum() + b * w[top].sum()
            lam = ((w * v)[free].sum() + fixed - size) / (w[free] ** 2).sum()
            s[free] = v[free] - lam * w[free]
        feasible = (s >= a - 1e-12).all() and (s <= b + 1e-12).all()
        if feasible and abs(float((w * s).sum()) - size) < 1e-9:
            distance = float(((s - v) ** 2).sum())
            if distance < best_distance:
                best, best_distance = s, distance
    return best


@pytest.mark.parametrize("bounds", [(0.0, 1.0), (1e-3, 1 - 1e-3), (0.2, 0.9)])
@pytest.mark.parametrize("seed", range(10))
def test_matches_brute_force(seed, bounds):
    generator = torch.Generator().manual_seed(seed)
    n = 2 + seed % 5
    v = torch.randn(n, generator=generator, dtype=torch.float64) * 1.5 + 0.5
    w = 1 + 3 * torch.rand(n, generator=generator, dtype=torch.float64) if seed % 2 else None
    weights = torch.ones(n, dtype=torch.float64) if w is None else w
    a, b = bounds
    share = a + (b - a) * (0.05 + 0.9 * torch.rand(1, generator=generator).item())
    size = float(weights.sum()) * share
    expected = brute_force(v, size, weights, a, b)
    # the projection is unique (strictly convex objective): the same point to rounding
    torch.testing.assert_close(project_budget(v, size, w, bounds), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("bounds", [(0.0, 1.0), (0.1, 0.9)])
def test_the_corners_of_the_box(bounds):
    a, b = bounds
    w = torch.tensor([0.7, 1.3, 2.1], dtype=torch.float64)
    v = torch.tensor([0.2, -3.0, 5.0], dtype=torch.float64)
    top = project_budget(v, b * float(w.sum()), w, bounds)
    assert (top == b).all()
    # within rounding of the corner: still accepted, still the corner
    assert (project_budget(v, b * float(w.sum()) * (1 + 1e-15), w, bounds) == b).all()
    if a > 0:
        assert (project_budget(v, a * float(w.sum()), w, bounds) == a).all()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-5, 5), min_size=1, max_size=30),
    st.floats(0.01, 1.0),
)
def test_feasible_idempotent_and_kkt(values, share):
    v = torch.tensor(values, dtype=torch.float64)
    size = share * v.numel()
    s = project_budget(v, size)
    assert abs(float(s.sum()) - size) < 1e-9 * max(1.0, size)
    assert (s >= 0).all()
    assert (s <= 1).all()
    torch.testing.assert_close(project_budget(s, size), s, rtol=0, atol=1e-12)
    # KKT: one λ with s = clip(v − λ, 0, 1); the free entries all share v − s = λ
    free = (s > 1e-9) & (s < 1 - 1e-9)
    if free.sum() > 1:
        shifts = (v - s)[free]
        assert float(shifts.max() - shifts.min()) < 1e-9


@pytest.mark.parametrize(
    ("values", "size", "weights", "message"),
    [
        (torch.tensor([0.5, 0.5]), 3.0, None, "budget size must be in"),
        (torch.tensor([0.5, 0.5]), 0.0, None, "budget size must be in"),
        (torch.tensor([0.5, float("nan")]), 1.0, None, "NaN"),
        (torch.tensor([]), 1.0, None, "non-empty"),
        (torch.tensor([0.5, 0.5]), 1.0, torch.tensor([1.0, -1.0]), "positive"),
        (torch.tensor([0.5, 0.5]), 1.0, torch.tensor([1.0]), "must match"),
    ],
)
def test_bad_input(values, size, weights, message):
    with pytest.raises(ValueError, match=message):
        project_budget(values, size, weights)
