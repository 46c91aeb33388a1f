"""Euclidean projection of selection probabilities onto the budget polytope.

The feasible set is ``{s : Σ_i w_i s_i = k, a ≤ s_i ≤ b}`` (the box ``[a, b]`` defaults to
``[0, 1]``): ``w = 1`` constrains the expected number of selected examples (CADS-E),
``w_g = |source g|`` the number ``Σ_g |g| s_g`` that a CADS-S distribution's selection takes
(``round(s_g |g|)`` examples of each source). CADS-S's draws during the search,
``r_g ~ TN(s_g, σ, [0, 1])``, hold ``Σ_g |g| E[r_g]`` examples on average, which differs near 0
and 1 (the truncation pulls the mean inwards; the trace reports it as ``expected_draw_size``).

Its projection is ``s_i = clip(v_i − λ w_i, a, b)`` for the one ``λ`` that meets the
constraint (KKT conditions of ``min ½‖s − v‖²``). ``Σ w_i s_i(λ)`` is continuous, piecewise
linear and non-increasing in ``λ``, so bisection brackets it; the last step solves the linear
piece that holds the root exactly, so the result meets the constraint to rounding, not to a
bisection tolerance.
"""

from __future__ import annotations

import torch

__all__ = ["project_budget"]

_BISECTION_STEPS = 100  # float64 brackets collapse to adjacent floats long before this


def _check(values: torch.Tensor, size: float, weights: torch.Tensor, bounds) -> None:
    if values.dim() != 1 or values.numel() == 0:
        raise ValueError(f"values must be a non-empty vector (n,), got shape {tuple(values.shape)}")
    if weights.shape != values.shape:
        raise ValueError(
            f"weights must match values: {tuple(weights.shape)} vs {tuple(values.shape)}"
        )
    if not torch.isfinite(values).all():
        raise ValueError("values hold NaN or infinite entries")
    if not torch.isfinite(weights).all() or (weights <= 0).any():
        raise ValueError("weights must be finite and positive")
    low, high = bounds
    if not 0 <= low < high <= 1:
        raise ValueError(f"bounds must satisfy 0 <= low < high <= 1, got {bounds}")
    least, most = low * float(weights.sum()), high * float(weights.sum())
    slack = 1e-12 * max(1.0, most)  # the extremes themselves, up to the sum's rounding
    if not (size > 0 and least - slack <= size <= most + slack):
        raise ValueError(
            f"the budget size must be in [{least:g}, {most:g}] (the weights times the bounds) "
            f"and positive, got {size!r}"
        )


def project_budget(
    values: torch.Tensor,
    size: float,
    weights: torch.Tensor | None = None,
    bounds: tuple[float, float] = (0.0, 1.0),
) -> torch.Tensor:
    """The point of ``{s : Σ w_i s_i = size, low ≤ s ≤ high}`` nearest to ``values``.

    Args:
        values: ``(n,)`` any real numbers (probabilities after a gradient step).
        size: the expected selection size ``k``, in ``(0, Σ w]``.
        weights: ``(n,)`` positive weights (default all ones).
        bounds: the box ``(low, high)``, within ``[0, 1]``.

    Returns:
        ``(n,)`` in ``values``' dtype, entries in ``[low, high]``.

    Example:
        >>> import torch
        >>> s = project_budget(torch.tensor([0.9, 0.8, -0.2, 0.1]), 1.0)
        >>> round(float(s.sum()), 6), bool((s >= 0).all())
        (1.0, True)
    """
    weights = torch.ones_like(values) if weights is None else weights
    _check(values, float(size), weights, bounds)
    v, w = values.double(), weights.double()
    size, (a, b) = float(size), bounds
    total_weight = float(w.sum())
    if size >= b * total_weight:  # the top corner (or within rounding of it)
        return torch.full_like(values, b)
    if size <= a * total_weight:
        return torch.full_like(values, a)

    def total(lam: float) -> float:
        return float((w * (v - lam * w).clamp(a, b)).sum())

    # at lam = left every entry is b (total = bΣw ≥ size), at lam = right every entry is a
    left = float(((v - b) / w).min()) - 1.0
    right = float(((v - a) / w).max()) + 1.0
    for _ in range(_BISECTION_STEPS):
        middle = 0.5 * (left + right)
        if middle in (left, right):
            break
        if total(middle) > size:
            left = middle
        else:
            right = middle
    # exact solve on the linear piece: entries strictly inside (a, b) move with lam
    lam = 0.5 * (left + right)
    shifted = v - lam * w
    inside = (shifted > a) & (shifted < b)
    if inside.any():
        fixed = a * w[shifted <= a].sum() + b * w[shifted >= b].sum()
        lam = float(((w * v)[inside].sum() + fixed - size) / (w[inside] ** 2).sum())
    return (v - lam * w).clamp(a, b).to(values.dtype)
