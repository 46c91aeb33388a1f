"""Power Lines: τ algebra, τ_opt interpolation, power-law recovery, B_crit, Pareto fronts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaling_laws import PowerLaw, fit_power_law, power_lines
from scaling_laws.power_lines import (
    SweepRecord,
    fit_batch_size_law,
    fit_critical_batch_size,
    fit_tau_law,
    optimal_weight_decay,
    optimum_by_interpolation,
    pareto_front,
    tau_opt_per_setting,
    timescale,
    weight_decay_for_timescale,
)

positive = st.floats(1e-6, 1e9, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(positive, positive, positive, positive)
def test_tau_round_trips(batch, lr, wd, tokens):
    tau = timescale(batch, lr, wd, tokens)
    assert weight_decay_for_timescale(tau, batch, lr, tokens) == pytest.approx(wd, rel=1e-12)
    # τ is the AdamW timescale 1/(ηλ) in iterations over the S = D/B steps of the run
    assert tau == pytest.approx((1 / (lr * wd)) / (tokens / batch), rel=1e-12)


def test_parabolic_interpolation_is_exact_for_a_parabola_in_log_x():
    x = np.geomspace(0.01, 10, 7)
    loss = 3.0 + 0.2 * (np.log(x) - np.log(0.37)) ** 2
    best, interior = optimum_by_interpolation(x, loss)
    assert interior
    assert best == pytest.approx(0.37, rel=1e-9)
    edge, interior = optimum_by_interpolation(x, np.arange(7.0))
    assert not interior
    assert edge == pytest.approx(0.01)


def _sweep(c=0.8, m=-0.52, curvature=0.05):
    """Synthetic sweep whose loss is a parabola in log τ around τ_opt = c (D/N)^m."""
    records = []
    for n in (1e7, 4e7):
        for ratio in (5, 20, 80, 320):
            d, b, lr = ratio * n, 2.0**18, 2e-3
            tau_opt = c * ratio**m
            for tau in tau_opt * np.geomspace(0.1, 10, 9) * 1.13:  # grid not centred on τ_opt
                wd = float(weight_decay_for_timescale(tau, b, lr, d))
                loss = 2.5 + curvature * np.log(tau / tau_opt) ** 2
                records.append(SweepRecord(n, d, b, lr, wd, loss))
    return records


def test_tau_law_recovers_the_exponent():
    law = fit_tau_law(_sweep(), n_bootstrap=200)
    assert law.exponents[0] == pytest.approx(-0.52, abs=1e-6)
    assert law.coefficient == pytest.approx(0.8, rel=1e-6)
    lo, hi = law.exponent_intervals[0]
    assert hi - lo < 1e-9  # exact optima: every bootstrap resample gives the same line
    per = tau_opt_per_setting(_sweep())
    assert len(per) == 8
    assert all(p["interior"] for p in per)


def test_optimal_weight_decay_inverts_the_law():
    law = PowerLaw(0.8, (-0.52,))
    n, d, b, lr = 1e8, 2e9, 2.0**19, 1e-3
    wd = optimal_weight_decay(n, d, b, lr, law)
    assert timescale(b, lr, wd, d) == pytest.approx(0.8 * 20**-0.52, rel=1e-12)
    # default: the paper's exponent, τ_opt = 1 at 20 tokens per parameter
    assert timescale(b, lr, optimal_weight_decay(n, d, b, lr), d) == pytest.approx(1.0)


def test_power_law_fit_recovers_two_exponents_with_noise():
    rng = np.random.default_rng(0)
    n = rng.uniform(1e6, 1e9, 60)
    m = rng.integers(1, 9, 60).astype(float)
    y = 19.2 * n**-0.0985 * m**0.0116 * np.exp(rng.normal(0, 0.002, 60))
    law = fit_power_law(np.column_stack([n, m]), y, n_bootstrap=300)
    # 0.2% noise over 3 decades of N: the exponent's standard error is ~4e-4
    assert law.exponents[0] == pytest.approx(-0.0985, abs=2e-3)
    assert law.exponents[1] == pytest.approx(0.0116, abs=2e-3)
    assert law(1e8, 2.0) == pytest.approx(19.2 * 1e8**-0.0985 * 2**0.0116, rel=0.01)


def test_batch_size_law():
    records = []
    for n in (1e7, 3e7):
        for d in (1e9, 4e9, 1.6e10):
            b_opt = 3e3 * d**0.4
            for b in b_opt * np.geomspace(0.125, 8, 7) * 1.2:
                loss = 3.0 + 0.03 * np.log(b / b_opt) ** 2
                records.append(
                    {
                        "params": n,
                        "tokens": d,
                        "batch_size": b,
                        "lr": 1e-3,
                        "weight_decay": 0.1,
                        "loss": loss,
                    }
                )
    law = fit_batch_size_law(records, n_bootstrap=0)
    assert law.exponents[0] == pytest.approx(0.4, abs=1e-6)


def test_critical_batch_size_from_mccandlish_curves():
    # L_B(D) = E + D_c (1 + B/B*)^β D^-β exactly: then D_B(L) = D_min(L) (1 + B/B*), McCandlish's
    # relation with B_crit = B* at every target and D_min(L) = (D_c / (L − E))^(1/β)
    e, d_c, beta, b_star = 2.0, 30.0, 0.3, 2.0**15
    targets = [2.6, 2.5, 2.4, 2.3]
    d_grid = np.geomspace(1e5, 1e10, 25)
    curves = {
        b: (d_grid, e + d_c * (1 + b / b_star) ** beta * d_grid**-beta)
        for b in (2.0**12, 2.0**14, 2.0**16, 2.0**18)
    }
    law, table = fit_critical_batch_size(curves, targets, n_bootstrap=0)
    assert len(table) == len(targets)
    # the curve fits are exact up to the optimizer's tolerance (~1e-8 relative in the parameters)
    for row in table:
        assert row["b_crit"] == pytest.approx(b_star, rel=1e-4)
        assert row["d_min"] == pytest.approx((d_c / (row["target"] - e)) ** (1 / beta), rel=1e-4)
    assert law.exponents[0] == pytest.approx(0.0, abs=1e-4)


def test_pareto_front_against_brute_force():
    rng = np.random.default_rng(1)
    points = rng.random((60, 3))
    mask = pareto_front(points)
    for i, p in enumerate(points):
        dominated = any(np.all(q <= p) and np.any(q < p) for q in points)
        assert mask[i] == (not dominated)


def test_bad_inputs():
    with pytest.raises(ValueError, match="weight_decay"):
        timescale(1, 1, 0.0, 1)
    with pytest.raises(ValueError, match="positive"):
        fit_power_law([1, 2, -3], [1, 2, 3])
    with pytest.raises(ValueError, match="at least 2"):
        fit_power_law([1.0], [1.0])
    with pytest.raises(ValueError, match="two or more"):
        fit_tau_law(_sweep()[:9])
    with pytest.raises(TypeError, match="mapping"):
        SweepRecord.coerce([1, 2, 3])
    with pytest.raises(ValueError, match="objectives"):
        pareto_front(np.zeros(3))
    assert power_lines.PAPER_TAU_EXPONENT == -0.52


def test_exactly_determined_fit_reports_no_interval():
    """Two points fix a one-variable power law exactly: a bootstrap cannot measure uncertainty
    (every usable resample is the same two points), so no interval is reported rather than a
    zero-width one."""
    law = fit_power_law([2.0, 8.0], [3.0, 0.75], n_bootstrap=200)
    assert law.exponents[0] == pytest.approx(-1.0, rel=1e-12)
    assert law.coefficient_interval is None
    assert law.exponent_intervals == ()
    three = fit_power_law([2.0, 8.0, 32.0], [3.0, 0.8, 0.19], n_bootstrap=200)
    lo, hi = three.exponent_intervals[0]
    assert lo < hi  # scatter about the line gives a real interval
