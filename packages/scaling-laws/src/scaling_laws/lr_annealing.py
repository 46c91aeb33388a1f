"""The scaling law with learning-rate annealing (Tissue et al., NeurIPS 2025).

``L(s) = L0 + A · S1(s)^(−α) − C · S2(s)`` where, for a per-step schedule ``η_1 .. η_T``,

* ``S1(s) = Σ_{i≤s} η_i`` is the forward area,
* ``S2(s) = Σ_{i≤s} m_i`` with ``m_i = λ · m_{i−1} + (η_{i−1} − η_i)`` is the annealing area in
  its momentum form (``λ`` = ``decay``, 0.999 by default; ``λ = 0`` gives ``S2 = η_0 − η_s``).

``η_0`` is the peak lr: the lr at the end of the warmup (``lrs[warmup_steps]``); warmup steps count
in S1 but not in S2 (their lr rises, which is not annealing). The four parameters are fitted on one
or more full curves (every observed step counts) with a Huber loss (δ = 1e-3) on log-loss
residuals, multi-start L-BFGS-B within bounds; the starts come from exact linear least squares in
(L0, A, C) on a grid of α. Parameter uncertainties come from a bootstrap over observations.

Example:
    >>> import numpy as np
    >>> from scaling_laws import LRAnnealingLaw, fit, schedules
    >>> truth = LRAnnealingLaw(L0=2.7, A=0.45, alpha=0.5, C=0.4)
    >>> lrs = schedules.cosine(2000, 2e-3, warmup_steps=100)
    >>> steps = np.arange(10, 2001, 10)
    >>> law = fit([(lrs, steps, truth.predict(lrs, warmup_steps=100)[steps - 1], 100)])
    >>> round(law.L0, 2), round(law.alpha, 2)
    (2.7, 0.5)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from scaling_laws import schedules

__all__ = [
    "AnnealingCurve",
    "LRAnnealingLaw",
    "areas",
    "best_wsd_fraction",
    "compare_schedules",
    "fit",
    "relative_error",
    "relative_errors",
]

logger = logging.getLogger(__name__)

PARAMETERS = ("L0", "A", "alpha", "C")
# |S2| below this fraction of the peak lr is rounding, not annealing: a constant schedule has
# S2 = 0 exactly, and one step of a decay to even 1e-6 of the peak lr is far above it
ANNEALING_AREA_FLOOR = 1e-9


def areas(
    lrs: Sequence[float] | np.ndarray, decay: float = 0.999, *, warmup_steps: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Forward area S1 and annealing area S2 after each step.

    Args:
        lrs: ``(T,)`` per-step learning rates (``lrs[i]`` is used by step ``i + 1``).
        decay: λ in ``m_i = λ m_{i−1} + (η_{i−1} − η_i)``, in [0, 1).
        warmup_steps: leading steps excluded from S2 (η_0 is the lr at step ``warmup_steps+1``).

    Returns:
        ``(S1, S2)``, float64 ``(T,)`` each; entry ``s − 1`` holds the areas after ``s`` steps.
    """
    eta = schedules.from_array(lrs)
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"decay must be in [0, 1), got {decay!r}")
    if not 0 <= warmup_steps < len(eta):
        raise ValueError(f"warmup_steps must be in [0, {len(eta)}), got {warmup_steps}")
    s1 = np.cumsum(eta)
    drops = np.zeros_like(eta)
    drops[warmup_steps + 1 :] = eta[warmup_steps:-1] - eta[warmup_steps + 1 :]
    # m_i = λ m_{i-1} + drop_i: a first-order recursive filter. lfilter (direct form II
    # transposed with b = [1], a = [1, -λ]) evaluates exactly drop_i + λ·m_{i-1} per step, the
    # same floating-point operations as the plain loop, in C
    from scipy.signal import lfilter

    momentum = lfilter([1.0], [1.0, -decay], drops)
    return s1, np.cumsum(momentum)


