"""QCS's probabilistic relaxation: Bernoulli policies at two levels and their policy gradient.

Sequence indicators ``m_i ~ Bernoulli(s_i)``; for each response token an indicator
``z_it ~ Bernoulli(π_it)`` giving the elastic weight ``v_it = ε + (1 − 2ε) z_it`` ∈ {ε, 1 − ε}.
A token's training weight is the product ``m_i v_it``: the objective is quadratic (degree two) in
the two levels' decision variables.

For ``Φ(s, π) = E[f(m, v)]``, with ``f`` the validation loss after training on the weighted
coreset, the hierarchical policy gradient is

    ∇_s Φ  = E[(f − b) (m − s) / (s (1 − s))]
    ∇_π Φ  = E[(f − b) m_i (z_it − π_it) / (π_it (1 − π_it))]

The token-level score is taken only inside drawn sequences (``m_i = 1``): ``f`` does not depend
on the tokens of a sequence left out, so their score term has mean zero and dropping it lowers the
variance without bias. ``b`` is a baseline independent of the draw: the leave-one-out mean of the
other ``K − 1`` values (unbiased), the mean of all ``K`` (shrinks the estimate by ``(K − 1)/K``),
or none. No derivative of ``f`` is taken: the inner training is never back-propagated through.
"""

from __future__ import annotations

import torch

__all__ = [
    "BASELINES",
    "PolicyDraw",
    "elastic_weights",
    "hierarchical_gradient",
    "project_budget",
    "sample_policy",
]

BASELINES = ("leave_one_out", "mean", "none")


class PolicyDraw:
    """One draw: ``m`` ``(n,)`` float 0/1 and ``z`` a list of ``n`` 0/1 vectors (tokens)."""

    def __init__(self, m: torch.Tensor, z: list[torch.Tensor]) -> None:
        self.m, self.z = m, z

    def selected(self) -> torch.Tensor:
        return torch.nonzero(self.m > 0.5).flatten()


def sample_policy(s: torch.Tensor, pi: list[torch.Tensor] | None,
                  generator: torch.Generator) -> PolicyDraw:  # fmt: skip
    """Draw ``m ~ Bernoulli(s)`` and, for every sequence, ``z ~ Bernoulli(π_i)`` (``pi=None``:
    sequence level only, no token draws: every ``z`` is an empty vector)."""
    m = torch.bernoulli(s, generator=generator)
    if pi is None:
        z = [torch.ones(0)] * len(s)
    else:
        z = [torch.bernoulli(p, generator=generator) for p in pi]
    return PolicyDraw(m, z)


def elastic_weights(z: list[torch.Tensor] | None, lengths, epsilon: float) -> list[torch.Tensor]:
    """``v = ε + (1 − 2ε) z`` per token; ``z=None``: every weight 1 (sequence level only)."""
    if z is None:
        return [torch.ones(int(n)) for n in lengths]
    return [epsilon + (1 - 2 * epsilon) * zi.float() for zi in z]


def _centered(values: torch.Tensor, baseline: str) -> torch.Tensor:
    if values.dim() != 1:
        raise ValueError(f"values must be (K,), got shape {tuple(values.shape)}")
    if not torch.isfinite(values).all():
        raise ValueError("values hold NaN or infinite entries (a diverged inner run?)")
    count = values.numel()
    if baseline == "leave_one_out":
        if count < 2:
            raise ValueError("the leave-one-out baseline needs at least 2 draws (K >= 2)")
        return values - (values.sum() - values) / (count - 1)
    if baseline == "mean":
        return values - values.mean()
    if baseline == "none":
        return values
    raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")


def hierarchical_gradient(
    values: torch.Tensor,
    draws: list[PolicyDraw],
    s: torch.Tensor,
    pi: list[torch.Tensor] | None,
    baseline: str = "leave_one_out",
) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """Estimates of ``(∇_s Φ, ∇_π Φ)`` from ``K`` draws and their objective ``values`` ``(K,)``.

    Returns the sequence-level gradient ``(n,)`` and, unless ``pi`` is ``None``, one token-level
    gradient vector per sequence (see the module docstring).

    Example:
        >>> import torch
        >>> s = torch.full((3,), 0.5, dtype=torch.float64)
        >>> g = torch.Generator().manual_seed(0)
        >>> draws = [sample_policy(s, None, g) for _ in range(4)]
        >>> values = torch.stack([d.m.sum() for d in draws])
        >>> gs, _ = hierarchical_gradient(values, draws, s, None)
        >>> gs.shape
        torch.Size([3])
    """
    if len(draws) != values.numel():
        raise ValueError(f"{values.numel()} values for {len(draws)} draws")
    centered = _centered(values.to(s.dtype), baseline)
    count = len(draws)
    sequence_score = torch.stack([(d.m - s) / (s * (1 - s)) for d in draws])
    grad_s = (centered.unsqueeze(1) * sequence_score).mean(0)
    if pi is None:
        return grad_s, None
    grad_pi = [torch.zeros_like(p) for p in pi]
    for value, draw in zip(centered.tolist(), draws, strict=True):
        for i in draw.selected().tolist():
            p = pi[i]
            grad_pi[i] += value * (draw.z[i] - p) / (p * (1 - p))
    return grad_s, [g / count for g in grad_pi]


def project_budget(values: torch.Tensor, total: float, low: float = 0.0, high: float = 1.0,
                   iterations: int = 100) -> torch.Tensor:  # fmt: skip
    """Euclidean projection of ``values`` onto ``{x : low ≤ x ≤ high, Σ x = total}``.

    The projection is ``clamp(values − τ, low, high)`` with the shift ``τ`` that meets the sum,
    found by bisection (the clamped sum is monotone in ``τ``) to float64 precision.

    Raises:
        ValueError: when ``total`` is outside ``[n·low, n·high]`` (no feasible point).
    """
    n = values.numel()
    if not n * low - 1e-9 <= total <= n * high + 1e-9:
        raise ValueError(f"no point in [{low}, {high}]^{n} sums to {total}")
    x = values.double()
    lo_tau, hi_tau = float(x.min()) - high, float(x.max()) - low
    for _ in range(iterations):
        tau = 0.5 * (lo_tau + hi_tau)
        if float((x - tau).clamp(low, high).sum()) > total:
            lo_tau = tau
        else:
            hi_tau = tau
    return (x - 0.5 * (lo_tau + hi_tau)).clamp(low, high).to(values.dtype)
