"""Power Lines (Bergsma et al., NeurIPS 2025): scaling laws for weight decay and batch size.

Units: ``batch_size`` B and ``tokens`` D are both counted in **tokens** (a batch of 256 sequences
of 2048 tokens is B = 524,288), so D/B is the number of optimizer steps S. ``lr`` is η and
``weight_decay`` is AdamW's decoupled λ (``p ← p − η λ p``), so

    τ = B / (η · λ · D) = (1 / (η λ)) / S,

the AdamW timescale ``1/(ηλ)`` in iterations as a fraction of the run. The paper's law:
``τ_opt = c · (D/N)^m`` with m ≈ −0.52, hence ``λ_opt = B / (η · D · τ_opt(D/N))``.

Example:
    >>> from scaling_laws import power_lines
    >>> tau = power_lines.timescale(batch_size=2**19, lr=1e-3, weight_decay=0.1, tokens=2e10)
    >>> round(float(power_lines.weight_decay_for_timescale(tau, 2**19, 1e-3, 2e10)), 6)
    0.1
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from scaling_laws.power_law import PowerLaw, fit_power_law

__all__ = [
    "PAPER_TAU_EXPONENT",
    "SweepRecord",
    "fit_batch_size_law",
    "fit_critical_batch_size",
    "fit_tau_law",
    "optimal_weight_decay",
    "optimum_by_interpolation",
    "pareto_front",
    "tau_opt_per_setting",
    "timescale",
    "weight_decay_for_timescale",
]

logger = logging.getLogger(__name__)

PAPER_TAU_EXPONENT = -0.52  # bootstrap 10-90%: -0.529 .. -0.507


def _positive(**values: float | np.ndarray) -> None:
    for name, value in values.items():
        array = np.asarray(value, dtype=np.float64)
        if not np.all(np.isfinite(array)) or np.any(array <= 0):
            raise ValueError(f"{name} must be positive and finite, got {value!r}")


def timescale(batch_size, lr, weight_decay, tokens):
    """AdamW timescale τ = B / (η λ D) (B and D in tokens). Broadcasts over arrays."""
    _positive(batch_size=batch_size, lr=lr, weight_decay=weight_decay, tokens=tokens)
    return np.asarray(batch_size, float) / (
        np.asarray(lr, float) * np.asarray(weight_decay, float) * np.asarray(tokens, float)
    )


def weight_decay_for_timescale(tau, batch_size, lr, tokens):
    """The λ that gives timescale ``tau``: λ = B / (η D τ) (inverse of :func:`timescale`)."""
    _positive(tau=tau, batch_size=batch_size, lr=lr, tokens=tokens)
    return np.asarray(batch_size, float) / (
        np.asarray(lr, float) * np.asarray(tokens, float) * np.asarray(tau, float)
    )


@dataclass(frozen=True)
class SweepRecord:
    """One finished run: parameters N, tokens D, batch B (tokens), lr η, weight decay λ, loss."""

    params: float
    tokens: float
    batch_size: float
    lr: float
    weight_decay: float
    loss: float

    def __post_init__(self) -> None:
        _positive(
            params=self.params,
            tokens=self.tokens,
            batch_size=self.batch_size,
            lr=self.lr,
            weight_decay=self.weight_decay,
            loss=self.loss,
        )

    @property
    def tau(self) -> float:
        return float(timescale(self.batch_size, self.lr, self.weight_decay, self.tokens))

    @classmethod
    def coerce(cls, record: SweepRecord | Mapping) -> SweepRecord:
        if isinstance(record, cls):
            return record
        if not isinstance(record, Mapping):
            raise TypeError(f"a sweep record is a SweepRecord or a mapping, got {type(record)}")
        return cls(**{k: float(v) for k, v in record.items()})


def optimum_by_interpolation(x: Sequence[float], loss: Sequence[float]) -> tuple[float, bool]:
    """Minimiser of ``loss`` over ``log x``: a parabola through the best point and its two
    neighbours (in log x), clamped to their range.

    Returns ``(x_opt, interior)``; ``interior`` is False when the best point is at the edge of the
    sweep (then ``x_opt`` is that edge value: the optimum may lie outside the sweep).
    """
    x = np.asarray(x, float)
    loss = np.asarray(loss, float)
    if x.shape != loss.shape or x.ndim != 1 or len(x) < 3:
        raise ValueError("need at least three (x, loss) points of equal length")
    _positive(x=x)
    if not np.all(np.isfinite(loss)):
        raise ValueError("loss must be finite")
    order = np.argsort(x)
    u, loss = np.log(x[order]), loss[order]
    if len(np.unique(u)) != len(u):
        raise ValueError("x values must be distinct")
    best = int(np.argmin(loss))
    if best in (0, len(u) - 1):
        return float(np.exp(u[best])), False
    uu, ll = u[best - 1 : best + 2], loss[best - 1 : best + 2]
    a, b, _ = np.polyfit(uu, ll, 2)
    vertex = -b / (2 * a) if a > 0 else uu[1]
    return float(np.exp(np.clip(vertex, uu[0], uu[2]))), True


def tau_opt_per_setting(records: Iterable[SweepRecord | Mapping]) -> list[dict]:
    """τ_opt per (N, D, B, η) group, interpolated over that group's λ sweep.

    Returns one dict per group with ``params, tokens, batch_size, lr, tau_opt, interior,
    tokens_per_param`` (groups with fewer than three λ values are skipped).
    """
    groups: dict[tuple, list[SweepRecord]] = defaultdict(list)
    for record in map(SweepRecord.coerce, records):
        groups[(record.params, record.tokens, record.batch_size, record.lr)].append(record)
    out = []
    for (n, d, b, lr), group in sorted(groups.items()):
        if len({r.weight_decay for r in group}) < 3:
            logger.warning("skipping N=%g D=%g B=%g: fewer than 3 weight decays", n, d, b)
            continue
        tau, interior = optimum_by_interpolation([r.tau for r in group], [r.loss for r in group])
        out.append(
            {
                "params": n,
                "tokens": d,
                "batch_size": b,
                "lr": lr,
                "tau_opt": tau,
                "interior": interior,
                "tokens_per_param": d / n,
            }
        )
    return out


def fit_tau_law(
    records: Iterable[SweepRecord | Mapping],
    *,
    n_bootstrap: int = 1000,
    interior_only: bool = True,
    seed: int = 0,
) -> PowerLaw:
    """Fit τ_opt = c · (D/N)^m over the sweep (bootstrap 10–90% intervals)."""
    optima = tau_opt_per_setting(records)
    if interior_only:
        optima = [o for o in optima if o["interior"]]
    if len(optima) < 2 or len({o["tokens_per_param"] for o in optima}) < 2:
        raise ValueError(
            "need τ_opt at two or more distinct D/N ratios with an interior optimum; widen the λ "
            f"sweep (got {len(optima)} usable settings)"
        )
    x = np.array([o["tokens_per_param"] for o in optima])
    y = np.array([o["tau_opt"] for o in optima])
    return fit_power_law(x, y, n_bootstrap=n_bootstrap, seed=seed, names=("D/N",))


def optimal_weight_decay(params, tokens, batch_size, lr, law: PowerLaw | None = None):
    """λ_opt = B / (η · D · τ_opt(D/N)); ``law`` defaults to a law with the paper's exponent
    −0.52 anchored at τ_opt = 1 at 20 tokens per parameter (the paper's reading)."""
    if law is None:
        law = PowerLaw(coefficient=20.0 ** (-PAPER_TAU_EXPONENT), exponents=(PAPER_TAU_EXPONENT,))
    _positive(params=params, tokens=tokens)
    tau = law(np.asarray(tokens, float) / np.asarray(params, float))
    return weight_decay_for_timescale(tau, batch_size, lr, tokens)


def fit_batch_size_law(
    records: Iterable[SweepRecord | Mapping], *, n_bootstrap: int = 1000, seed: int = 0
) -> PowerLaw:
    """B_opt(D) = c · D^m: per (N, D) the batch size of lowest loss (each B at its best λ, η),
    interpolated over log B, then a power law in D across all N."""
    best: dict[tuple, dict[float, float]] = defaultdict(dict)
    for r in map(SweepRecord.coerce, records):
        slot = best[(r.params, r.tokens)]
        slot[r.batch_size] = min(slot.get(r.batch_size, np.inf), r.loss)
    xs, ys = [], []
    for (_, d), by_batch in best.items():
        if len(by_batch) >= 3:
            b_opt, interior = optimum_by_interpolation(list(by_batch), list(by_batch.values()))
            if interior:
                xs.append(d)
                ys.append(b_opt)
    if len(xs) < 2:
        raise ValueError("need an interior batch-size optimum at two or more (N, D) settings")
    return fit_power_law(np.array(xs), np.array(ys), n_bootstrap=n_bootstrap, seed=seed)


def _loss_vs_data(d, e, dc, beta):
    return e + dc * d ** (-beta)


def fit_critical_batch_size(
    curves: Mapping[float, tuple[Sequence[float], Sequence[float]]],
    target_losses: Sequence[float],
    *,
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> tuple[PowerLaw, list[dict]]:
    """B_crit(D) from loss-vs-data curves at several batch sizes.

    Args:
        curves: ``{B: (D values, best losses)}``: per batch size B (tokens), the loss reached
            with D tokens (tuned over λ, η). Each is fitted with ``L_B(D) = E + D_c · D^(−β)``.
        target_losses: losses at which D_B (tokens B needs to reach it) is read off every fit.

    For each target, McCandlish's relation ``(D/D_min − 1)(S/S_min − 1) = 1`` with ``S = D/B``
    is equivalent to ``D_B = D_min · (1 + B / B_crit)``, linear in B: a least-squares line gives
    D_min and B_crit = D_min / S_min. Returns the power law B_crit = c · D_min^m and the per-target
    table (``target, d_min, s_min, b_crit``).
    """
    from scipy.optimize import curve_fit  # scipy loads on first fit, not at import

    if len(curves) < 2:
        raise ValueError("need loss-vs-data curves for at least two batch sizes")
    fits = {}
    for batch, (d, loss) in curves.items():
        d, loss = np.asarray(d, float), np.asarray(loss, float)
        _positive(batch_size=batch, tokens=d, loss=loss)
        if len(d) < 3:
            raise ValueError(f"batch size {batch}: need at least 3 points to fit E, D_c, β")
        p0 = (0.9 * loss.min(), (loss.max() - 0.9 * loss.min()) * d.min() ** 0.5, 0.5)
        params, _ = curve_fit(
            _loss_vs_data,
            d,
            loss,
            p0=p0,
            bounds=([0, 0, 1e-3], [loss.min(), np.inf, 5]),
            maxfev=20000,
        )
        fits[float(batch)] = params
    table = []
    for target in target_losses:
        batches, needed = [], []
        for batch, (e, dc, beta) in fits.items():
            if target > e:
                batches.append(batch)
                needed.append((dc / (target - e)) ** (1.0 / beta))
        if len(batches) < 2:
            continue
        slope, intercept = np.polyfit(batches, needed, 1)
        if intercept <= 0 or slope <= 0:
            logger.warning("target %.4g: D_B is not increasing in B; skipped", target)
            continue
        b_crit = intercept / slope
        table.append(
            {
                "target": float(target),
                "d_min": float(intercept),
                "s_min": float(intercept / b_crit),
                "b_crit": float(b_crit),
            }
        )
    if len(table) < 2:
        raise ValueError("fewer than two target losses gave a valid critical batch size")
    law = fit_power_law(
        np.array([t["d_min"] for t in table]),
        np.array([t["b_crit"] for t in table]),
        n_bootstrap=n_bootstrap,
        seed=seed,
        names=("D",),
    )
    return law, table


def pareto_front(objectives: np.ndarray) -> np.ndarray:
    """Boolean mask of the non-dominated rows of ``objectives`` ``(n, k)`` (all minimised).

    Typical columns for choosing (N, D, B): predicted loss, training time (steps S = D/B, or
    S·step time) and compute (6·N·D FLOPs). A row is dominated if another row is no worse in every
    column and strictly better in one.
    """
    values = np.asarray(objectives, float)
    if values.ndim != 2 or len(values) == 0:
        raise ValueError(f"objectives must be a non-empty (n, k) array, got {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError("objectives must be finite")
    no_worse = np.all(values[:, None, :] <= values[None, :, :], axis=2)
    better = np.any(values[:, None, :] < values[None, :, :], axis=2)
    dominated = np.any(no_worse & better, axis=0)
    return ~dominated
