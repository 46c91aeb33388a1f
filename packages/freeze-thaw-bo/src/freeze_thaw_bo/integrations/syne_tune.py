"""A Syne Tune scheduler that runs any `FreezeThawOptimizer` with pause and resume.

Syne Tune's `Tuner` asks `suggest()` whenever a worker is free and passes every reported result to
`on_trial_result`, which answers CONTINUE, PAUSE or STOP. This scheduler maps that loop onto the
optimizer's ask/tell (see `freeze_thaw_bo.integrations._driver`):

- `suggest()` hands out the optimizer's next suggestion: `start_suggestion(config)` for a trial
  never trained (its Syne Tune trial id is mapped to the optimizer's in `on_trial_add`), or
  `resume_suggestion(trial_id)` for a paused one; None (no more trials) once the optimizer stops;
- after each reported epoch the optimizer is told the value and asked again: the same trial
  CONTINUEs, another one means PAUSE (and it runs next), a stop means STOP; a trial that reached
  `max_epochs` is STOPped.

The training function must report `resource_attr` (the epoch, 1, 2, ...) and `metric` after every
epoch, write a checkpoint into `config["st_checkpoint_dir"]` every epoch, and on a resume continue
from it (Syne Tune's contract for pause/resume schedulers). Syne Tune's simulator backends
(`UserBlackboxBackend`, `BlackboxRepositoryBackend`) resume from the paused epoch by themselves.

Two ways to pause:
- `max_resource_attr=None` (default): a trial keeps running while it is continued, and PAUSE
  stops its process. Fast, but with real processes (`LocalBackend`, `PythonBackend`) a trial
  whose epochs are short next to the Tuner's polling can train and checkpoint epochs past its
  pause before it is stopped; its next report then skips epochs, and it is retired (logged).
- `max_resource_attr="max_epoch"` (Syne Tune's promotion style): every start and resume puts the
  one epoch the optimizer asked for into `config["max_epoch"]`; the function trains up to it and
  returns, and a continued trial is resumed with the next epoch. Exact with any backend, at the
  cost of one process start per epoch.

Supported: any `FreezeThawOptimizer` (CFBO or a baseline), several workers (`n_workers`),
maximised or minimised metrics, cost budgets (`cost_attr`, with `budget_unit="cost"`). A function
that restarts from scratch instead of its checkpoint re-reports old epochs, which are ignored.
Not supported: changing a configuration on resume, multi-objective metrics, restoring a pickled
`Tuner` with a surrogate that cannot be pickled. A trial that fails, reports a non-finite metric,
skips an epoch (e.g. trained past its pause and resumed from that later checkpoint) or returns
before `max_epochs` is retired: never suggested again, holding one step of budget.

Example:
    >>> from syne_tune import StoppingCriterion, Tuner
    >>> from freeze_thaw_bo.integrations.syne_tune import FreezeThawScheduler
    >>> scheduler = FreezeThawScheduler(
    ...     opt, metric="accuracy", resource_attr="epoch"
    ... )  # doctest: +SKIP
    >>> Tuner(
    ...     backend, scheduler, StoppingCriterion(max_wallclock_time=3600), n_workers=2
    ... ).run()  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from freeze_thaw_bo.integrations._common import performance_function, reported, require
from freeze_thaw_bo.integrations._driver import Decision, FreezeThawDriver
from freeze_thaw_bo.optimizer import FreezeThawOptimizer

require("syne_tune", "syne-tune")

from syne_tune.optimizer.scheduler import (  # noqa: E402
    SchedulerDecision,
    TrialScheduler,
    TrialSuggestion,
)

__all__ = ["FreezeThawScheduler"]

_DECISIONS = {
    Decision.CONTINUE: SchedulerDecision.CONTINUE,
    Decision.PAUSE: SchedulerDecision.PAUSE,
    Decision.STOP: SchedulerDecision.STOP,
}


class FreezeThawScheduler(TrialScheduler):
    """Syne Tune `TrialScheduler` driven by a `FreezeThawOptimizer` (pause/resume).

    Args:
        optimizer: decides what to train; its candidate pool defines the configurations.
        metric: the reported metric to optimise.
        mode: "max" or "min".
        resource_attr: the reported epoch (1, 2, ...).
        cost_attr: optional reported cost of the epoch, passed to `tell(cost=...)`.
        performance: maps the metric into the [0, 1] performance the optimizer maximises;
            default the metric ("max") or 1 − metric ("min").
        max_resource_attr: if given, every start/resume config carries the epoch to train up to
            under this key, and the function must return there (see the module docstring).
        random_seed: Syne Tune's master seed (the optimizer has its own).

    Attributes:
        trial_ids: Syne Tune trial id → optimizer trial id.
        driver: the ask/tell bookkeeping (`queue`, `running`, `retired`, `finished`).
    """

    def __init__(
        self,
        optimizer: FreezeThawOptimizer,
        *,
        metric: str,
        mode: str = "max",
        resource_attr: str = "epoch",
        cost_attr: str | None = None,
        performance: Callable[[float], float] | None = None,
        max_resource_attr: str | None = None,
        random_seed: int | None = None,
    ) -> None:
        super().__init__(random_seed=random_seed)
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"metric must be a non-empty string, got {metric!r}")
        self.driver = FreezeThawDriver(optimizer, performance_function(mode, performance))
        self.optimizer = optimizer
        self.metric = metric
        self.mode = mode
        self.resource_attr = resource_attr
        self.cost_attr = cost_attr
        self.max_resource_attr = max_resource_attr
        self.trial_ids: dict[int, int] = {}
        self._syne_ids: dict[int, int] = {}
        self._starting: int | None = None

    def suggest(self) -> TrialSuggestion | None:
        suggestion = self.driver.peek()
        if suggestion is None:
            self.driver.close()  # the Tuner asks no more once told None
            return None
        trial, epoch = self.driver.take()
        config = self.optimizer.config(trial)
        if self.max_resource_attr is not None:
            config[self.max_resource_attr] = epoch
        if trial in self._syne_ids:
            new_config = None if self.max_resource_attr is None else config
            return TrialSuggestion.resume_suggestion(self._syne_ids[trial], new_config)
        self._starting = trial
        return TrialSuggestion.start_suggestion(config)

    def on_trial_add(self, trial: Any) -> None:
        if self._starting is None:
            raise RuntimeError(f"Syne Tune added trial {trial.trial_id}, which was not suggested")
        self.trial_ids[trial.trial_id] = self._starting
        self._syne_ids[self._starting] = trial.trial_id
        self._starting = None

    def on_trial_result(self, trial: Any, result: dict[str, Any]) -> str:
        ours = self.trial_ids[trial.trial_id]
        epoch = int(reported(result, self.resource_attr))
        cost = None if self.cost_attr is None else reported(result, self.cost_attr)
        decision = self.driver.on_result(ours, epoch, reported(result, self.metric), cost)
        attr = self.max_resource_attr
        if decision is Decision.CONTINUE and attr is not None and epoch >= trial.config[attr]:
            decision = self.driver.defer(ours)  # its run ends here: resumed for the next epoch
        return _DECISIONS[decision]

    def on_trial_complete(self, trial: Any, result: dict[str, Any]) -> None:
        self.driver.on_end(self.trial_ids[trial.trial_id])

    def on_trial_error(self, trial: Any) -> None:
        self.driver.on_end(self.trial_ids[trial.trial_id])

    def metric_names(self) -> list[str]:
        return [self.metric]

    def metric_mode(self) -> str:
        return self.mode

    def metadata(self) -> dict[str, Any]:
        return {
            "scheduler_name": type(self).__name__,
            "scheduler_kwargs": {
                "method": self.optimizer.method,
                "budget": self.optimizer.budget,
                "max_epochs": self.optimizer.max_epochs,
                "resource_attr": self.resource_attr,
            },
            "metric_names": self.metric_names(),
            "metric_mode": self.metric_mode(),
        }
