"""The Optuna, Syne Tune and Ray Tune adapters, each on a small real run of its library.

Every run uses a surrogate that knows the true learning curves (no PFN), so each decision can be
recomputed by brute force from the very samples the adapter drew.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
from collections import deque

import numpy as np
import pytest
import torch
from curves_fixtures import KnownCurvesSurrogate, curve_table
from scipy.stats import beta as beta_distribution

from freeze_thaw_bo.cfbo import CFBO
from freeze_thaw_bo.optimizer import FreezeThawOptimizer
from freeze_thaw_bo.utility import Utility

# ----------------------------------------------------------------------- shared helpers


def true_curve(ceiling: float, rate: float, epochs: int) -> np.ndarray:
    """(epochs,) y_t = ceiling·(1 − exp(−rate·t)), t = 1..epochs."""
    return ceiling * (1.0 - np.exp(-rate * np.arange(1, epochs + 1)))


class DecodingSurrogate:
    """Samples each configuration's true curve from its encoding x = (ceiling / ceiling_high,
    rate / 5), plus `noise`·N(0, 1) per epoch; records the last samples it returned."""

    def __init__(self, noise: float = 0.01, ceiling_high: float = 1.0) -> None:
        self.noise = noise
        self.ceiling_high = ceiling_high
        self.last: torch.Tensor | None = None

    def sample_curves(self, observations, num_samples, generator):
        x = torch.as_tensor(observations.x)
        epochs = torch.arange(1, observations.horizon + 1, dtype=torch.float64)
        mean = self.ceiling_high * x[:, :1] * (1 - torch.exp(-5 * x[:, 1:2] * epochs))  # (N, T)
        z = torch.randn(len(x), num_samples, observations.horizon, generator=generator)
        self.last = (mean[:, None, :] + self.noise * z).clamp(0, 1).float()
        return self.last


def brute_force_rule(curves, samples, utility, spent_order=None):
    """CFBO's acquisition, probability and regret for every row, by explicit loops.

    curves: observed prefixes per row (the history is replayed row by row); samples: (N, S, T).
    Returns (acquisition (N,), probability (N,), regret).
    """
    alpha, c, budget = utility.alpha, utility.c, utility.budget
    history = [v for curve in curves for v in curve]
    best, utilities = -math.inf, []
    for k, value in enumerate(history, start=1):
        best = max(best, value)
        utilities.append(best - alpha * (k / budget) ** c)
    b, u_p = len(history), utilities[-1]
    u_max, u_min = max(utilities), history[0] - alpha
    regret = -math.inf if math.isclose(u_max, u_min) else (u_max - u_p) / (u_max - u_min)
    samples = samples.double().numpy()
    n, _, horizon = samples.shape
    acquisition, probability = np.zeros(n), np.zeros(n)
    for row in range(n):
        m = len(curves[row]) if row < len(curves) else 0
        for delta in range(1, horizon - m + 1):
            if b + delta > budget:
                break
            running = np.maximum(best, samples[row, :, m : m + delta].max(axis=1))
            u = running - alpha * ((b + delta) / budget) ** c
            acquisition[row] = max(acquisition[row], np.mean(np.maximum(u - u_p, 0.0)))
            probability[row] = max(probability[row], np.mean(u >= u_p))
    return acquisition, probability, regret


def delta(p: float) -> float:
    return float(beta_distribution.cdf(p, math.exp(-1), math.exp(-1)) ** math.log(0.2, 0.5))


def test_importing_the_package_imports_no_hpo_library():
    code = (
        "import sys, freeze_thaw_bo, freeze_thaw_bo.integrations; "
        "import freeze_thaw_bo.integrations._driver; "
        "print(sorted(m for m in ('optuna', 'syne_tune', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("adapter", "library", "extra"),
    [
        ("optuna", "optuna", "optuna"),
        ("syne_tune", "syne_tune", "syne-tune"),
        ("ray_tune", "ray", "ray"),
    ],
)
def test_missing_library_names_the_extra(adapter, library, extra, monkeypatch):
    import importlib

    monkeypatch.setitem(sys.modules, library, None)  # makes `import <library>` fail
    monkeypatch.delitem(sys.modules, f"{library}.tune", raising=False)
    monkeypatch.delitem(sys.modules, f"freeze_thaw_bo.integrations.{adapter}", raising=False)
    with pytest.raises(ImportError, match=rf"pip install freeze-thaw-bo\[{extra}\]"):
        importlib.import_module(f"freeze_thaw_bo.integrations.{adapter}")


# ----------------------------------------------------------------------- Optuna

EPOCHS = 10
FLAT_POOR = {"ceiling": 0.3, "rate": 3.0}


def _objective(trial):
    ceiling = trial.suggest_float("ceiling", 0.0, 1.0)
    rate = trial.suggest_float("rate", 0.0, 5.0)
    for epoch, value in enumerate(true_curve(ceiling, rate, EPOCHS), start=1):
        trial.report(float(value), step=epoch)
        if trial.should_prune():
            _check_against_brute_force(trial.study, trial.number)
            raise optuna_module().TrialPruned()
        if epoch < EPOCHS:  # a finished trial is not judged
            _check_against_brute_force(trial.study, trial.number)
    return float(value)


def optuna_module():
    return pytest.importorskip("optuna")


def _check_against_brute_force(study, number):
    """The pruner's last decision equals R̂ ≥ δ(p) computed from the surrogate's samples."""
    pruner, surrogate = study.pruner, study.pruner.surrogate
    check = pruner.last_check
    assert check is not None
    assert check.trial == number
    trials = [t for t in study.get_trials(deepcopy=False) if t.intermediate_values]
    curves = [[t.intermediate_values[s] for s in sorted(t.intermediate_values)] for t in trials]
    _, probability, regret = brute_force_rule(curves, surrogate.last, pruner.utility)
    row = [t.number for t in trials].index(number)
    assert check.probability == pytest.approx(probability[row], abs=1e-12)
    assert check.regret == pytest.approx(regret, rel=1e-9, abs=1e-12)
    assert check.fire == (regret >= delta(probability[row]))


def test_optuna_pruner_prunes_flat_poor_curves_and_keeps_improving_ones():
    optuna = optuna_module()
    from freeze_thaw_bo.integrations.optuna import CFBOPruner

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    utility = Utility(alpha=2**-4, c=1.0, budget=100)
    pruner = CFBOPruner(
        utility, max_epochs=EPOCHS, surrogate=DecodingSurrogate(), num_samples=64, seed=0
    )
    study = optuna.create_study(direction="maximize", pruner=pruner)
    plan = [{"ceiling": 0.9, "rate": 0.3}] + [FLAT_POOR] * 4
    plan += [{"ceiling": 1.0, "rate": 0.4}] + [FLAT_POOR] * 4
    for params in plan:
        study.enqueue_trial(params)
    study.optimize(_objective, n_trials=len(plan))

    states = [t.state for t in study.trials]
    epochs = [len(t.intermediate_values) for t in study.trials]
    complete, pruned = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED
    assert states[0] == complete
    assert epochs[0] == EPOCHS
    assert states[5] == complete
    assert epochs[5] == EPOCHS
    for i in (*range(1, 5), *range(6, 10)):  # flat at 0.3, far below 0.9: pruned at once
        assert (states[i], epochs[i]) == (pruned, 1), i
    assert study.best_trial.number == 5


def test_optuna_study_stopper_stops_when_no_configuration_can_pay():
    optuna = optuna_module()
    from freeze_thaw_bo.integrations.optuna import CFBOStudyStopper

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    utility = Utility(alpha=2**-2, c=1.0, budget=50)
    surrogate = DecodingSurrogate(noise=0.0, ceiling_high=0.9)
    stopper = CFBOStudyStopper(
        utility, max_epochs=5, surrogate=surrogate, num_samples=8, num_candidates=32, seed=1
    )
    checks = []

    def objective(trial):
        ceiling = trial.suggest_float("ceiling", 0.0, 0.9)
        rate = trial.suggest_float("rate", 0.0, 5.0)
        for epoch, value in enumerate(true_curve(ceiling, rate, 5), start=1):
            trial.report(float(value), step=epoch)
        return float(value)

    def record(study, trial):
        checks.append((stopper.last_check, surrogate.last))

    study = optuna.create_study(direction="maximize")
    # a mediocre plateau (fresh configurations can beat it), then the best reachable curve
    study.enqueue_trial({"ceiling": 0.5, "rate": 3.0})
    study.enqueue_trial({"ceiling": 0.9, "rate": 5.0})
    study.optimize(objective, n_trials=10, callbacks=[stopper, record])

    assert len(study.trials) == 2
    assert stopper.stopped_at == 1
    for k, (check, samples) in enumerate(checks):
        curves = [
            [t.intermediate_values[s] for s in sorted(t.intermediate_values)]
            for t in study.trials[: k + 1]
        ]
        acquisition, probability, regret = brute_force_rule(curves, samples, utility)
        acquisition[: k + 1] = -np.inf  # finished trials cannot continue
        pick = int(np.argmax(acquisition))
        assert check.probability == pytest.approx(probability[pick], abs=1e-12)
        assert check.regret == pytest.approx(regret, rel=1e-9)
        assert check.fire == (regret >= delta(probability[pick])) == (k == 1)
    assert checks[1][0].probability == 0.0  # nothing in the space beats ceiling 0.9


def test_optuna_pruner_judges_the_reporting_trial_among_parallel_ones():
    optuna = optuna_module()
    from freeze_thaw_bo.integrations.optuna import CFBOPruner

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = CFBOPruner(
        Utility(alpha=2**-4, budget=100), max_epochs=EPOCHS, surrogate=DecodingSurrogate()
    )
    study = optuna.create_study(direction="maximize", pruner=pruner)
    dists = {
        "ceiling": optuna.distributions.FloatDistribution(0, 1),
        "rate": optuna.distributions.FloatDistribution(0, 5),
    }
    # two workers: a still-running improving trial, and a flat poor one reporting now
    study.enqueue_trial({"ceiling": 0.9, "rate": 0.3})
    study.enqueue_trial(FLAT_POOR)
    good, poor = study.ask(dists), study.ask(dists)
    for epoch, value in enumerate(true_curve(0.9, 0.3, 3), start=1):
        good.report(float(value), step=epoch)
    assert not good.should_prune()
    _check_against_brute_force(study, good.number)
    poor.report(float(true_curve(0.3, 3.0, 1)[0]), step=1)
    assert poor.should_prune()  # its own chance is nil, whatever the running trial's
    _check_against_brute_force(study, poor.number)
    assert pruner.last_check.probability == 0.0


def test_optuna_pruner_prunes_diverged_and_over_budget_trials():
    optuna = optuna_module()
    from freeze_thaw_bo.integrations.optuna import CFBOPruner

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = CFBOPruner(
        Utility(alpha=0.1, budget=3), max_epochs=5, surrogate=DecodingSurrogate(), num_samples=4
    )
    study = optuna.create_study(direction="minimize", pruner=pruner)
    trial = study.ask({"ceiling": optuna.distributions.FloatDistribution(0, 1)})
    trial.report(float("nan"), step=1)
    assert trial.should_prune()
    trial = study.ask()
    trial.suggest_float("ceiling", 0, 1)
    trial.suggest_float("rate", 0, 5)
    decisions = []
    for epoch in (1, 2, 3):
        trial.report(0.5, step=epoch)
        decisions.append(trial.should_prune())
    assert decisions[-1]
    assert pruner.last_check.spent == 3


def test_optuna_pruner_rejects_bad_settings():
    optuna_module()
    from freeze_thaw_bo.integrations.optuna import CFBOPruner, CFBOStudyStopper

    utility, fake = Utility(alpha=0.1, budget=10), DecodingSurrogate()
    with pytest.raises(ValueError, match="max_epochs"):
        CFBOPruner(utility, max_epochs=0, surrogate=fake)
    with pytest.raises(ValueError, match="num_samples"):
        CFBOPruner(utility, max_epochs=3, surrogate=fake, num_samples=0)
    with pytest.raises(TypeError, match="Utility"):
        CFBOPruner(0.1, max_epochs=3, surrogate=fake)
    with pytest.raises(TypeError, match="sample_curves"):
        CFBOPruner(utility, max_epochs=3, surrogate=object())
    with pytest.raises(ValueError, match="num_candidates"):
        CFBOStudyStopper(utility, max_epochs=3, surrogate=fake, num_candidates=0)


# ----------------------------------------------------------------------- pause/resume adapters


class RoundRobin(FreezeThawOptimizer):
    """Thaws the least-trained available trial (lowest index first): every epoch is a switch."""

    method = "round-robin-test"

    def _choose(self):
        lengths = np.where(self._available(), self.lengths(), np.iinfo(np.int64).max)
        return int(np.argmin(lengths)), False


def table_and_optimizers(method: str, n: int = 4, epochs: int = 3, budget: int = 10):
    """A synthetic curve table and a factory of identical optimizers over it."""
    table = curve_table(n=n, epochs=epochs, seed=0)

    def make():
        if method == "cfbo":
            return CFBO(
                table.space,
                Utility(alpha=2**-4, budget=budget),
                budget,
                max_epochs=epochs,
                surrogate=KnownCurvesSurrogate(table.values, sigma=0.05),
                num_samples=64,
                candidates=list(table.configs),
                seed=0,
            )
        return RoundRobin(
            table.space, budget=budget, max_epochs=epochs, candidates=list(table.configs)
        )

    return table, make


def ask_tell_history(opt, table):
    """The reference: the optimizer's own ask/tell loop on the table, one worker."""
    while not (suggestion := opt.ask()).stop:
        trial, epoch = suggestion
        opt.tell(trial, epoch, float(table.values[trial, epoch - 1]))
    return opt.history


