"""Rényi-DP accounting of the Poisson-subsampled Gaussian mechanism (DP-SGD).

One DP-SGD step samples each example with probability q (Poisson sampling) and releases the sum
of clipped gradients plus N(0, σ²C²). Its RDP at order α is ε(α) = log(A_α)/(α − 1) with
(Mironov, Talwar & Zhang 2019, "Rényi Differential Privacy of the Sampled Gaussian Mechanism"):

* integer α: A_α = Σ_{k=0}^{α} C(α,k) (1−q)^{α−k} q^k exp((k² − k) / (2σ²));
* fractional α: A_α = A₀ + A₁ with z₀ = σ² log(1/q − 1) + 1/2 and the series over i ≥ 0

  A₀ = Σ_i C(α,i) q^i (1−q)^{α−i} exp((i² − i)/(2σ²)) · erfc((i − z₀)/(√2σ)) / 2,
  A₁ = Σ_i C(α,i) q^{α−i} (1−q)^i exp(((α−i)² − (α−i))/(2σ²)) · erfc((z₀ − (α−i))/(√2σ)) / 2,

  with generalised (possibly negative) binomial coefficients, summed in log space until the
  terms vanish.

RDP composes additively over steps. The conversion to (ε, δ)-DP is Balle et al. 2020
(Theorem 21): ε = min_α [ε_RDP(α) + log((α − 1)/α) − (log δ + log α)/(α − 1)].
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import special

DEFAULT_ORDERS: tuple[float, ...] = tuple(
    [1 + x / 10 for x in range(1, 100)] + [float(a) for a in range(12, 64)]
)
"""RDP orders α searched by default: 1.1 to 10.9 in steps of 0.1, then 12 to 63."""

# The fractional-order series stops past i = α once a term falls below exp(-30): A_α >= 1, and
# the terms then decay geometrically times a power of i, so the rest changes log A_α by ~1e-13.
_SERIES_CUTOFF = -30.0
_BLOCK = 4096


def _log_add(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    high, low = max(a, b), min(a, b)
    return high + math.log1p(math.exp(low - high))


def _log_erfc(x: np.ndarray) -> np.ndarray:
    return math.log(2.0) + special.log_ndtr(-x * math.sqrt(2.0))


def _log_a_integer(q: float, sigma: float, alpha: int) -> float:
    log_a = -math.inf
    for k in range(alpha + 1):
        log_term = (
            float(
                special.gammaln(alpha + 1) - special.gammaln(k + 1) - special.gammaln(alpha - k + 1)
            )
            + k * math.log(q)
            + (alpha - k) * math.log1p(-q)
            + (k * k - k) / (2 * sigma**2)
        )
        log_a = _log_add(log_a, log_term)
    return log_a


def _log_a_fractional(q: float, sigma: float, alpha: float) -> float:
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    total, start = None, 0
    while True:  # blocks of terms, vectorised: for small q the series is long
        i = np.arange(start, start + _BLOCK, dtype=np.float64)
        j = alpha - i
        coef = special.binom(alpha, i)
        with np.errstate(divide="ignore"):
            log_coef = np.log(np.abs(coef))
        log_s0 = (
            log_coef
            + i * math.log(q)
            + j * math.log1p(-q)
            + (i * i - i) / (2 * sigma**2)
            + math.log(0.5)
            + _log_erfc((i - z0) / (math.sqrt(2) * sigma))
        )
        log_s1 = (
            log_coef
            + j * math.log(q)
            + i * math.log1p(-q)
            + (j * j - j) / (2 * sigma**2)
            + math.log(0.5)
            + _log_erfc((z0 - j) / (math.sqrt(2) * sigma))
        )
        terms = np.logaddexp(log_s0, log_s1)
        signs = np.sign(coef)
        past = (i > alpha) & ((coef == 0) | (terms < _SERIES_CUTOFF))
        stop = int(np.argmax(past)) if past.any() else _BLOCK
        block = special.logsumexp(terms[:stop], b=signs[:stop], return_sign=True) if stop else None
        if block is not None:
            total = block if total is None else _signed_log_add(total, block)
        if stop < _BLOCK:
            log_value, sign = total
            if sign <= 0:
                raise ArithmeticError("the RDP series summed to a non-positive A_α")
            return float(log_value)
        start += _BLOCK


def _signed_log_add(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    value, sign = special.logsumexp([a[0], b[0]], b=[a[1], b[1]], return_sign=True)
    return float(value), float(sign)


def _check(q: float, sigma: float, steps: int) -> None:
    if not 0 <= q <= 1:
        raise ValueError(f"sample_rate must be in [0, 1], got {q}")
    if not (sigma >= 0 and math.isfinite(sigma)):
        raise ValueError(f"noise_multiplier must be finite and >= 0, got {sigma}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")


def compute_rdp(
    sample_rate: float,
    noise_multiplier: float,
    steps: int,
    orders: Sequence[float] = DEFAULT_ORDERS,
) -> np.ndarray:
    """RDP ε(α) of ``steps`` Poisson-subsampled Gaussian steps at each order.

    Args:
        sample_rate: q in [0, 1].
        noise_multiplier: σ >= 0 (0 gives infinite ε).
        steps: number of steps (RDP adds up).
        orders: α values > 1.

    Returns:
        ``(len(orders),)`` float64 array.
    """
    _check(sample_rate, noise_multiplier, steps)
    if any(not alpha > 1 for alpha in orders):
        raise ValueError("RDP orders must all be > 1")
    out = np.zeros(len(orders))
    for index, alpha in enumerate(orders):
        if sample_rate == 0 or steps == 0:
            rdp = 0.0
        elif noise_multiplier == 0:
            rdp = math.inf
        elif sample_rate == 1:
            rdp = alpha / (2 * noise_multiplier**2)
        elif float(alpha).is_integer():
            rdp = _log_a_integer(sample_rate, noise_multiplier, int(alpha)) / (alpha - 1)
        else:
            rdp = _log_a_fractional(sample_rate, noise_multiplier, alpha) / (alpha - 1)
        out[index] = rdp * steps
    return out


def rdp_to_epsilon(
    rdp: Sequence[float], delta: float, orders: Sequence[float] = DEFAULT_ORDERS
) -> tuple[float, float]:
    """(ε, best order) at ``delta`` from RDP values (Balle et al. 2020, Theorem 21)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    alphas = np.asarray(orders, dtype=np.float64)
    values = np.asarray(rdp, dtype=np.float64)
    if alphas.shape != values.shape:
        raise ValueError(f"{len(values)} RDP values for {len(alphas)} orders")
    with np.errstate(invalid="ignore"):
        eps = (
            values
            + np.log((alphas - 1) / alphas)
            - (math.log(delta) + np.log(alphas)) / (alphas - 1)
        )
    if np.isnan(eps).all() or np.isinf(eps).all():
        return math.inf, math.nan
    best = int(np.nanargmin(eps))
    return max(0.0, float(eps[best])), float(alphas[best])