@dataclass(frozen=True)
class AnnealingCurve:
    """One training curve: the full schedule and the losses observed at some steps.

    Attributes:
        lrs: ``(T,)`` per-step learning rates of the whole run.
        steps: ``(n,)`` 1-based step indices (``1 ≤ step ≤ T``) at which losses were measured.
        losses: ``(n,)`` positive finite losses at those steps.
        warmup_steps: warmup length of the schedule (excluded from S2).
    """

    lrs: np.ndarray
    steps: np.ndarray
    losses: np.ndarray
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        lrs = schedules.from_array(self.lrs)
        steps = np.asarray(self.steps)
        losses = np.asarray(self.losses, dtype=np.float64)
        if steps.ndim != 1 or losses.ndim != 1 or len(steps) != len(losses):
            raise ValueError(
                f"steps and losses must be 1-D of equal length, got {steps.shape}, {losses.shape}"
            )
        if len(steps) == 0:
            raise ValueError("a curve needs at least one observed loss")
        if not np.all(np.isfinite(losses)) or np.any(losses <= 0):
            raise ValueError("losses must be finite and positive (found NaN, inf or <= 0)")
        if not np.issubdtype(steps.dtype, np.integer):
            if not np.all(steps == np.round(steps)):
                raise ValueError("steps must be integers (1-based step indices)")
            steps = steps.astype(np.int64)
        if steps.min() < 1 or steps.max() > len(lrs):
            raise ValueError(f"steps must lie in [1, len(lrs)={len(lrs)}], got {steps.min()}..")
        if not 0 <= self.warmup_steps < len(lrs):
            raise ValueError(f"warmup_steps must be in [0, {len(lrs)}), got {self.warmup_steps}")
        object.__setattr__(self, "lrs", lrs)
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "losses", losses)

    @classmethod
    def coerce(cls, curve: AnnealingCurve | Sequence) -> AnnealingCurve:
        """Accept an ``AnnealingCurve`` or a ``(lrs, steps, losses[, warmup_steps])`` tuple."""
        if isinstance(curve, cls):
            return curve
        if not isinstance(curve, Sequence) or len(curve) not in (3, 4):
            raise TypeError("a curve is an AnnealingCurve or (lrs, steps, losses[, warmup_steps])")
        return cls(*curve)


@dataclass(frozen=True)
class LRAnnealingLaw:
    """``L(s) = L0 + A · S1^(−alpha) − C · S2`` with S2's momentum ``decay``.

    ``intervals`` maps parameter names to bootstrap (lo, hi) percentiles when fitted with
    ``n_bootstrap > 0``.
    """

    L0: float
    A: float
    alpha: float
    C: float
    decay: float = 0.999
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in PARAMETERS:
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite, got {getattr(self, name)}")
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {self.decay}")

    def predict(self, lrs: Sequence[float] | np.ndarray, *, warmup_steps: int = 0) -> np.ndarray:
        """Predicted loss after every step of the schedule ``lrs``: ``(T,)`` float64."""
        s1, s2 = areas(lrs, self.decay, warmup_steps=warmup_steps)
        if np.any(s1 <= 0):
            raise ValueError("the forward area must be positive at every step (lrs[0] > 0)")
        return self.L0 + self.A * s1 ** (-self.alpha) - self.C * s2

    def to_dict(self) -> dict:
        out = {name: getattr(self, name) for name in (*PARAMETERS, "decay")}
        out["intervals"] = {k: list(v) for k, v in self.intervals.items()}
        return out