def assert_curves_match_table(opt, table):
    """Every observed curve is a prefix of its configuration's table row."""
    for trial, values in enumerate(opt.values):
        np.testing.assert_allclose(values, table.values[trial, : len(values)], rtol=1e-12)
    assert opt.budget_spent <= opt.budget


# ----------------------------------------------------------------------- Syne Tune


def run_syne_tune(opt, table, n_workers, tmp_path, monkeypatch, max_resource_attr=None):
    pytest.importorskip("syne_tune")
    from syne_tune import StoppingCriterion, Tuner
    from syne_tune.backend.simulator_backend.simulator_callback import SimulatorCallback
    from syne_tune.blackbox_repository.blackbox import Blackbox
    from syne_tune.blackbox_repository.simulated_tabular_backend import UserBlackboxBackend
    from syne_tune.config_space import loguniform, randint, uniform

    from freeze_thaw_bo.integrations.syne_tune import FreezeThawScheduler

    epochs = table.values.shape[1]

    class TableBlackbox(Blackbox):
        """The table as Syne Tune's simulator sees it: accuracy and elapsed time per epoch."""

        def _objective_function(self, configuration, fidelity=None, seed=None):
            row = [dict(c) for c in table.configs].index(configuration)
            return np.stack([table.values[row], np.arange(1.0, epochs + 1)], axis=-1)

        @property
        def fidelity_values(self):
            return np.arange(1, epochs + 1)

    blackbox = TableBlackbox(
        configuration_space={"lr": loguniform(1e-4, 1e-1), "wd": uniform(0.0, 1.0)},
        fidelity_space={"epoch": randint(1, epochs)},
        objectives_names=["accuracy", "elapsed_time"],
    )
    monkeypatch.setenv("SYNETUNE_FOLDER", str(tmp_path))
    scheduler = FreezeThawScheduler(
        opt, metric="accuracy", resource_attr="epoch", max_resource_attr=max_resource_attr
    )
    backend = UserBlackboxBackend(
        blackbox=blackbox, elapsed_time_attr="elapsed_time", max_resource_attr=max_resource_attr
    )
    Tuner(
        trial_backend=backend,
        scheduler=scheduler,
        stop_criterion=StoppingCriterion(max_wallclock_time=10_000),
        n_workers=n_workers,
        sleep_time=0,
        callbacks=[SimulatorCallback()],
        tuner_name="freeze-thaw-bo-test",
        save_tuner=False,
        print_update_interval=10_000,
    ).run()
    return scheduler


