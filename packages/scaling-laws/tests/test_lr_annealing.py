"""LR-annealing law: areas against hand computations and closed forms, fitting recovers known
parameters, held-out prediction, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaling_laws import (
    AnnealingCurve,
    LRAnnealingLaw,
    areas,
    best_wsd_fraction,
    compare_schedules,
    fit,
    relative_error,
    relative_errors,
    schedules,
)


def test_areas_hand_computed():
    # η = [1, 1, .5, .25], λ = 0.5: drops (0, 0, .5, .25); m = (0, 0, .5, .5); S2 = (0, 0, .5, 1)
    s1, s2 = areas([1.0, 1.0, 0.5, 0.25], decay=0.5)
    np.testing.assert_allclose(s1, [1.0, 2.0, 2.5, 2.75], rtol=0, atol=0)
    np.testing.assert_allclose(s2, [0.0, 0.0, 0.5, 1.0], rtol=0, atol=1e-15)


def test_areas_match_the_recursion_written_out():
    rng = np.random.default_rng(3)
    lrs = rng.uniform(0, 1e-3, 500)
    s1, s2 = areas(lrs, decay=0.99, warmup_steps=7)
    m, total, expected = 0.0, 0.0, []
    for i in range(500):
        drop = lrs[i - 1] - lrs[i] if i > 7 else 0.0
        m = 0.99 * m + drop
        total += m
        expected.append(total)
    # the same operations in the same order: bit-identical
    np.testing.assert_array_equal(s2, expected)
    np.testing.assert_array_equal(s1, np.cumsum(lrs))


def test_constant_schedule_has_no_annealing_area():
    s1, s2 = areas(schedules.constant(100, 3e-4))
    assert np.all(s2 == 0.0)
    np.testing.assert_allclose(s1, 3e-4 * np.arange(1, 101), rtol=1e-12)


@pytest.mark.parametrize("decay", [0.0, 0.9, 0.999])
def test_single_drop_is_a_geometric_sum(decay):
    # lr drops by Δ at step k+1; after s > k steps S2 = Δ (1 − λ^(s−k)) / (1 − λ)
    k, high, low = 30, 1e-3, 2.5e-4
    lrs = np.r_[np.full(k, high), np.full(70, low)]
    _, s2 = areas(lrs, decay=decay)
    s = np.arange(1, 101)
    delta = high - low
    expected = np.where(s > k, delta * (1 - decay ** np.maximum(s - k, 0)) / (1 - decay), 0.0)
    np.testing.assert_allclose(s2, expected, rtol=1e-10, atol=1e-18)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(1e-5, 1e-2), min_size=2, max_size=50))
def test_zero_decay_gives_total_drop(lrs):
    # λ = 0: S2(s) = η_0 − η_s (telescoping sum), for any schedule
    _, s2 = areas(lrs, decay=0.0)
    np.testing.assert_allclose(s2, lrs[0] - np.asarray(lrs), rtol=0, atol=1e-15)


def test_warmup_is_excluded_from_the_annealing_area():
    lrs = schedules.cosine(200, 1e-3, warmup_steps=20)
    _, with_warmup = areas(lrs, warmup_steps=20)
    _, after = areas(lrs[20:])
    assert np.all(with_warmup[:20] == 0)
    np.testing.assert_allclose(with_warmup[20:], after, rtol=1e-12, atol=1e-18)


def test_schedules_shapes():
    lrs = schedules.wsd(100, 1.0, warmup_steps=10, decay_fraction=0.2)
    assert lrs[9] == 1.0
    assert lrs[79] == 1.0
    assert lrs[80] < 1.0
    assert lrs[-1] == 0.0
    np.testing.assert_allclose(lrs[:10], np.arange(1, 11) / 10)
    cos = schedules.cosine(100, 1.0, final_lr=0.1)  # step 50 is halfway
    assert cos[49] == pytest.approx(0.55, abs=1e-12)
    assert cos[-1] == pytest.approx(0.1)
    step = schedules.multistep(10, 1.0, milestones=(0.5, 8), gamma=0.1)
    np.testing.assert_allclose(step, [1] * 5 + [0.1] * 3 + [0.01] * 2)
    np.testing.assert_allclose(schedules.linear(4, 1.0), [0.75, 0.5, 0.25, 0.0])


TRUTH = LRAnnealingLaw(L0=2.9, A=0.5, alpha=0.55, C=0.35)
WARMUP = 50


def _noisy_curve(lrs, rng, noise=0.002):
    steps = np.arange(5, len(lrs) + 1, 5)
    clean = TRUTH.predict(lrs, warmup_steps=WARMUP)[steps - 1]
    return AnnealingCurve(lrs, steps, clean * np.exp(rng.normal(0, noise, len(steps))), WARMUP)


def test_fit_recovers_parameters_and_predicts_held_out_schedules():
    rng = np.random.default_rng(0)
    total, lr = 3000, 2e-3
    constant = _noisy_curve(schedules.constant(total, lr, warmup_steps=WARMUP), rng)
    cosine = _noisy_curve(schedules.cosine(total, lr, warmup_steps=WARMUP), rng)
    law = fit([constant, cosine], n_bootstrap=30)
    # 1200 points with 0.2% noise pin the parameters to well under 5% (bootstrap intervals here
    # are ~1%); the intervals must contain the truth
    for name in ("L0", "A", "alpha", "C"):
        assert getattr(law, name) == pytest.approx(getattr(TRUTH, name), rel=0.05), name
        lo, hi = law.intervals[name]
        assert lo <= getattr(law, name) <= hi
    for held_out in (
        schedules.wsd(total, lr, warmup_steps=WARMUP, decay_fraction=0.2),
        schedules.multistep(total, lr, warmup_steps=WARMUP),
    ):
        predicted = law.predict(held_out, warmup_steps=WARMUP)[100:]
        exact = TRUTH.predict(held_out, warmup_steps=WARMUP)[100:]
        # the paper's accuracy goal is ~1% of the loss; with 0.2% noise the fit must do 0.5%
        assert np.max(np.abs(predicted / exact - 1)) < 0.005
    # on the noisy fitted curve the error is the noise level: E|ε| = 0.8 · 0.002 for Gaussian ε
    assert relative_error(law, cosine) == pytest.approx(0.0016, abs=0.0005)


def test_schedule_helpers_agree_with_direct_prediction():
    total, lr = 2000, 1e-3
    cands = {
        "constant": schedules.constant(total, lr),
        "cosine": schedules.cosine(total, lr),
        "wsd": schedules.wsd(total, lr, decay_fraction=0.2),
    }
    ranked = compare_schedules(TRUTH, cands)
    assert list(ranked)[-1] == "constant"  # no annealing: highest final loss
    for name, value in ranked.items():
        assert value == pytest.approx(TRUTH.predict(cands[name])[-1], rel=1e-12)
    best, table = best_wsd_fraction(TRUTH, total, lr, fractions=np.linspace(0, 1, 21))
    assert table[best] == min(table.values())
    assert table[0.0] == pytest.approx(ranked["constant"], rel=1e-12)


def test_best_wsd_fraction_against_closed_form():
    """With λ = 0 the final annealing area is the whole drop, S2 = η_0 − 0 (η_0 = lr unless the
    decay starts at step 1), and a linear decay over k steps leaves S1 = lr·(T − k) +
    lr·(k − 1)/2: final loss L0 + A·S1^−α − C·S2. Two laws: a small C (annealing gains less than
    the lost area: constant wins) and a large C (the shortest decay on the grid wins)."""
    total, lr = 1000, 1e-3
    fractions = [0.0, 0.1, 0.2, 0.5, 1.0]
    for c, winner in ((0.35, 0.0), (50.0, 0.1)):
        law = LRAnnealingLaw(L0=2.9, A=0.5, alpha=0.55, C=c, decay=0.0)
        best, table = best_wsd_fraction(law, total, lr, fractions=fractions)
        expected = {0.0: law.L0 + law.A * (lr * total) ** -law.alpha}
        for fraction in fractions[1:]:
            k = round(fraction * total)
            s1 = lr * (total - k) + lr * (k - 1) / 2
            s2 = lr if k < total else lr * (1 - 1 / k)
            expected[fraction] = law.L0 + law.A * s1**-law.alpha - law.C * s2
        for fraction in fractions:
            assert table[fraction] == pytest.approx(expected[fraction], rel=1e-12)
        assert best == winner == min(expected, key=expected.get)


@pytest.mark.parametrize(
    ("curve", "match"),
    [
        (([1e-3, np.nan, 1e-3], [1, 2], [3.0, 2.9]), "NaN"),
        (([1e-3, -1e-3, 1e-3], [1, 2], [3.0, 2.9]), "non-negative"),
        (([1e-3] * 3, [1, 2, 3], [3.0, 2.9]), "equal length"),
        (([1e-3] * 3, [1, 2], [3.0, np.nan]), "finite"),
        (([1e-3] * 3, [0, 2], [3.0, 2.9]), r"\[1, len"),
        (([1e-3] * 3, [1, 4], [3.0, 2.9]), r"\[1, len"),
    ],
)
def test_bad_curves_are_rejected(curve, match):
    with pytest.raises(ValueError, match=match):
        fit([curve])


def test_bad_arguments():
    with pytest.raises(TypeError, match="list of curves"):
        fit([])
    with pytest.raises(ValueError, match="at least 4"):
        fit([([1e-3] * 3, [1, 2, 3], [3.0, 2.9, 2.8])])
    with pytest.raises(ValueError, match="decay"):
        areas([1.0, 1.0], decay=1.0)
    with pytest.raises(ValueError, match="decay_fraction"):
        schedules.wsd(10, 1.0, decay_fraction=1.5)
    with pytest.raises(ValueError, match="shape"):
        schedules.wsd(10, 1.0, shape="step")
    with pytest.raises(ValueError, match="warmup_steps"):
        schedules.constant(10, 1.0, warmup_steps=10)


def test_curves_without_annealing_cannot_identify_c():
    """S2 = 0 at every observed step leaves C free (any C fits equally well): the fit refuses
    instead of returning C = 0, which would predict that annealing never helps."""
    truth = LRAnnealingLaw(L0=2.9, A=0.5, alpha=0.55, C=0.35)
    lrs = schedules.constant(400, 2e-3, warmup_steps=20)
    steps = np.arange(30, 401, 10)
    constant = (lrs, steps, truth.predict(lrs, warmup_steps=20)[steps - 1], 20)
    with pytest.raises(ValueError, match="C cannot be identified"):
        fit([constant])
    with pytest.raises(ValueError, match="C cannot be identified"):
        fit([constant, constant])
    # a WSD run observed only before its decay starts carries no annealing either
    wsd = schedules.wsd(400, 2e-3, warmup_steps=20, decay_fraction=0.2)
    early = steps[steps <= 320]
    with pytest.raises(ValueError, match="C cannot be identified"):
        fit([(wsd, early, truth.predict(wsd, warmup_steps=20)[early - 1], 20)])
    # the same WSD run observed through its decay identifies C (noise-free curves: the fit
    # recovers it to the optimizer's tolerance; 0.1% leaves room for L-BFGS-B's stopping rule)
    law = fit([constant, (wsd, steps, truth.predict(wsd, warmup_steps=20)[steps - 1], 20)])
    assert abs(law.C - truth.C) <= 1e-3 * truth.C


def test_relative_errors_are_the_known_per_step_deviations():
    lrs = schedules.cosine(300, 1e-3, warmup_steps=WARMUP)
    steps = np.arange(50, 301, 50)
    exact = TRUTH.predict(lrs, warmup_steps=WARMUP)[steps - 1]
    deviations = np.array([0.01, -0.02, 0.0, 0.03, -0.005, 0.015])
    curve = AnnealingCurve(lrs, steps, exact / (1 + deviations), WARMUP)
    # observed = exact / (1 + d)  =>  |exact - observed| / observed = |d|
    np.testing.assert_allclose(relative_errors(TRUTH, curve), np.abs(deviations), rtol=1e-12)
    assert relative_error(TRUTH, curve) == pytest.approx(np.abs(deviations).mean(), rel=1e-12)
