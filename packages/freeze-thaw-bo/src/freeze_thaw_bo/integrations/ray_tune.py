"""A Ray Tune scheduler (with its searcher) that runs any `FreezeThawOptimizer` with pause/resume.

In Ray Tune the search algorithm creates trials and the `TrialScheduler` decides what runs: it
answers each reported result with CONTINUE, PAUSE or STOP and picks a PENDING or PAUSED trial in
`choose_trial_to_run`. Ray starts every PENDING trial it has resources for, so new trials must be
created only when the optimizer asks for them: `FreezeThawScheduler.searcher` (a `Searcher`)
creates a trial for the optimizer's suggestion of a configuration never trained, and the scheduler
resumes a PAUSED trial when the optimizer picks it. After each reported epoch the optimizer is told
the value and asked again (see `freeze_thaw_bo.integrations._driver`): the same trial CONTINUEs,
another means PAUSE (Ray checkpoints the trial and stops its actor), a stop means STOP, and then
every paused trial is stopped and the searcher says FINISHED.

The trainable must be a function that reports `metric` once per epoch with a checkpoint and, when
`ray.tune.get_checkpoint()` returns one, resumes from it (Ray restores a paused trial from its
latest checkpoint); the epoch is read from `resource_attr` (default Ray's `training_iteration`,
which counts reports and is restored with the checkpoint):

    def train(config):
        state, start = {"weights": init(config)}, 0
        if (checkpoint := tune.get_checkpoint()) is not None:
            with checkpoint.as_directory() as folder:
                state, start = load(folder)
        for epoch in range(start + 1, max_epochs + 1):
            accuracy = train_one_epoch(state, config)
            with tempfile.TemporaryDirectory() as folder:
                save(folder, state, epoch)
                checkpoint = tune.Checkpoint.from_directory(folder)
                tune.report({"accuracy": accuracy}, checkpoint=checkpoint)

    scheduler = FreezeThawScheduler(opt, metric="accuracy", mode="max")
    tune.Tuner(train, tune_config=tune.TuneConfig(scheduler=scheduler,
               search_alg=scheduler.searcher, num_samples=-1, reuse_actors=True)).fit()

Supported: any `FreezeThawOptimizer`, `max_concurrent` trials at once (set Ray's resources so that
many can run), maximised or minimised metrics, cost budgets (`cost_attr`). The configurations are
the optimizer's candidates: pass no `param_space` search domains, and `num_samples=-1` (Ray
would otherwise stop creating trials after one). A trainable without checkpoints
restarts from scratch on resume; its re-reported epochs are ignored. Not supported: saving and
restoring the Tune experiment (the scheduler holds the optimizer in memory; save it with
`optimizer.save`), multi-objective metrics. A trial that fails, reports a non-finite metric, skips
an epoch or ends before `max_epochs` is retired: never suggested again, holding one step of budget.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from freeze_thaw_bo.integrations._common import performance_function, reported, require
from freeze_thaw_bo.integrations._driver import Decision, FreezeThawDriver
from freeze_thaw_bo.optimizer import FreezeThawOptimizer

require("ray.tune", "ray")

from ray.tune.experiment import Trial  # noqa: E402
from ray.tune.schedulers import TrialScheduler  # noqa: E402
from ray.tune.search import Searcher  # noqa: E402

__all__ = ["FreezeThawScheduler", "FreezeThawSearcher"]

_DECISIONS = {
    Decision.CONTINUE: TrialScheduler.CONTINUE,
    Decision.PAUSE: TrialScheduler.PAUSE,
    Decision.STOP: TrialScheduler.STOP,
}


class FreezeThawScheduler(TrialScheduler):
    """Ray Tune `TrialScheduler` driven by a `FreezeThawOptimizer` (pause/resume).

    Args:
        optimizer: decides what to train; its candidate pool defines the configurations.
        metric, mode: the reported metric and "max"/"min"; either here or in `TuneConfig`.
        resource_attr: the reported epoch (1, 2, ...); Ray's `training_iteration` by default.
        cost_attr: optional reported cost of the epoch, passed to `tell(cost=...)`.
        performance: maps the metric into the [0, 1] performance the optimizer maximises;
            default the metric ("max") or 1 − metric ("min").
        max_concurrent: trials trained at once.

    Attributes:
        searcher: the companion `Searcher`; pass it as `TuneConfig(search_alg=...)`.
        trial_ids: Ray trial id → optimizer trial id.
        driver: the ask/tell bookkeeping (`queue`, `running`, `retired`, `finished`).
    """

    _supports_buffered_results = False  # decide after every epoch

    def __init__(
        self,
        optimizer: FreezeThawOptimizer,
        *,
        metric: str | None = None,
        mode: str | None = None,
        resource_attr: str = "training_iteration",
        cost_attr: str | None = None,
        performance: Callable[[float], float] | None = None,
        max_concurrent: int = 1,
    ) -> None:
        super().__init__()
        if int(max_concurrent) != max_concurrent or max_concurrent < 1:
            raise ValueError(f"max_concurrent must be an integer >= 1, got {max_concurrent}")
        if mode is not None:
            performance_function(mode, performance)  # validates mode and performance
        self.optimizer = optimizer
        self.driver = FreezeThawDriver(optimizer, self._performance)
        self._metric = metric
        self._mode = mode
        self._custom_performance = performance
        self.resource_attr = resource_attr
        self.cost_attr = cost_attr
        self.max_concurrent = int(max_concurrent)
        self.trial_ids: dict[str, int] = {}
        self._ray_ids: dict[int, str] = {}
        self.searcher = FreezeThawSearcher(self)

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        num_samples = spec.get("num_samples")
        if num_samples is not None and num_samples < self.optimizer.num_candidates:
            raise ValueError(
                f"TuneConfig(num_samples={num_samples}) lets Ray create fewer trials than the "
                f"optimizer's {self.optimizer.num_candidates} candidates; pass num_samples=-1 "
                "(the optimizer decides when to stop)"
            )
        if (self._metric and metric) or (self._mode and mode):
            return False
        self._metric = self._metric or metric
        self._mode = self._mode or mode
        return True

    def _performance(self, value: float) -> float:
        return performance_function(self._mode or "max", self._custom_performance)(value)

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        if trial.trial_id not in self.trial_ids:
            raise RuntimeError(
                f"Ray added trial {trial.trial_id}, which FreezeThawScheduler did not create; "
                "pass `search_alg=scheduler.searcher` and no param_space search domains"
            )

    def on_trial_error(self, tune_controller: Any, trial: Trial) -> None:
        self.driver.on_end(self.trial_ids[trial.trial_id])

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        if self._metric is None:
            raise ValueError("no metric: pass `metric=` here or in `TuneConfig`")
        ours = self.trial_ids[trial.trial_id]
        epoch = int(reported(result, self.resource_attr))
        cost = None if self.cost_attr is None else reported(result, self.cost_attr)
        decision = self.driver.on_result(ours, epoch, reported(result, self._metric), cost)
        if self.driver.finished:
            self._stop_paused(tune_controller)
        return _DECISIONS[decision]

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict) -> None:
        self.driver.on_end(self.trial_ids[trial.trial_id])

    def on_trial_remove(self, tune_controller: Any, trial: Trial) -> None:
        pass

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        trials = tune_controller.get_trials()
        for trial in trials:  # started or resumed already (Ray starts PENDING trials anyway)
            if trial.status == Trial.PENDING:
                return trial
        suggestion = self.driver.peek(self.max_concurrent)
        if suggestion is None:
            if self.driver.finished:
                self._stop_paused(tune_controller)
            return None
        ray_id = self._ray_ids.get(int(suggestion.trial_id))
        for trial in trials:
            if trial.trial_id == ray_id and trial.status == Trial.PAUSED:
                self.driver.take()
                return trial
        return None  # a configuration never trained: the searcher creates its trial

    def debug_string(self) -> str:
        opt = self.optimizer
        return (
            f"FreezeThawScheduler({opt.method}): {opt.budget_spent:g}/{opt.budget:g} budget, "
            f"{len(self.driver.running)} running, stopped={opt.stopped}"
        )

    def _stop_paused(self, tune_controller: Any) -> None:
        for trial in tune_controller.get_trials():
            if trial.status == Trial.PAUSED:
                tune_controller.stop_trial(trial)


class FreezeThawSearcher(Searcher):
    """Creates a Ray trial when the optimizer suggests a configuration never trained."""

    def __init__(self, scheduler: FreezeThawScheduler) -> None:
        super().__init__()
        self.scheduler = scheduler

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict, **spec: Any
    ) -> bool:
        return True

    def suggest(self, trial_id: str) -> dict | str | None:
        scheduler, driver = self.scheduler, self.scheduler.driver
        suggestion = driver.peek(scheduler.max_concurrent)
        if suggestion is None:
            return Searcher.FINISHED if driver.finished else None
        ours = int(suggestion.trial_id)
        if ours in scheduler._ray_ids:
            return None  # a paused trial: the scheduler resumes it
        driver.take()
        scheduler.trial_ids[trial_id] = ours
        scheduler._ray_ids[ours] = trial_id
        return scheduler.optimizer.config(ours)

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        pass