@pytest.mark.parametrize("max_resource_attr", [None, "max_epoch"])
@pytest.mark.parametrize("method", ["round-robin", "cfbo"])
def test_syne_tune_scheduler_reproduces_the_ask_tell_loop(
    method, max_resource_attr, tmp_path, monkeypatch
):
    table, make = table_and_optimizers(method)
    opt = make()
    scheduler = run_syne_tune(opt, table, 1, tmp_path, monkeypatch, max_resource_attr)
    assert opt.history == ask_tell_history(make(), table)
    assert_curves_match_table(opt, table)
    trained = sorted({h[0] for h in opt.history})
    assert sorted(scheduler.trial_ids.values()) == trained  # one Syne Tune trial per config
    if method == "cfbo":  # it continues its pick: the in-place (or deferred) CONTINUE path
        assert any(a[0] == b[0] for a, b in zip(opt.history, opt.history[1:], strict=False))
    if method == "round-robin":  # every epoch switches trial: each trial was paused and resumed
        assert [h[0] for h in opt.history[:5]] == [0, 1, 2, 3, 0]
        assert opt.budget_spent == opt.budget
    assert scheduler.driver.finished
    assert not scheduler.driver.running


def test_syne_tune_scheduler_with_two_workers(tmp_path, monkeypatch):
    table, make = table_and_optimizers("round-robin", n=4, epochs=3, budget=12)
    opt = make()
    scheduler = run_syne_tune(opt, table, 2, tmp_path, monkeypatch)
    assert_curves_match_table(opt, table)
    assert opt.budget_spent == 12
    assert not opt.pending
    assert len(scheduler.trial_ids) == 4