def _huber(r: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Huber loss and its derivative, elementwise."""
    small = np.abs(r) <= delta
    value = np.where(small, 0.5 * r**2, delta * (np.abs(r) - 0.5 * delta))
    return value, np.where(small, r, delta * np.sign(r))


def _objective(theta, s1, log_s1, s2, log_y, delta):
    l0, a, alpha, c = theta
    power = np.exp(-alpha * log_s1)
    pred = l0 + a * power - c * s2
    if np.any(pred <= 0):
        return 1e10, np.zeros(4)
    r = np.log(pred) - log_y
    value, slope = _huber(r, delta)
    w = slope / pred
    grad = np.array([w.sum(), (w * power).sum(), -(w * a * power * log_s1).sum(), -(w * s2).sum()])
    return value.sum(), grad


def _starts(s1, s2, y, bounds, n_starts):
    """Exact least squares in (L0, A, C) for each α on a grid; the best few seed L-BFGS-B."""
    from scipy.optimize import nnls  # scipy loads on first fit, not at import

    results = []
    for alpha in np.linspace(max(bounds[2][0], 0.05), min(bounds[2][1], 2.0), 40):
        design = np.column_stack([np.ones_like(s1), s1**-alpha, -s2])
        coef, residual = nnls(design, y)
        results.append((residual, np.array([coef[0], coef[1], alpha, coef[2]])))
    results.sort(key=lambda item: item[0])
    starts = []
    for _, theta in results[:n_starts]:
        starts.append(np.clip(theta, [b[0] for b in bounds], [b[1] for b in bounds]))
    return starts


def _fit_arrays(s1, s2, y, bounds, delta, starts):
    """Best L-BFGS-B solution over ``starts`` (call inside ``_single_thread_blas``)."""
    from scipy.optimize import minimize

    args = (s1, np.log(s1), s2, np.log(y), delta)
    best = None
    for start in starts:
        result = minimize(
            _objective,
            start,
            args=args,
            jac=True,
            method="L-BFGS-B",
            bounds=bounds,
            options={"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-12},
        )
        if best is None or result.fun < best.fun:
            best = result
    return best.x


def _single_thread_blas():
    """A 4-parameter L-BFGS-B gains nothing from BLAS threads, and on busy cores their spin-waits
    made each iteration ~30x slower: hold BLAS to one thread while fitting."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def fit(
    curves: Sequence[AnnealingCurve | Sequence],
    *,
    decay: float = 0.999,
    huber_delta: float = 1e-3,
    n_starts: int = 8,
    n_bootstrap: int = 0,
    interval: tuple[float, float] = (0.05, 0.95),
    seed: int = 0,
) -> LRAnnealingLaw:
    """Fit ``L0, A, alpha, C`` on one or more curves (all observed steps pooled).

    Args:
        curves: ``AnnealingCurve`` objects or ``(lrs, steps, losses[, warmup_steps])`` tuples.
        decay: λ of the annealing momentum (held fixed, as in the paper).
        huber_delta: δ of the Huber loss on ``log(pred) − log(loss)``.
        n_starts: L-BFGS-B starts (best α-grid least-squares solutions).
        n_bootstrap: resamples of the observations for parameter intervals (0: none).
        interval: percentiles (fractions) reported as intervals.
        seed: bootstrap seed.

    Raises:
        ValueError: fewer than 4 observed losses, or no observed step with a non-zero annealing
            area (constant schedules alone cannot identify ``C``).
    """
    if isinstance(curves, AnnealingCurve) or not isinstance(curves, Sequence) or not curves:
        raise TypeError("curves must be a non-empty list of curves")
    if huber_delta <= 0 or n_starts < 1 or n_bootstrap < 0:
        raise ValueError("huber_delta must be > 0, n_starts >= 1 and n_bootstrap >= 0")
    parsed = [AnnealingCurve.coerce(c) for c in curves]
    s1_all, s2_all, y_all = [], [], []
    for curve in parsed:
        s1, s2 = areas(curve.lrs, decay, warmup_steps=curve.warmup_steps)
        s1_all.append(s1[curve.steps - 1])
        s2_all.append(s2[curve.steps - 1])
        y_all.append(curve.losses)
    s1, s2, y = (np.concatenate(a) for a in (s1_all, s2_all, y_all))
    if len(y) < 4:
        raise ValueError(f"need at least 4 observed losses to fit 4 parameters, got {len(y)}")
    if np.any(s1 <= 0):
        raise ValueError("every observed step needs a positive forward area (lrs[0] > 0)")
    if not np.any(np.abs(s2) > ANNEALING_AREA_FLOOR * max(float(c.lrs.max()) for c in parsed)):
        raise ValueError(
            "C cannot be identified: the annealing area S2 is zero at every observed step (no "
            "curve's lr decays after its warmup before its last observed loss, e.g. constant "
            "schedules only); add a curve whose lr anneals, such as a cosine run"
        )
    c_max = 10.0 * y.max() / max(np.abs(s2).max(), 1e-12)
    bounds = [(0.0, float(y.max())), (0.0, 1e3 * float(y.max())), (1e-3, 3.0), (0.0, c_max)]
    with _single_thread_blas():
        starts = _starts(s1, s2, y, bounds, n_starts)
        theta = _fit_arrays(s1, s2, y, bounds, huber_delta, starts)
        samples = []
        rng = np.random.default_rng(seed)
        for _ in range(n_bootstrap):
            pick = rng.integers(0, len(y), len(y))
            samples.append(_fit_arrays(s1[pick], s2[pick], y[pick], bounds, huber_delta, [theta]))
    law = LRAnnealingLaw(*map(float, theta), decay=decay)
    if n_bootstrap:
        lo, hi = np.quantile(np.array(samples), interval, axis=0)
        law = replace(
            law,
            intervals={
                n: (float(a), float(b)) for n, a, b in zip(PARAMETERS, lo, hi, strict=False)
            },
        )
    logger.info("fitted %s", law)
    return law


