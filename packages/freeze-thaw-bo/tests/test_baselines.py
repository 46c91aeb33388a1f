"""The baselines: hand-run schedules, ASHA's promotions by brute force, acquisitions against closed
forms on surrogates with known continuations, full runs under the ask/tell invariants, resume."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from curves_fixtures import curve_table
from scipy.stats import norm

from freeze_thaw_bo import Float, SearchSpace, Utility, load_optimizer, method_class
from freeze_thaw_bo.baselines import (
    ASHA,
    DPLFreezeThaw,
    DyHPO,
    Hyperband,
    IfBO,
    RandomSearch,
    SuccessiveHalving,
    final_expected_improvement,
)
from freeze_thaw_bo.surrogates.dpl import DPLSurrogate
from freeze_thaw_bo.surrogates.gp import FreezeThawGPSurrogate


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small tensors: one thread is faster, and the shared CI cores are not oversubscribed."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SPACE = SearchSpace({"a": Float(0.0, 1.0)})


class ShiftedCurves:
    """Samples `curves[n] + sigma·z` with one z ~ N(0, 1) per (configuration, path), unclipped:
    every sampled value is Gaussian with mean curves[n, e] and sd sigma (closed-form EI and PI)."""

    def __init__(self, curves: np.ndarray, sigma: float) -> None:
        self.curves = torch.as_tensor(curves, dtype=torch.float32)
        self.sigma = sigma

    def sample_curves(self, observations, num_samples, generator):
        n, t = self.curves.shape
        assert observations.num_configs == n
        assert observations.horizon == t
        z = torch.randn(n, num_samples, 1, generator=generator)
        return self.curves[:, None, :] + self.sigma * z


class FirstInPool:
    """A stand-in for `opt.rng` that draws the first untried trials, so schedules are literal."""

    def choice(self, pool, size, replace):
        assert not replace
        return np.asarray(pool)[:size]


def _candidates(n: int) -> list[dict]:
    return [{"a": i / max(n - 1, 1)} for i in range(n)]


def _run(opt, values) -> list[tuple[int, int]]:
    """Ask and tell (one worker) until the optimizer stops; the (trial, epoch) sequence."""
    sequence = []
    while (suggestion := opt.ask()).trial_id is not None:
        sequence.append(tuple(suggestion))
        opt.tell(*suggestion, float(values(*suggestion)))
    return sequence


def _epochs(trial: int, first: int, last: int) -> list[tuple[int, int]]:
    return [(trial, e) for e in range(first, last + 1)]


# ---------------------------------------------------------------------------- schedules


def test_bracket_shapes_are_li_et_als_table():
    """Hyperband paper, Table 1 (R = 81, η = 3): (n_i, r_i) of every bracket."""
    opt = Hyperband(SPACE, budget=10, max_epochs=81, candidates=_candidates(2))
    assert opt.max_bracket == 4
    table = {
        4: ([1, 3, 9, 27, 81], [81, 27, 9, 3, 1]),
        3: ([3, 9, 27, 81], [34, 11, 3, 1]),
        2: ([9, 27, 81], [15, 5, 1]),
        1: ([27, 81], [8, 2]),
        0: ([81], [5]),
    }
    for s, shape in table.items():
        assert opt.bracket_shape(s) == shape
    # non-powers of η round r_i half up: R = 10 → 10/9, 10/3, 10
    opt = Hyperband(SPACE, budget=5, max_epochs=10, candidates=_candidates(2))
    assert opt.bracket_shape(2) == ([1, 3, 10], [9, 3, 1])


def test_successive_halving_follows_the_hand_run_schedule():
    """η = 3, R = 9, nine configurations: 9 at 1 epoch, the best 3 by their epoch-1 value to 3
    epochs, the best of those by its epoch-3 value to 9. Rankings at epoch 1 and 3 disagree, and
    trial 8 peaks at epoch 2, so the schedule shows that each rung ranks by the value at its own
    epoch (not the curve's best)."""

    def value(trial, epoch):  # epoch 1: higher trial is better; later: lower trial is better
        if epoch == 1:
            return 0.1 + 0.05 * trial
        if epoch == 2 and trial == 8:
            return 0.95
        return 0.9 - 0.05 * trial + 0.001 * epoch

    opt = SuccessiveHalving(SPACE, budget=40, max_epochs=9, candidates=_candidates(9), eta=3)
    opt.rng = FirstInPool()
    expected = (
        [(t, 1) for t in range(9)]
        + _epochs(8, 2, 3)
        + _epochs(7, 2, 3)
        + _epochs(6, 2, 3)
        + _epochs(6, 4, 9)
    )
    assert _run(opt, value) == expected  # 21 epochs, then the pool is empty: stop
    # two workers: while rung 0 waits on a pending trial, a free worker opens the next bracket
    opt = SuccessiveHalving(SPACE, budget=40, max_epochs=9, candidates=_candidates(18))
    opt.rng = FirstInPool()
    for t in range(8):
        assert opt.ask() == (t, 1)
        opt.tell(t, 1, value(t, 1))
    assert opt.ask() == (8, 1)  # held by a worker
    assert opt.ask() == (9, 1)  # the second bracket's first trial
    assert [b["rungs"] for b in opt.brackets] == [[list(range(9))], [list(range(9, 18))]]
    opt.tell(8, 1, value(8, 1))
    assert opt.ask() == (8, 2)  # the oldest bracket goes first again


def test_hyperband_follows_the_hand_run_schedule():
    """η = 3, R = 9: brackets s = 2 (9 at 1 → 3 at 3 → 1 at 9), s = 1 (5 at 3 → 1 at 9),
    s = 0 (3 at 9), then s = 2 again; 26 configurations, budget 90 = 21 + 21 + 27 + 21."""

    def value(trial, epoch):
        return 0.1 + 0.01 * trial if epoch == 1 else 0.9 - 0.01 * trial + 0.001 * epoch

    opt = Hyperband(SPACE, budget=90, max_epochs=9, candidates=_candidates(26), eta=3)
    opt.rng = FirstInPool()
    bracket_2 = (
        [(t, 1) for t in range(9)]
        + _epochs(8, 2, 3)
        + _epochs(7, 2, 3)
        + _epochs(6, 2, 3)
        + _epochs(6, 4, 9)
    )
    bracket_1 = [pair for t in range(9, 14) for pair in _epochs(t, 1, 3)] + _epochs(9, 4, 9)
    bracket_0 = [pair for t in range(14, 17) for pair in _epochs(t, 1, 9)]
    again = (
        [(t, 1) for t in range(17, 26)]
        + _epochs(25, 2, 3)
        + _epochs(24, 2, 3)
        + _epochs(23, 2, 3)
        + _epochs(23, 4, 9)
    )
    sequence = _run(opt, value)
    assert sequence == bracket_2 + bracket_1 + bracket_0 + again
    assert opt.budget_spent == 90


def test_random_search_trains_each_configuration_fully():
    opt = RandomSearch(SPACE, budget=20, max_epochs=4, candidates=_candidates(6), seed=3)
    sequence = _run(opt, lambda t, e: 0.5)
    trials = [t for t, _ in sequence[::4]]
    assert len(set(trials)) == 5
    assert sequence == [pair for t in trials for pair in _epochs(t, 1, 4)]
    opt = RandomSearch(SPACE, budget=20, max_epochs=4, candidates=_candidates(6))
    opt.rng = FirstInPool()
    first, second = opt.ask(), opt.ask()  # two workers: the pending trial is skipped
    assert (first, second) == ((0, 1), (1, 1))
    opt.tell(0, 1, 0.5)
    assert opt.ask() == (0, 2)  # the oldest trial in progress continues


def _asha_oracle(values: list[list[float]], rungs: list[int], eta: int, promoted: set):
    """From the observations alone: for each rung k below the top, the trials of rung k's top
    ⌊n_k/η⌋ (by value at r_k) not yet sent on."""
    out = {}
    for k in range(len(rungs) - 1):
        members = [t for t, v in enumerate(values) if len(v) >= rungs[k]]
        order = sorted(members, key=lambda t: -values[t][rungs[k] - 1])
        out[k] = [t for t in order[: len(members) // eta] if (t, k) not in promoted]
    return out


def test_asha_promotes_exactly_the_top_fraction():
    rng = np.random.default_rng(0)
    table = rng.uniform(0.2, 0.9, size=(40, 9))
    opt = ASHA(SPACE, budget=150, max_epochs=9, candidates=_candidates(40), eta=3, seed=1)
    rungs, eta = [1, 3, 9], 3
    assert opt.rung_epochs == rungs
    promoted: set[tuple[int, int]] = set()
    target: dict[int, int] = {}
    promotions = starts = 0
    while True:
        oracle = _asha_oracle(opt.values, rungs, eta, promoted)
        in_progress = [t for t, r in target.items() if len(opt.values[t]) < r]
        trial, epoch = opt.ask()
        if trial is None:
            break
        if in_progress:  # one worker: a started job is finished before anything else
            assert trial == in_progress[0]
            assert epoch > 1
        elif epoch == 1:  # a new configuration only when no rung has a promotable trial
            assert all(not c for c in oracle.values())
            target[trial] = rungs[0]
            starts += 1
        else:  # a promotion from the highest rung with candidates, of its best candidate
            k = rungs.index(epoch - 1)
            assert all(not oracle[j] for j in range(k + 1, len(rungs) - 1))
            assert trial == oracle[k][0]
            promoted.add((trial, k))
            target[trial] = rungs[k + 1]
            promotions += 1
        opt.tell(trial, epoch, float(table[trial, epoch - 1]))
    assert promotions >= 8
    assert starts >= 20
    assert any(k == 1 for _, k in promoted)


# ---------------------------------------------------------------------------- acquisitions

CURVES = np.array(
    [
        [0.40, 0.50, 0.58, 0.62, 0.65],
        [0.55, 0.60, 0.63, 0.64, 0.65],
        [0.30, 0.45, 0.55, 0.62, 0.70],
        [0.60, 0.61, 0.62, 0.63, 0.64],
        [0.35, 0.40, 0.42, 0.43, 0.44],
    ]
)


def _observed(cls, sigma: float, **kwargs):
    """An optimizer with trial 0 at 2 epochs, trial 1 at 1, trial 3 finished; 2 and 4 untried."""
    opt = cls(
        SPACE,
        budget=30,
        max_epochs=5,
        candidates=_candidates(5),
        surrogate=ShiftedCurves(CURVES, sigma),
        num_samples=kwargs.pop("num_samples", 4000),
        **kwargs,
    )
    for trial, epochs in ((0, 2), (1, 1), (3, 5)):
        for e in range(1, epochs + 1):
            opt.tell(trial, e, float(CURVES[trial, e - 1]))
    return opt


def _same_samples(opt):
    """The samples the next ask will draw (its generator's state cloned)."""
    generator = torch.Generator()
    generator.set_state(opt.generator.get_state())
    return opt.surrogate.sample_curves(opt.observations(), opt.num_samples, generator).double()


def _gaussian_ei(mu, sigma, best):
    z = (mu - best) / sigma
    return (mu - best) * norm.cdf(z) + sigma * norm.pdf(z)


@pytest.mark.parametrize("reference", ["fidelity", "incumbent"])
def test_dyhpo_scores_the_next_epoch_against_the_best_at_that_epoch(reference):
    opt = _observed(DyHPO, sigma=0.05, reference=reference)
    # best observed at epoch 1: trial 3 (0.60); epoch 2: trial 3 (0.61); epoch 3: 0.62 ...
    by_epoch = np.array([0.60, 0.61, 0.62, 0.63, 0.64])
    expected_best = by_epoch if reference == "fidelity" else np.full(5, 0.64)
    np.testing.assert_allclose(opt.fidelity_best(), expected_best)
    samples = _same_samples(opt)
    available = opt._available()
    trial, _ = opt.ask()
    brute = np.zeros(5)
    for n, m in enumerate(opt.lengths()):
        if m < 5:
            brute[n] = np.mean(
                [
                    max(float(samples[n, s, m]) - expected_best[m], 0.0)
                    for s in range(opt.num_samples)
                ]
            )
    np.testing.assert_allclose(opt.last_acquisition, brute, atol=1e-12)
    assert trial == int(np.argmax(np.where(available, brute, -1.0)))
    closed = np.array(
        [
            _gaussian_ei(CURVES[n, m], 0.05, expected_best[m]) if m < 5 else 0.0
            for n, m in enumerate(opt.lengths())
        ]
    )
    np.testing.assert_allclose(opt.last_acquisition, closed, atol=5 * 0.05 / math.sqrt(4000))


def test_ifbo_scores_probability_of_improvement_at_a_random_horizon():
    opt = _observed(IfBO, sigma=0.05)
    horizons, taus = set(), []
    for _ in range(25):
        samples = _same_samples(opt)
        lengths, available = opt.lengths(), opt._available()
        trial, _ = opt.ask()
        h, threshold = opt.last_horizon, opt.last_threshold
        horizons.add(h)
        incumbent = 0.64
        tau = math.log10((threshold - incumbent) / (1 - incumbent))
        assert 1 <= h <= 5
        assert -4 <= tau <= -1
        taus.append(tau)
        at = np.minimum(lengths + h, 5) - 1
        brute = np.array(
            [
                (samples[n, :, at[n]] > threshold).double().mean().item() if lengths[n] < 5 else 0.0
                for n in range(5)
            ]
        )
        np.testing.assert_allclose(opt.last_acquisition, brute, atol=1e-12)
        closed = [
            norm.sf(threshold, CURVES[n, at[n]], 0.05) if lengths[n] < 5 else 0.0 for n in range(5)
        ]
        np.testing.assert_allclose(brute, closed, atol=5 * 0.5 / math.sqrt(opt.num_samples))
        assert brute[trial] == brute[available].max()
        opt.pending.clear()  # keep the state: the next ask draws a new horizon and threshold
    assert len(horizons) >= 3
    assert max(taus) - min(taus) > 1.0


def test_dpl_scores_gaussian_ei_of_the_final_value():
    rng = np.random.default_rng(0)
    samples = torch.from_numpy(rng.normal(0.6, 0.05, size=(4, 5, 6)))
    samples[2] = 0.7  # zero spread: the limit (μ − ŷ)₊
    lengths = np.array([0, 3, 2, 6])
    ei = final_expected_improvement(samples, lengths, incumbent=0.62)
    final = samples[:, :, -1].numpy()
    expected = [_gaussian_ei(final[n].mean(), final[n].std(), 0.62) for n in range(2)]
    np.testing.assert_allclose(ei[:2], expected, rtol=1e-10)
    assert ei[2] == pytest.approx(0.08)
    assert ei[3] == 0.0
    opt = _observed(DPLFreezeThaw, sigma=0.05, num_samples=200)
    samples = _same_samples(opt)
    trial, _ = opt.ask()
    direct = final_expected_improvement(samples, opt.lengths(), incumbent=0.64)
    np.testing.assert_allclose(opt.last_acquisition, direct)
    closed = [_gaussian_ei(CURVES[n, -1], 0.05, 0.64) for n in (0, 1, 2, 4)]
    np.testing.assert_allclose(direct[[0, 1, 2, 4]], closed, atol=0.01)  # μ, σ from 200 draws
    assert trial == 2  # the final value 0.70 beats 0.64 by most


def test_model_based_methods_start_with_a_random_untried_configuration():
    for cls in (DyHPO, IfBO, DPLFreezeThaw):
        firsts = set()
        for seed in range(8):
            surrogate = ShiftedCurves(CURVES, 0.05)
            opt = cls(
                SPACE,
                budget=10,
                max_epochs=5,
                candidates=_candidates(5),
                seed=seed,
                surrogate=surrogate,
            )
            trial, epoch = opt.ask()
            assert epoch == 1
            assert opt.last_acquisition is None
            firsts.add(trial)
        assert len(firsts) >= 3


# ---------------------------------------------------------------------------- full runs

TABLE = curve_table(n=12, epochs=6, seed=2)


def _make(method: str, **kwargs):
    surrogates = {
        "dyhpo": lambda: FreezeThawGPSurrogate(fit_iterations=4),
        "ifbo": lambda: ShiftedCurves(TABLE.values, 0.05),
        "dpl": lambda: DPLSurrogate(ensemble_size=2, hidden_units=16, train_steps=10),
    }
    extra = {"surrogate": surrogates[method](), "num_samples": 64} if method in surrogates else {}
    budget = kwargs.pop("budget", 40)
    return method_class(method)(  # registered under its `method` name
        TABLE.space,
        budget=budget,
        max_epochs=TABLE.max_epochs,
        utility=Utility(alpha=0.3, budget=budget),
        candidates=list(TABLE.configs),
        **extra,
        **kwargs,
    )


METHODS = ["random", "sh", "hyperband", "asha", "dyhpo", "ifbo", "dpl"]


@pytest.mark.parametrize("method", METHODS)
def test_full_budget_with_two_workers_keeps_the_invariants(method):
    opt = _make(method, budget=40, stopping="none", seed=4)
    assert opt.method == method
    rng = np.random.default_rng(0)
    held: list[tuple[int, int]] = []
    while True:
        while len(held) < 2:
            trial, epoch = opt.ask()
            if trial is None:
                break
            assert trial not in {t for t, _ in held}
            assert epoch == len(opt.values[trial]) + 1 <= opt.max_epochs
            held.append((trial, epoch))
        if not held:
            break
        trial, epoch = held.pop(int(rng.integers(len(held))))
        opt.tell(trial, epoch, float(TABLE.values[trial, epoch - 1]))
    assert opt.budget_spent <= 40
    for trial, values in enumerate(opt.values):
        np.testing.assert_array_equal(values, TABLE.values[trial, : len(values)])
    if method not in ("sh", "asha"):  # these two may run out of promotable or fresh trials
        assert opt.budget_spent == 40


@pytest.mark.parametrize("method", ["random", "hyperband", "ifbo"])
def test_stopping_is_the_fixed_threshold_rule(method):
    """The stop fires at the first ask where R̂ = (Û_max − U_p)/(Û_max − Û_min) ≥ 0.2, recomputed
    here from the history alone."""
    opt = _make(method, budget=40)
    utility = opt.utility
    history = []
    expected = None
    while True:
        if history:
            spent = len(history)
            incumbents = np.maximum.accumulate(history)
            u = [utility(b + 1, incumbents[b]) for b in range(spent)]
            u_min = utility(40, history[0])
            if not math.isclose(max(u), u_min):
                regret = (max(u) - u[-1]) / (max(u) - u_min)
                if regret >= 0.2 and expected is None:
                    expected = float(spent)
        trial, epoch = opt.ask(ignore_stop=True)
        if trial is None:
            break
        value = float(TABLE.values[trial, epoch - 1])
        opt.tell(trial, epoch, value)
        history.append(value)
    assert expected is not None, "α = 0.3 must make the rule fire within the budget"
    assert opt.stop_budget == expected


@pytest.mark.parametrize("method", METHODS)
def test_save_and_load_give_the_same_next_asks(method, tmp_path):
    opt = _make(method, budget=40, seed=7, stopping="none")
    for _ in range(13):
        trial, epoch = opt.ask()
        opt.tell(trial, epoch, float(TABLE.values[trial, epoch - 1]))
    held = opt.ask()  # a suggestion held by a worker at save time
    opt.save(tmp_path / "state")
    overrides = {}
    if method in ("dyhpo", "ifbo", "dpl"):
        overrides["surrogate"] = _make(method).surrogate
    resumed = load_optimizer(tmp_path / "state", **overrides)
    assert type(resumed) is type(opt)
    assert resumed.settings() == opt.settings()
    assert resumed.pending == {held.trial_id: held.epoch}
    pending = [held]
    for _ in range(8):
        a, b = opt.ask(), resumed.ask()
        assert a == b
        if a.trial_id is None:
            break
        pending.append(a)
        trial, epoch = pending.pop(0)
        value = float(TABLE.values[trial, epoch - 1])
        opt.tell(trial, epoch, value)
        resumed.tell(trial, epoch, value)


def test_baselines_reject_bad_settings():
    base = {"budget": 10, "max_epochs": 9, "candidates": _candidates(3)}
    with pytest.raises(ValueError, match="eta"):
        SuccessiveHalving(SPACE, eta=1, **base)
    with pytest.raises(ValueError, match="min_epochs"):
        Hyperband(SPACE, min_epochs=10, **base)
    with pytest.raises(ValueError, match="min_epochs"):
        ASHA(SPACE, min_epochs=0, **base)
    with pytest.raises(ValueError, match="reference"):
        DyHPO(SPACE, reference="best", surrogate=ShiftedCurves(np.zeros((3, 9)), 0.1), **base)
    with pytest.raises(ValueError, match="num_samples"):
        IfBO(SPACE, num_samples=0, surrogate=ShiftedCurves(np.zeros((3, 9)), 0.1), **base)
    with pytest.raises(TypeError, match="sample_curves"):
        DPLFreezeThaw(SPACE, surrogate=object(), **base)
    with pytest.raises(ValueError, match="bracket"):
        Hyperband(SPACE, **base).bracket_shape(5)