# ----------------------------------------------------------------------- Ray Tune


def test_ray_tune_scheduler_pauses_and_resumes_from_checkpoints(tmp_path):
    ray = pytest.importorskip("ray")
    tune = pytest.importorskip("ray.tune")
    from freeze_thaw_bo.integrations.ray_tune import FreezeThawScheduler

    table, make_round_robin = table_and_optimizers("round-robin", n=3, epochs=3, budget=7)
    _, make_cfbo = table_and_optimizers("cfbo", n=3, epochs=3, budget=9)
    curves = {
        json.dumps(c, sort_keys=True): table.values[i].tolist() for i, c in enumerate(table.configs)
    }

    def train(config):  # self-contained: Ray pickles it by value into its worker
        import json
        import os
        import tempfile

        from ray import tune

        curve = curves[json.dumps(config, sort_keys=True)]
        start, checkpoint = 0, tune.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as folder, open(os.path.join(folder, "state.json")) as f:
                start = json.load(f)["epoch"]
        for epoch in range(start + 1, len(curve) + 1):
            with tempfile.TemporaryDirectory() as folder:
                with open(os.path.join(folder, "state.json"), "w") as f:
                    json.dump({"epoch": epoch}, f)
                tune.report(
                    {"accuracy": curve[epoch - 1], "epoch": epoch, "resumed_from": start},
                    checkpoint=tune.Checkpoint.from_directory(folder),
                )

    def run(opt, name):
        scheduler = FreezeThawScheduler(opt, metric="accuracy", mode="max")
        results = tune.Tuner(
            train,
            tune_config=tune.TuneConfig(
                scheduler=scheduler,
                search_alg=scheduler.searcher,
                num_samples=-1,
                reuse_actors=True,
                time_budget_s=120,  # a safety net: the optimizer ends the run long before
            ),
            run_config=tune.RunConfig(storage_path=str(tmp_path), name=name, verbose=0),
        ).fit()
        assert not results.errors
        assert scheduler.driver.finished
        return scheduler, {scheduler.trial_ids[r.metrics["trial_id"]]: r.metrics for r in results}

    with pytest.raises(ValueError, match="num_samples=-1"):
        FreezeThawScheduler(make_cfbo()).set_search_properties(None, None, num_samples=1)
    # Ray's sockets live under its temp folder, and AF_UNIX paths are capped at 107 bytes: under
    # a deep TMPDIR (nox's) the default folder is too long, so use a short one
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _temp_dir=ray_tmp)
    try:
        round_robin, cfbo = make_round_robin(), make_cfbo()
        _, last = run(round_robin, "round-robin")
        _, cfbo_last = run(cfbo, "cfbo")
    finally:
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)

    # round robin: a pause after every epoch; the budget (7) ends it with trials 1, 2 paused at
    # epoch 2, which the scheduler stops; each resumed from its checkpoint, not from scratch
    assert round_robin.history == ask_tell_history(make_round_robin(), table)
    assert_curves_match_table(round_robin, table)
    assert {t: (m["epoch"], m["resumed_from"]) for t, m in last.items()} == {
        0: (3, 2),
        1: (2, 1),
        2: (2, 1),
    }
    assert all(m["training_iteration"] == m["epoch"] for m in last.values())
    # CFBO continues its pick in place (no checkpoint restore) until its stopping rule fires
    assert cfbo.history == ask_tell_history(make_cfbo(), table)
    assert_curves_match_table(cfbo, table)
    assert any(a[0] == b[0] for a, b in zip(cfbo.history, cfbo.history[1:], strict=False))
    assert all(m["resumed_from"] == 0 for m in cfbo_last.values())