def relative_errors(law: LRAnnealingLaw, curve: AnnealingCurve | Sequence) -> np.ndarray:
    """``|predicted − observed| / observed`` at each of a curve's observed steps."""
    curve = AnnealingCurve.coerce(curve)
    predicted = law.predict(curve.lrs, warmup_steps=curve.warmup_steps)[curve.steps - 1]
    return np.abs(predicted - curve.losses) / curve.losses


def relative_error(law: LRAnnealingLaw, curve: AnnealingCurve | Sequence) -> float:
    """Mean of :func:`relative_errors` over a curve's observed steps."""
    return float(np.mean(relative_errors(law, curve)))


def compare_schedules(
    law: LRAnnealingLaw, candidates: Mapping[str, np.ndarray], *, warmup_steps: int = 0
) -> dict[str, float]:
    """Predicted final loss of each named schedule, best first."""
    finals = {
        name: float(law.predict(lrs, warmup_steps=warmup_steps)[-1])
        for name, lrs in candidates.items()
    }
    return dict(sorted(finals.items(), key=lambda item: item[1]))


def best_wsd_fraction(
    law: LRAnnealingLaw,
    total_steps: int,
    lr: float,
    *,
    warmup_steps: int = 0,
    shape: str = "linear",
    final_lr: float = 0.0,
    fractions: Sequence[float] | np.ndarray | None = None,
) -> tuple[float, dict[float, float]]:
    """The WSD decay fraction with the lowest predicted final loss for a step budget.

    Returns ``(best_fraction, {fraction: predicted final loss})`` over ``fractions``
    (default 0, 0.01, ..., 1).
    """
    grid = np.linspace(0.0, 1.0, 101) if fractions is None else np.asarray(fractions, float)
    finals = {}
    for fraction in grid:
        lrs = schedules.wsd(
            total_steps,
            lr,
            warmup_steps=warmup_steps,
            decay_fraction=float(fraction),
            shape=shape,
            final_lr=final_lr,
        )
        finals[float(fraction)] = float(law.predict(lrs, warmup_steps=warmup_steps)[-1])
    best = min(finals, key=finals.get)
    return best, finals
