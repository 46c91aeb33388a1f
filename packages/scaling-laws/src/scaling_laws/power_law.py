"""Power laws ``y = A · x1^e1 · x2^e2 ...`` fitted by least squares in log space, with bootstrap.

Used for τ_opt(D/N), B_opt(D), B_crit(D) (Power Lines) and the DiLoCo laws f(N) = A·N^α and
f(N, M) = A·N^α·M^β. Taking logs makes the model linear, ``log y = log A + Σ e_k log x_k``, so the
fit is an ordinary least-squares solve (what the papers do for these laws); the bootstrap resamples
points with replacement and reports percentile intervals (10–90% by default, as Power Lines does).

Example:
    >>> import numpy as np
    >>> from scaling_laws import fit_power_law
    >>> n = np.array([1e6, 1e7, 1e8, 1e9])
    >>> law = fit_power_law(n, 18.0 * n**-0.095, n_bootstrap=0)
    >>> round(law.coefficient, 3), round(law.exponents[0], 4)
    (18.0, -0.095)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

__all__ = ["PowerLaw", "fit_power_law"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PowerLaw:
    """``y = coefficient · Π_k x_k ** exponents[k]``.

    Attributes:
        coefficient: A (> 0).
        exponents: one exponent per input variable.
        coefficient_interval: bootstrap percentile interval of A (``None`` without bootstrap).
        exponent_intervals: one interval per exponent (empty without bootstrap).
        names: labels of the variables (for printing).
    """

    coefficient: float
    exponents: tuple[float, ...]
    coefficient_interval: tuple[float, float] | None = None
    exponent_intervals: tuple[tuple[float, float], ...] = field(default_factory=tuple)
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not np.isfinite(self.coefficient) or self.coefficient <= 0:
            raise ValueError(f"coefficient must be positive and finite, got {self.coefficient}")
        if not self.exponents:
            raise ValueError("a power law needs at least one exponent")

    def __call__(self, *x: float | np.ndarray) -> np.ndarray:
        """Evaluate at ``x1, x2, ...`` (one argument per variable, broadcast together)."""
        if len(x) != len(self.exponents):
            raise ValueError(f"expected {len(self.exponents)} variables, got {len(x)}")
        out = np.asarray(self.coefficient, dtype=np.float64)
        for value, exponent in zip(x, self.exponents, strict=True):
            value = np.asarray(value, dtype=np.float64)
            if np.any(value <= 0):
                raise ValueError("power-law inputs must be positive")
            out = out * value**exponent
        return out

    def to_dict(self) -> dict:
        return {
            "coefficient": self.coefficient,
            "exponents": list(self.exponents),
            "coefficient_interval": self.coefficient_interval,
            "exponent_intervals": [list(i) for i in self.exponent_intervals],
            "names": list(self.names),
        }


def _design(x: np.ndarray) -> np.ndarray:
    return np.column_stack([np.ones(len(x)), np.log(x)])


def _solve(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    theta, *_ = np.linalg.lstsq(_design(x), np.log(y), rcond=None)
    return theta


def fit_power_law(
    x: np.ndarray,
    y: np.ndarray,
    *,
    n_bootstrap: int = 1000,
    interval: tuple[float, float] = (0.1, 0.9),
    seed: int = 0,
    names: tuple[str, ...] = (),
) -> PowerLaw:
    """Fit ``y = A · Π x_k^e_k`` by least squares on ``log y``.

    Args:
        x: ``(n,)`` for one variable or ``(n, k)`` for k variables, all positive.
        y: ``(n,)`` positive targets.
        n_bootstrap: resamples of the points for the intervals (0: no intervals).
        interval: lower and upper percentiles (fractions) of the bootstrap distribution.
        seed: seed of the bootstrap resampling.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or y.ndim != 1 or len(x) != len(y):
        raise ValueError(f"x must be (n,) or (n, k) and y (n,); got {x.shape} and {y.shape}")
    k = x.shape[1]
    if len(y) < k + 1:
        raise ValueError(f"need at least {k + 1} points to fit {k + 1} parameters, got {len(y)}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("x and y must be finite (no NaN or inf)")
    if np.any(x <= 0) or np.any(y <= 0):
        raise ValueError("power-law fits need positive x and y (they are fitted in log space)")
    if not 0 <= interval[0] < interval[1] <= 1:
        raise ValueError(f"interval must be two fractions lo < hi in [0, 1], got {interval}")
    theta = _solve(x, y)
    coefficient_interval, exponent_intervals = None, ()
    if n_bootstrap and len(y) == k + 1:
        # an exactly determined fit: every usable resample is the same points, so the percentile
        # interval would have zero width and look like certainty; report none instead
        logger.warning("%d points for %d parameters: no bootstrap intervals", len(y), k + 1)
    elif n_bootstrap:
        rng = np.random.default_rng(seed)
        samples = []
        for _ in range(n_bootstrap):
            pick = rng.integers(0, len(y), len(y))
            if np.linalg.matrix_rank(_design(x[pick])) < k + 1:
                continue  # a resample without spread in some variable has no unique fit
            samples.append(_solve(x[pick], y[pick]))
        if samples:
            lo, hi = np.quantile(np.array(samples), interval, axis=0)
            coefficient_interval = (float(np.exp(lo[0])), float(np.exp(hi[0])))
            exponent_intervals = tuple(
                (float(a), float(b)) for a, b in zip(lo[1:], hi[1:], strict=False)
            )
    return PowerLaw(
        coefficient=float(np.exp(theta[0])),
        exponents=tuple(float(e) for e in theta[1:]),
        coefficient_interval=coefficient_interval,
        exponent_intervals=exponent_intervals,
        names=tuple(names),
    )