def get_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    orders: Sequence[float] = DEFAULT_ORDERS,
) -> float:
    """ε after ``steps`` DP-SGD steps with noise σ and Poisson rate q, at ``delta``."""
    rdp = compute_rdp(sample_rate, noise_multiplier, steps, orders)
    return rdp_to_epsilon(rdp, delta, orders)[0]


def get_noise_multiplier(
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    steps: int,
    *,
    orders: Sequence[float] = DEFAULT_ORDERS,
    tolerance: float = 0.005,
) -> float:
    """The smallest σ (to within ``tolerance`` relative in ε) such that ``steps`` steps at rate
    ``sample_rate`` spend at most ``target_epsilon`` at ``target_delta``.

    The returned σ always satisfies ε(σ) <= target_epsilon (bisection keeps the safe end), and
    ε(σ) >= target_epsilon·(1 − tolerance) unless σ hits the search floor.

    Example:
        >>> sigma = get_noise_multiplier(8.0, 1e-5, sample_rate=0.01, steps=1000)
        >>> get_epsilon(sigma, 0.01, 1000, 1e-5) <= 8.0
        True
    """
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance}")

    def eps(sigma: float) -> float:
        return get_epsilon(sigma, sample_rate, steps, target_delta, orders)

    low, high = 0.0, 1.0
    while eps(high) > target_epsilon:
        low, high = high, 2 * high
        if high > 1e6:
            raise ValueError(
                f"no noise multiplier up to 1e6 reaches ε = {target_epsilon} at δ = "
                f"{target_delta}; raise the target or lower sample_rate/steps"
            )
    while high - low > 1e-9 * high:
        middle = (low + high) / 2
        value = eps(middle)
        if value > target_epsilon:
            low = middle
        else:
            high = middle
            if value >= target_epsilon * (1 - tolerance):
                break
    return high


class RDPAccountant:
    """Tracks the RDP of a training run step by step.

    Example:
        >>> accountant = RDPAccountant()
        >>> for _ in range(100):
        ...     accountant.step(noise_multiplier=1.0, sample_rate=0.01)
        >>> 0 < accountant.get_epsilon(delta=1e-5) < 10
        True
    """

    def __init__(self, orders: Sequence[float] = DEFAULT_ORDERS) -> None:
        self.orders = tuple(float(a) for a in orders)
        self.history: list[tuple[float, float, int]] = []  # (σ, q, steps) runs

    def step(self, noise_multiplier: float, sample_rate: float) -> None:
        """Account for one more step."""
        _check(sample_rate, noise_multiplier, 1)
        if self.history and self.history[-1][:2] == (noise_multiplier, sample_rate):
            sigma, q, steps = self.history[-1]
            self.history[-1] = (sigma, q, steps + 1)
        else:
            self.history.append((noise_multiplier, sample_rate, 1))

    @property
    def steps(self) -> int:
        return sum(steps for _, _, steps in self.history)

    def get_epsilon(self, delta: float) -> float:
        """ε spent so far at ``delta``."""
        rdp = sum(
            (compute_rdp(q, sigma, steps, self.orders) for sigma, q, steps in self.history),
            start=np.zeros(len(self.orders)),
        )
        return rdp_to_epsilon(rdp, delta, self.orders)[0]
