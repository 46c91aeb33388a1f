"""The bar (Riemann) distribution: a PFN's predictive density as a histogram over fixed buckets.

A PFN outputs `num_bars` logits; their softmax gives each bucket's probability mass, spread
uniformly inside the bucket. The density at y is therefore `p_k / width_k` for the bucket k that
holds y, the CDF is piecewise linear, and the quantile function (`icdf`) is linear inside a bucket
(LC-PFN's `BarDistribution`, which FT-PFN and CFBO reuse).

Borders: equal-width buckets on [0, 1] (`BarDistribution.uniform`). LC-PFN and the CFBO authors'
training script place borders at quantiles of sampled values; their CFBO inference code builds
equal-width borders on (0, 1). We keep equal width because the prior's values spread over all of
[0, 1] (start and asymptote are uniform draws), so quantile borders would be nearly equal-width
anyway, and equal width makes a model's borders a function of `num_bars` alone (nothing extra to
save or to get out of sync). Any sorted borders can still be passed to the constructor.

Shapes: `logits` is `(..., K)` with K = `num_bars`; values and results have the batch shape `...`
(one value per distribution) or `(..., M)` (M values per distribution: `icdf`, `sample`).

Example:
    >>> import torch
    >>> bar = BarDistribution.uniform(4)
    >>> logits = torch.zeros(2, 4)  # two uniform distributions on [0, 1]
    >>> bar.cdf(logits, torch.tensor([0.25, 0.5]))
    tensor([0.2500, 0.5000])
    >>> bar.icdf(logits, torch.tensor([[0.1, 0.9]]))
    tensor([[0.1000, 0.9000],
            [0.1000, 0.9000]])
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["BarDistribution"]


class BarDistribution:
    """A piecewise-uniform density on `[borders[0], borders[-1]]` with one bucket per logit.

    Args:
        borders: (K + 1,) strictly increasing finite bucket borders.
    """

    def __init__(self, borders: torch.Tensor) -> None:
        borders = torch.as_tensor(borders)
        if not torch.is_floating_point(borders):
            borders = borders.to(torch.float32)
        if borders.ndim != 1 or borders.numel() < 2:
            raise ValueError(
                f"borders must be 1-D with at least 2 entries, got {tuple(borders.shape)}"
            )
        if not torch.isfinite(borders).all():
            raise ValueError("borders must be finite")
        if not (borders[1:] > borders[:-1]).all():
            raise ValueError("borders must be strictly increasing")
        self.borders = borders

    @classmethod
    def uniform(cls, num_bars: int, low: float = 0.0, high: float = 1.0) -> BarDistribution:
        """`num_bars` equal-width buckets on [low, high] (float64 borders, cast per call)."""
        if num_bars < 1:
            raise ValueError(f"num_bars must be >= 1, got {num_bars}")
        if not high > low:
            raise ValueError(f"need low < high, got [{low}, {high}]")
        return cls(torch.linspace(low, high, num_bars + 1, dtype=torch.float64))

    @property
    def num_bars(self) -> int:
        return self.borders.numel() - 1

    @property
    def low(self) -> float:
        return float(self.borders[0])

    @property
    def high(self) -> float:
        return float(self.borders[-1])

    def _grid(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(left borders (K,), widths (K,)) in `like`'s dtype and device."""
        borders = self.borders.to(dtype=like.dtype, device=like.device)
        return borders[:-1], borders[1:] - borders[:-1]

    def _check_logits(self, logits: torch.Tensor) -> None:
        if not isinstance(logits, torch.Tensor) or not torch.is_floating_point(logits):
            raise TypeError("logits must be a floating-point tensor")
        if logits.ndim < 1 or logits.shape[-1] != self.num_bars:
            raise ValueError(f"logits must be (..., {self.num_bars}), got {tuple(logits.shape)}")

    def _check_values(self, y: torch.Tensor) -> None:
        if not torch.isfinite(y).all():
            raise ValueError("values must be finite")
        if (y < self.low).any() or (y > self.high).any():
            raise ValueError(
                f"values must lie in the support [{self.low}, {self.high}], got range "
                f"[{float(y.min())}, {float(y.max())}]"
            )

    def bucket_index(self, y: torch.Tensor) -> torch.Tensor:
        """(...) int64 index of the bucket holding each y; the top border belongs to the last."""
        borders = self.borders.to(dtype=y.dtype, device=y.device)
        index = torch.searchsorted(borders, y.contiguous(), right=True) - 1
        return index.clamp(0, self.num_bars - 1)

    def _cumulative(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mass below each bucket, mass up to and including it), both (..., K)."""
        upper = torch.softmax(logits, dim=-1).cumsum(dim=-1)
        lower = torch.cat([torch.zeros_like(upper[..., :1]), upper[..., :-1]], dim=-1)
        return lower, upper

    def log_prob(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """(...) log density at y: log softmax of y's bucket minus log of its width.

        `logits` (..., K); `y` broadcastable to `logits.shape[:-1]`, inside the support.
        """
        self._check_logits(logits)
        y = torch.as_tensor(y, dtype=logits.dtype, device=logits.device)
        self._check_values(y)
        y = y.expand(logits.shape[:-1])
        index = self.bucket_index(y)
        _, widths = self._grid(logits)
        log_mass = torch.log_softmax(logits, dim=-1).gather(-1, index.unsqueeze(-1)).squeeze(-1)
        return log_mass - torch.log(widths[index])

    def cdf(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """(...) P(Y ≤ y), linear inside each bucket."""
        self._check_logits(logits)
        y = torch.as_tensor(y, dtype=logits.dtype, device=logits.device)
        self._check_values(y)
        y = y.expand(logits.shape[:-1])
        index = self.bucket_index(y).unsqueeze(-1)
        lower, upper = self._cumulative(logits)
        left, widths = self._grid(logits)
        fraction = ((y.unsqueeze(-1) - left[index]) / widths[index]).clamp(0.0, 1.0)
        below, mass = lower.gather(-1, index), (upper - lower).gather(-1, index)
        return (below + mass * fraction).squeeze(-1)

    def icdf(self, logits: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """(..., M) the value with probability `q` below it, linear inside a bucket.

        `logits` (..., K); `q` (..., M) levels in [0, 1] whose batch shape broadcasts with
        `logits.shape[:-1]` (pass `q` of shape (M,) for the same M levels everywhere). The inverse
        of `cdf` wherever the density is positive.
        """
        self._check_logits(logits)
        q = torch.as_tensor(q, dtype=logits.dtype, device=logits.device)
        if q.ndim == 0:
            raise ValueError("q must have a last dimension of levels, e.g. shape (M,)")
        if not torch.isfinite(q).all() or (q < 0).any() or (q > 1).any():
            raise ValueError("quantile levels q must lie in [0, 1]")
        try:  # numpy's: torch.broadcast_shapes imports torch._refs (seconds) on first use
            batch = np.broadcast_shapes(tuple(logits.shape[:-1]), tuple(q.shape[:-1]))
        except ValueError:
            raise ValueError(
                f"q's batch shape {tuple(q.shape[:-1])} does not broadcast with the logits' "
                f"{tuple(logits.shape[:-1])}"
            ) from None
        lower, upper = self._cumulative(logits)
        lower = lower.expand(*batch, self.num_bars)
        upper = upper.expand(*batch, self.num_bars).contiguous()
        q = q.expand(*batch, q.shape[-1]).contiguous()
        # first bucket whose cumulative mass reaches q; rounding can leave the total just below 1
        index = torch.searchsorted(upper, q).clamp(max=self.num_bars - 1)
        below = lower.gather(-1, index)
        mass = (upper.gather(-1, index) - below).clamp_min(torch.finfo(q.dtype).tiny)
        fraction = ((q - below) / mass).clamp(0.0, 1.0)
        left, widths = self._grid(logits)
        return left[index] + widths[index] * fraction

    def mean(self, logits: torch.Tensor) -> torch.Tensor:
        """(...) the expected value: bucket probabilities times bucket centres."""
        self._check_logits(logits)
        left, widths = self._grid(logits)
        return torch.softmax(logits, dim=-1) @ (left + widths / 2)

    def sample(
        self, logits: torch.Tensor, num_samples: int, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """(..., num_samples) independent draws: a bucket by its mass, then uniform inside it.

        `generator` must live on `logits`' device.
        """
        self._check_logits(logits)
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        probs = torch.softmax(logits.reshape(-1, self.num_bars), dim=-1)
        index = torch.multinomial(probs, num_samples, replacement=True, generator=generator)
        left, widths = self._grid(logits)
        offset = torch.rand(
            index.shape, generator=generator, dtype=logits.dtype, device=logits.device
        )
        values = left[index] + widths[index] * offset
        return values.reshape(*logits.shape[:-1], num_samples)