# ----------------------------------------------------------------------- the driver alone


def test_driver_ignores_re_reported_epochs_and_retires_broken_trials():
    from freeze_thaw_bo.integrations._driver import Decision, FreezeThawDriver

    _, make = table_and_optimizers("round-robin", n=3, epochs=3, budget=9)
    opt = make()
    driver = FreezeThawDriver(opt, float)

    def start():  # what a library does when a worker is free
        assert driver.peek() is not None
        return driver.take()

    first = start()
    assert first.trial_id == 0
    assert driver.running == {0}
    assert driver.on_result(0, 1, 0.5) is Decision.PAUSE  # round robin moves on to trial 1
    assert start().trial_id == 1
    assert driver.on_result(1, 1, 0.4) is Decision.PAUSE
    start()  # trial 2
    assert driver.on_result(2, 1, math.nan) is Decision.STOP  # diverged: retired
    assert driver.retired == {2}
    assert opt.values[2] == []
    start()  # trial 0 resumes at epoch 2 ...
    assert driver.on_result(0, 1, 0.5) is Decision.CONTINUE  # ... restarted from scratch: ignored
    assert driver.on_result(0, 2, 0.6) is Decision.PAUSE
    start()  # trial 1, epoch 2
    assert driver.on_result(1, 3, 0.6) is Decision.STOP  # skipped epoch 2: retired
    start()  # trial 0, epoch 3
    assert driver.on_result(0, 3, 0.7) is Decision.STOP  # finished its max_epochs
    assert driver.peek() is None
    assert driver.finished
    with pytest.raises(ValueError, match="not being trained"):
        driver.on_result(0, 4, 0.7)


