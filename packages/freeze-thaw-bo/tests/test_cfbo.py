"""CFBO's acquisition and stopping rule against brute force and closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from curves_fixtures import KnownCurvesSurrogate, curve_table, saturating_curves
from scipy import integrate
from scipy.special import beta as beta_function

from freeze_thaw_bo import CFBO, Utility, adaptive_threshold, utility_acquisition


def _beta_cdf_by_quadrature(p: float, a: float) -> float:
    density = lambda x: x ** (a - 1) * (1 - x) ** (a - 1) / beta_function(a, a)  # noqa: E731
    return integrate.quad(density, 0.0, p)[0] if p > 0 else 0.0


@pytest.mark.parametrize("p", [0.0, 0.05, 0.3, 0.5, 0.8, 0.99, 1.0])
def test_adaptive_threshold_is_beta_cdf_to_the_gamma(p):
    gamma = math.log(0.2) / math.log(0.5)  # γ = log_0.5 0.2
    expected = _beta_cdf_by_quadrature(p, math.exp(-1)) ** gamma
    assert adaptive_threshold(p) == pytest.approx(expected, abs=1e-6)


def test_adaptive_threshold_landmarks():
    # Beta(β, β) is symmetric, so BetaCDF(0.5) = 0.5 and δ(0.5) = 0.5^γ = 0.2: an even chance of
    # improving stops at the baselines' fixed threshold
    assert adaptive_threshold(0.5) == pytest.approx(0.2)
    assert adaptive_threshold(0.0) == 0.0
    assert adaptive_threshold(1.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="probability"):
        adaptive_threshold(1.5)


def _brute_force_acquisition(samples, lengths, incumbent, spent, step_costs, utility):
    n, s, t = samples.shape
    acq, prob = np.zeros(n), np.zeros(n)
    u_p = utility(spent, incumbent)
    for i in range(n):
        best_gain, best_hit = 0.0, 0.0
        for end in range(lengths[i] + 1, t + 1):
            gains, hits = [], []
            for k in range(s):
                running = max([incumbent, *samples[i, k, lengths[i] : end]])
                u = utility(spent + (end - lengths[i]) * step_costs[i], running)
                gains.append(max(u - u_p, 0.0))
                hits.append(float(u >= u_p))
            best_gain = max(best_gain, float(np.mean(gains)))
            best_hit = max(best_hit, float(np.mean(hits)))
        acq[i], prob[i] = best_gain, best_hit
    return acq, prob


@pytest.mark.parametrize(("alpha", "c", "spent"), [(0.0, 1.0, 5.0), (0.25, 1.0, 10.0), (0.5, 2, 3)])
def test_acquisition_matches_brute_force_monte_carlo(alpha, c, spent):
    rng = np.random.default_rng(0)
    samples = rng.uniform(0.2, 0.9, (4, 6, 7))
    lengths = np.array([0, 3, 7, 5])  # an untried, a paused, a finished, a nearly finished trial
    step_costs = np.array([1.0, 2.0, 1.0, 0.5])
    utility = Utility(alpha=alpha, c=c, budget=20)
    acq, prob = utility_acquisition(
        torch.from_numpy(samples),
        torch.from_numpy(lengths),
        incumbent=0.6,
        spent=spent,
        step_costs=torch.from_numpy(step_costs),
        utility=utility,
    )
    want_acq, want_prob = _brute_force_acquisition(
        samples, lengths, 0.6, spent, step_costs, utility
    )
    np.testing.assert_allclose(acq.numpy(), want_acq, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(prob.numpy(), want_prob, rtol=1e-12, atol=1e-12)
    assert acq[2] == 0.0  # a finished configuration has nothing left to gain
    assert prob[2] == 0.0


def test_budget_beyond_b_gains_nothing():
    samples = torch.full((1, 1, 10), 1.0)
    acq, _ = utility_acquisition(
        samples,
        torch.tensor([0]),
        incumbent=0.5,
        spent=9.0,
        step_costs=torch.tensor([1.0]),
        utility=Utility(alpha=0.0, budget=10),
    )
    # only Δt = 1 stays within B = 10: the gain is 1.0 − 0.5 there, −∞ utility beyond
    assert float(acq[0]) == pytest.approx(0.5)


def test_cfbo_thaws_the_brute_force_argmax_and_stops_by_the_rule():
    table = curve_table(n=10, epochs=8, seed=3)
    utility = Utility(alpha=0.25, c=1.0, budget=40)
    surrogate = KnownCurvesSurrogate(table.values, sigma=0.05)
    opt = CFBO(
        table.space,
        utility,
        40,
        max_epochs=8,
        candidates=list(table.configs),
        surrogate=surrogate,
        num_samples=200,
        seed=0,
    )
    stops_seen = 0
    for _ in range(25):
        probe = torch.Generator().manual_seed(0)
        probe.set_state(opt.generator.get_state())
        samples = surrogate.sample_curves(opt.observations(), 200, probe).numpy()
        lengths = opt.lengths()
        incumbent = opt.incumbent if opt.history else 0.0
        acq, prob = _brute_force_acquisition(
            samples, lengths, incumbent, opt.budget_spent, np.ones(10), utility
        )
        acq[~opt._available()] = -np.inf
        regret = opt.estimated_regret()
        already_stopped = opt.stopped
        trial, epoch = opt.ask(ignore_stop=True)
        assert acq[trial] == pytest.approx(acq.max(), abs=1e-12)
        assert opt.last_probability == pytest.approx(prob[trial], abs=1e-12)
        if not already_stopped:
            fires = bool(opt.history) and regret >= adaptive_threshold(prob[trial])
            assert opt.stopped == fires
            stops_seen += fires
        opt.tell(trial, epoch, float(table.values[trial, epoch - 1]))
    assert stops_seen == 1, "with alpha = 0.25 over 25 steps the rule should fire once"


def test_cfbo_stops_when_further_training_cannot_pay():
    # every curve is flat: after the first observations nothing can raise the utility, and the
    # spent budget keeps lowering it, so the regret rises while p stays near 0
    curves = np.full((6, 10), 0.7)
    curves[0] = 0.8
    table = curve_table(n=6, epochs=10)
    opt = CFBO(
        table.space,
        Utility(alpha=0.5, budget=60),
        60,
        max_epochs=10,
        candidates=list(table.configs),
        surrogate=KnownCurvesSurrogate(curves, sigma=0.0),
        num_samples=16,
    )
    steps = 0
    while (suggestion := opt.ask()).trial_id is not None:
        opt.tell(suggestion.trial_id, suggestion.epoch, float(curves[suggestion.trial_id, 0]))
        steps += 1
    assert opt.stopped
    assert steps < 10


def test_cfbo_rejects_bad_settings():
    table = curve_table()
    surrogate = KnownCurvesSurrogate(saturating_curves(12, 8))
    kwargs = {"max_epochs": 8, "candidates": list(table.configs), "surrogate": surrogate}
    with pytest.raises(ValueError, match="num_samples"):
        CFBO(table.space, Utility(0.1, budget=30), 30, num_samples=0, **kwargs)
    with pytest.raises(ValueError, match="utility's budget"):
        CFBO(table.space, Utility(0.1, budget=31), 30, **kwargs)
    with pytest.raises(TypeError, match="sample_curves"):
        CFBO(table.space, Utility(0.1, budget=30), 30, **{**kwargs, "surrogate": object()})
