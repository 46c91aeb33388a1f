"""The selection distributions ``p(x | s)`` and their score functions ``∇_s log p(x | s)``.

* :class:`BernoulliMasks` (CADS-E): one inclusion probability per example,
  ``p(m | s) = Π s_i^{m_i} (1 − s_i)^{1 − m_i}``, score ``m_i / s_i − (1 − m_i)/(1 − s_i)``.
* :class:`TruncatedGaussianRatios` (CADS-S): one sampling ratio per source, each drawn from a
  Gaussian centred at ``s_j`` with scale ``σ`` truncated to ``[0, 1]``,
  ``p(r_j | s_j) = φ((r_j − s_j)/σ) / (σ [Φ((1 − s_j)/σ) − Φ(−s_j/σ)])``; score
  ``(r_j − s_j)/σ² + (φ((1 − s_j)/σ) − φ(−s_j/σ)) / (σ Z_j)`` with ``Z_j`` the bracket. The paper
  anneals ``σ_t = 0.99^t σ_0``; its sampler figures start at ``σ_0 = 0.1``.

Both are sampled from a caller's ``torch.Generator`` (float64 internally) so runs repeat exactly.
"""

from __future__ import annotations

import math

import torch

__all__ = ["BernoulliMasks", "TruncatedGaussianRatios", "ratios_to_mask"]

_SQRT_2PI = math.sqrt(2 * math.pi)


def _check_centres(s: torch.Tensor, low_open: bool) -> None:
    if s.dim() != 1 or s.numel() == 0:
        raise ValueError(f"probabilities must be a non-empty vector (n,), got {tuple(s.shape)}")
    if not torch.isfinite(s).all():
        raise ValueError("probabilities hold NaN or infinite entries")
    bad = ((s <= 0) | (s >= 1)) if low_open else ((s < 0) | (s > 1))
    if bad.any():
        span = "strictly inside (0, 1)" if low_open else "in [0, 1]"
        raise ValueError(f"probabilities must lie {span}, got min {s.min():.3g} max {s.max():.3g}")


def _check_count(count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"the number of draws must be a positive integer, got {count!r}")


class BernoulliMasks:
    """Independent Bernoulli masks over ``n`` units (CADS-E: the units are examples)."""

    def sample(self, s: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
        """``count`` masks ``(count, n)`` of 0.0 / 1.0 in ``s``' dtype, ``P(m_i = 1) = s_i``."""
        _check_centres(s, low_open=False)
        _check_count(count)
        uniform = torch.rand((count, s.numel()), generator=generator, dtype=torch.float64)
        return (uniform < s.double().cpu()).to(s.dtype).to(s.device)

    def score(self, masks: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """``∇_s log p(m | s) = (m − s) / (s (1 − s))`` for masks ``(K, n)``."""
        _check_centres(s, low_open=True)
        if masks.dim() != 2 or masks.shape[1] != s.numel():
            raise ValueError(f"masks must be (K, {s.numel()}), got {tuple(masks.shape)}")
        return (masks - s) / (s * (1 - s))

    def log_prob(self, masks: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """``log p(m | s)``, ``(K,)``."""
        return (masks * torch.log(s) + (1 - masks) * torch.log1p(-s)).sum(-1)

    def mean(self, s: torch.Tensor) -> torch.Tensor:
        """``E[m]``, ``(n,)``: ``s`` itself."""
        _check_centres(s, low_open=False)
        return s.clone()


def _phi(z: torch.Tensor) -> torch.Tensor:
    return torch.exp(-0.5 * z * z) / _SQRT_2PI


class TruncatedGaussianRatios:
    """Sampling ratios in ``[0, 1]`` per source, truncated Gaussians of scale ``sigma``."""

    def __init__(self, sigma: float = 0.1) -> None:
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"sigma must be a positive finite number, got {sigma!r}")
        self.sigma = float(sigma)

    def sample(self, s: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
        """``count`` ratio vectors ``(count, n)`` by inverting the truncated CDF."""
        _check_centres(s, low_open=False)
        _check_count(count)
        centre = s.double().cpu()
        low = torch.special.ndtr(-centre / self.sigma)
        high = torch.special.ndtr((1 - centre) / self.sigma)
        uniform = torch.rand((count, s.numel()), generator=generator, dtype=torch.float64)
        quantile = (low + uniform * (high - low)).clamp(1e-300, 1 - 1e-16)
        ratios = (centre + self.sigma * torch.special.ndtri(quantile)).clamp(0.0, 1.0)
        return ratios.to(s.dtype).to(s.device)

    def mean(self, s: torch.Tensor) -> torch.Tensor:
        """``E[r]``, ``(n,)``: ``s + σ (φ(−s/σ) − φ((1 − s)/σ)) / Z``, which is not ``s``: the
        truncation pulls it inwards, by ``σ φ(0) / Φ(0) ≈ 0.8 σ`` at ``s = 0`` or ``1``."""
        _check_centres(s, low_open=False)
        sigma = self.sigma
        upper, lower = (1 - s) / sigma, -s / sigma
        mass = torch.special.ndtr(upper) - torch.special.ndtr(lower)
        return s + sigma * (_phi(lower) - _phi(upper)) / mass

    def log_prob(self, ratios: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """``log p(r | s)``, ``(K,)``."""
        sigma = self.sigma
        mass = torch.special.ndtr((1 - s) / sigma) - torch.special.ndtr(-s / sigma)
        z = (ratios - s) / sigma
        return (-0.5 * z * z - math.log(_SQRT_2PI * sigma) - torch.log(mass)).sum(-1)

    def score(self, ratios: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """``∇_s log p(r | s)`` for ratios ``(K, n)``, in closed form."""
        _check_centres(s, low_open=False)
        if ratios.dim() != 2 or ratios.shape[1] != s.numel():
            raise ValueError(f"ratios must be (K, {s.numel()}), got {tuple(ratios.shape)}")
        sigma = self.sigma
        upper, lower = (1 - s) / sigma, -s / sigma
        mass = torch.special.ndtr(upper) - torch.special.ndtr(lower)
        return (ratios - s) / sigma**2 + (_phi(upper) - _phi(lower)) / (sigma * mass)


def ratios_to_mask(
    ratios: torch.Tensor, sources: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """An example mask ``(N,)`` (bool) keeping ``round(r_j · n_j)`` random examples of each
    source ``j`` (``sources: (N,)`` source ids in ``0..n-1``)."""
    mask = torch.zeros(sources.numel(), dtype=torch.bool)
    for j, ratio in enumerate(ratios.tolist()):
        members = torch.nonzero(sources == j).flatten()
        keep = round(ratio * members.numel())
        if keep:
            chosen = members[torch.randperm(members.numel(), generator=generator)[:keep]]
            mask[chosen] = True
    return mask