def test_driver_after_close_continues_only_the_running_trial():
    from freeze_thaw_bo.integrations._driver import Decision, FreezeThawDriver

    _, make = table_and_optimizers("round-robin", n=2, epochs=3, budget=6)
    opt = make()
    driver = FreezeThawDriver(opt, float)
    driver.peek()
    driver.take()
    driver.close()
    assert driver.on_result(0, 1, 0.5) is Decision.STOP  # round robin wants trial 1: dropped
    assert not opt.pending
    assert driver.queue == deque()


def test_driver_defers_a_continued_trial_as_its_next_resume():
    from freeze_thaw_bo.integrations._driver import Decision, FreezeThawDriver

    _, make = table_and_optimizers("cfbo", n=2, epochs=3, budget=6)
    opt = make()
    driver = FreezeThawDriver(opt, float)
    trial, _ = driver.peek()
    driver.take()
    decision = driver.on_result(trial, 1, float(curve_table(n=2, epochs=3).values[trial, 0]))
    assert decision is Decision.CONTINUE  # CFBO keeps training its pick ...
    assert driver.defer(trial) is Decision.PAUSE  # ... which must restart for epoch 2
    assert driver.peek() == (trial, 2)
    assert driver.running == set()
    driver.close()  # a closed library resumes nothing: the pending epoch is released
    assert not opt.pending
    assert driver.queue == deque()


def test_optuna_union_space_encodes_every_distribution_kind():
    optuna = optuna_module()
    from freeze_thaw_bo.integrations.optuna import _config, _union_space

    dists = optuna.distributions
    first = optuna.trial.create_trial(
        params={"lr": 1e-3, "width": 64, "act": "relu", "fixed": 2},
        distributions={
            "lr": dists.FloatDistribution(1e-4, 1e-1, log=True),
            "width": dists.IntDistribution(16, 256, log=True),
            "act": dists.CategoricalDistribution(["relu", "tanh"]),
            "fixed": dists.IntDistribution(2, 2),
        },
        value=0.0,
    )
    second = optuna.trial.create_trial(  # a wider range, a new choice, "width" not sampled
        params={"lr": 0.5, "act": "gelu"},
        distributions={
            "lr": dists.FloatDistribution(1e-4, 1.0, log=True),
            "act": dists.CategoricalDistribution(["gelu"]),
        },
        value=0.0,
    )
    space, defaults = _union_space([first, second])
    assert list(space.dimensions) == ["lr", "width", "act"]  # the one-valued "fixed" is left out
    x = space.encode([_config(t, space, defaults) for t in (first, second)])
    lr = np.log([1e-3, 0.5]) - np.log(1e-4)
    expected = [
        [lr[0] / np.log(1e4), np.log(4) / np.log(16), 1, 0, 0],
        [lr[1] / np.log(1e4), 0.0, 0, 0, 1],  # width at its lower bound
    ]
    np.testing.assert_allclose(x, expected, atol=1e-12)
