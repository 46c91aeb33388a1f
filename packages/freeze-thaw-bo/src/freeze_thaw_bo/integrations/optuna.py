"""CFBO's stopping rule for Optuna: a pruner and a study stopper (no freeze/thaw).

Optuna cannot resume a pruned trial (optuna/optuna#3351) and its sampler, not the pruner, chooses
the next configuration, so this mode uses only CFBO's *stopping rule*, applied to one trial
(`CFBOPruner`) or to the whole study (`CFBOStudyStopper`):

    R̂ ≥ δ(p) = BetaCDF(p; β, β)^γ,   β = e⁻¹, γ = log₀.₅ 0.2,

with R̂ = (Û_max − U_p)/(Û_max − Û_min) the estimated regret of the study's utility and p the
probability, under curves sampled from the surrogate, that continuing raises the utility above
U_p (`utility_acquisition`, `adaptive_threshold` in `freeze_thaw_bo.cfbo`).

What the study is, as CFBO sees it:
- every trial with reported values (`trial.report(value, step=epoch)`, any state) is a learning
  curve: its values in step order, one per epoch, mapped by `performance` (default: the value when
  the study maximises, `1 − value` when it minimises — an error rate) into the [0, 1] performance
  the surrogate models; a curve stops at its first non-finite value;
- its parameters are encoded into [0, 1]^D from `trial.distributions` (Float/Int, log or not →
  `Float`/`Integer`, Categorical → one-hot), over the union of every trial's distributions (ranges
  widened to cover all trials, choices merged); a parameter a trial did not sample (conditional
  spaces) is encoded as its lower bound or first choice, a one-valued range is left out;
- the spent budget b is the number of values reported across all trials, the utility's budget B
  is counted in the same epochs, and the history (for Û_max) is replayed in trial-number order,
  which is the order reports arrive in a sequential `study.optimize`.

`CFBOPruner.prune` prunes the current trial when the rule fires with p its own probability of
raising the utility; a trial reporting a non-finite value is pruned (as `MedianPruner` does), and
so is every trial once b reaches B. `CFBOStudyStopper` (a `study.optimize` callback) calls
`study.stop()` when the rule fires with p that of the configuration CFBO's acquisition would
pick among the running trials and `num_candidates` fresh configurations sampled uniformly from the
union space (a stand-in for what the sampler will propose next), or when b reaches B.

What it does not do: resume (thaw) a pruned trial; choose configurations (the study's sampler
does); count cost in seconds (only reported epochs); support multi-objective studies; share the
pruner's randomness across processes (each process samples with its own seeded generator).

Example:
    >>> import optuna
    >>> from freeze_thaw_bo import Utility
    >>> from freeze_thaw_bo.integrations.optuna import CFBOPruner, CFBOStudyStopper
    >>> utility = Utility(alpha=2**-4, budget=100)
    >>> pruner = CFBOPruner(utility, max_epochs=10, surrogate=my_surrogate)  # doctest: +SKIP
    >>> study = optuna.create_study(direction="maximize", pruner=pruner)  # doctest: +SKIP
    >>> stopper = CFBOStudyStopper(utility, max_epochs=10, surrogate=my_surrogate)  # doctest: +SKIP
    >>> study.optimize(objective, n_trials=50, callbacks=[stopper])  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from freeze_thaw_bo.cfbo import CFBO, adaptive_threshold, utility_acquisition
from freeze_thaw_bo.integrations._common import performance_function, require
from freeze_thaw_bo.space import Categorical, Float, Integer, SearchSpace
from freeze_thaw_bo.surrogates.base import CurveSurrogate
from freeze_thaw_bo.utility import Utility

optuna = require("optuna", "optuna")

__all__ = ["CFBOPruner", "CFBOStudyStopper", "RuleCheck"]

_NO_PARAMS = "_no_parameters"


@dataclass(frozen=True)
class RuleCheck:
    """One evaluation of the stopping rule.

    Attributes:
        trial: the Optuna trial number the probability is about (for the stopper: the running
            trial CFBO would continue, or None for a fresh configuration).
        spent: b, values reported across the study.
        regret: R̂ (−∞ while Û_max = Û_min; NaN when the budget is spent).
        probability: p.
        threshold: δ(p).
        fire: whether the rule fired (R̂ ≥ δ(p)), or the budget is spent.
    """

    trial: int | None
    spent: float
    regret: float
    probability: float
    threshold: float
    fire: bool


class _StudyRule:
    """What the pruner and the stopper share: the study as CFBO's observations, and the rule."""

    def __init__(
        self,
        utility: Utility,
        *,
        max_epochs: int,
        surrogate: CurveSurrogate | None = None,
        num_samples: int = 1000,
        performance: Callable[[float], float] | None = None,
        seed: int = 0,
    ) -> None:
        if not isinstance(utility, Utility):
            raise TypeError(f"utility must be a Utility, got {utility!r}")
        if int(max_epochs) != max_epochs or max_epochs < 1:
            raise ValueError(f"max_epochs must be an integer >= 1, got {max_epochs}")
        if int(num_samples) != num_samples or num_samples < 1:
            raise ValueError(f"num_samples must be an integer >= 1, got {num_samples}")
        if performance is not None and not callable(performance):
            raise TypeError(f"performance must be callable, got {performance!r}")
        if surrogate is None:
            from freeze_thaw_bo.surrogates.pfn import PFNSurrogate

            surrogate = PFNSurrogate()
        if not isinstance(surrogate, CurveSurrogate):
            raise TypeError(f"surrogate must implement sample_curves, got {surrogate!r}")
        self.utility = utility
        self.max_epochs = int(max_epochs)
        self.surrogate = surrogate
        self.num_samples = int(num_samples)
        self.performance = performance
        self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)
        self.rng = np.random.default_rng(self.seed)
        self.last_check: RuleCheck | None = None

    def _observe(self, study: Any, current: Any = None) -> list[tuple[Any, list[float]]]:
        """Every trial with a reported value (`current` replacing its stored copy), by number,
        with its learning curve in performances."""
        trials = {t.number: t for t in study.get_trials(deepcopy=False)}
        if current is not None:
            trials[current.number] = current
        to_performance = self._to_performance(study)
        observed = [(trials[n], self._curve(trials[n], to_performance)) for n in sorted(trials)]
        return [(t, c) for t, c in observed if c]

    def _to_performance(self, study: Any) -> Callable[[float], float]:
        if len(study.directions) != 1:
            raise ValueError("CFBO's stopping rule supports single-objective studies only")
        maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
        return performance_function("max" if maximize else "min", self.performance)

    def _curve(self, trial: Any, to_performance: Callable[[float], float]) -> list[float]:
        curve: list[float] = []
        for step in sorted(trial.intermediate_values):
            value = to_performance(trial.intermediate_values[step])
            if not math.isfinite(value):
                break
            curve.append(float(value))
        if len(curve) > self.max_epochs:
            raise ValueError(
                f"trial {trial.number} reported {len(curve)} values, more than max_epochs="
                f"{self.max_epochs}; report once per epoch"
            )
        return curve

    def _budget_check(
        self, observed: list[tuple[Any, list[float]]], trial: int | None = None
    ) -> RuleCheck | None:
        """A firing check when one more epoch would exceed B, else None."""
        spent = float(sum(len(c) for _, c in observed))
        if spent + 1 <= self.utility.budget + 1e-9:
            return None
        self.last_check = RuleCheck(trial, spent, math.nan, 0.0, 0.0, True)
        return self.last_check

    def _model(
        self, observed: list[tuple[Any, list[float]]], extra: int = 0
    ) -> tuple[CFBO, torch.Tensor, torch.Tensor]:
        """Replay the curves into a CFBO optimizer and score every configuration.

        Returns (optimizer, acquisition (N,), probability (N,)); rows are the observed trials,
        then `extra` fresh configurations sampled from the union space.
        """
        space, defaults = _union_space([t for t, _ in observed])
        configs = [_config(t, space, defaults) for t, _ in observed]
        configs += space.sample(extra, seed=self.rng) if extra else []
        opt = CFBO(
            space,
            self.utility,
            self.utility.budget,
            max_epochs=self.max_epochs,
            surrogate=self.surrogate,
            num_samples=self.num_samples,
            candidates=configs,
            stopping="beta",
            seed=self.seed,
        )
        for row, (_, curve) in enumerate(observed):  # trial-number order: the sequential history
            for epoch, value in enumerate(curve, start=1):
                opt.tell(row, epoch, value)
        samples = self.surrogate.sample_curves(opt.observations(), self.num_samples, self.generator)
        acquisition, probability = utility_acquisition(
            samples,
            torch.from_numpy(opt.lengths()),
            incumbent=opt.incumbent,
            spent=opt.budget_spent,
            step_costs=torch.from_numpy(opt.step_costs()),
            utility=self.utility,
        )
        return opt, acquisition, probability

    def _check(self, opt: CFBO, trial: int | None, probability: float) -> RuleCheck:
        self.last_check = RuleCheck(
            trial=trial,
            spent=opt.budget_spent,
            regret=opt.estimated_regret(),
            probability=probability,
            threshold=adaptive_threshold(probability),
            fire=opt._threshold_stop(probability),
        )
        return self.last_check


class CFBOPruner(_StudyRule, optuna.pruners.BasePruner):
    """Prune a trial when CFBO's stopping rule says continuing it is not worth its cost.

    Args:
        utility: U(b, y) = y − α·(b/B)^c; B is the study's budget in reported epochs.
        max_epochs: T, the most values one trial reports.
        surrogate: a `CurveSurrogate`; default the shipped learning-curve PFN.
        num_samples: sampled curves per trial (the paper's 1000).
        performance: maps a reported value into the [0, 1] performance CFBO maximises; default
            the value (maximize) or 1 − value (minimize).
        seed: seeds the surrogate's sampling.

    `last_check` holds the latest decision's numbers (`RuleCheck`). See the module docstring for
    what the pruner does and does not do.
    """

    def prune(self, study: Any, trial: Any) -> bool:
        if not trial.intermediate_values:
            return False
        last = trial.intermediate_values[max(trial.intermediate_values)]
        if not math.isfinite(self._to_performance(study)(last)):
            return True  # diverged, as MedianPruner treats NaN
        observed = self._observe(study, trial)
        if self._budget_check(observed, trial.number) is not None:
            return True
        row = next((i for i, (t, _) in enumerate(observed) if t.number == trial.number), None)
        if row is None:
            return True  # its first value was already non-finite
        if len(observed[row][1]) >= self.max_epochs:
            return False  # finished: nothing left to prune
        opt, _, probability = self._model(observed)
        return self._check(opt, trial.number, float(probability[row])).fire


class CFBOStudyStopper(_StudyRule):
    """`study.optimize` callback: `study.stop()` when CFBO's stopping rule ends the whole search.

    Args: as `CFBOPruner`, plus
        num_candidates: fresh configurations, sampled uniformly from the union of the trials'
            distributions, that stand for what the sampler may propose next.

    `last_check` holds the latest decision's numbers (`RuleCheck`); `stopped_at` the number of
    the trial after which it stopped the study (None until then).
    """

    def __init__(self, utility: Utility, *, num_candidates: int = 64, **kwargs: Any) -> None:
        super().__init__(utility, **kwargs)
        if int(num_candidates) != num_candidates or num_candidates < 1:
            raise ValueError(f"num_candidates must be an integer >= 1, got {num_candidates}")
        self.num_candidates = int(num_candidates)
        self.stopped_at: int | None = None

    def __call__(self, study: Any, trial: Any) -> None:
        if self.should_stop(study):
            self.stopped_at = trial.number
            study.stop()

    def should_stop(self, study: Any) -> bool:
        """Whether the rule ends the search now (budget spent, or R̂ ≥ δ(p) for CFBO's pick)."""
        observed = self._observe(study)
        if not observed:
            return False
        if self._budget_check(observed) is not None:
            return True
        opt, acquisition, probability = self._model(observed, extra=self.num_candidates)
        running = optuna.trial.TrialState.RUNNING
        available = np.ones(len(acquisition), dtype=bool)
        for row, (t, curve) in enumerate(observed):
            available[row] = t.state == running and len(curve) < self.max_epochs
        scores = acquisition.masked_fill(~torch.from_numpy(available), -math.inf)
        ties = torch.nonzero(scores == scores.max()).flatten()
        pick = int(ties[int(torch.argmax(probability[ties]))])  # ties: the likeliest to improve
        trial = observed[pick][0].number if pick < len(observed) else None
        return self._check(opt, trial, float(probability[pick])).fire


def _union_space(trials: list[Any]) -> tuple[SearchSpace, dict[str, Any]]:
    """The search space covering every trial's distributions, and a default per parameter."""
    merged: dict[str, Any] = {}
    for trial in trials:
        for name, dist in trial.distributions.items():
            merged[name] = _merge(name, merged.get(name), dist)
    dims: dict[str, Float | Integer | Categorical] = {}
    for name, (kind, a, b, log) in merged.items():
        if kind == "categorical":
            dims[name] = Categorical(tuple(a))
        elif a < b:
            dims[name] = (Integer if kind == "int" else Float)(a, b, log)
    if not dims:  # no parameter varies: one constant feature
        dims[_NO_PARAMS] = Categorical((None,))
    defaults = {
        name: dim.choices[0] if isinstance(dim, Categorical) else dim.low
        for name, dim in dims.items()
    }
    return SearchSpace(dims), defaults


def _merge(name: str, seen: tuple | None, dist: Any) -> tuple:
    """(kind, low or choices, high, log) of `dist`, widened to cover `seen`."""
    dists = optuna.distributions
    if isinstance(dist, dists.CategoricalDistribution):
        entry = ("categorical", tuple(dist.choices), None, False)
    elif isinstance(dist, dists.IntDistribution):
        entry = ("int", dist.low, dist.high, dist.log)
    elif isinstance(dist, dists.FloatDistribution):
        entry = ("float", dist.low, dist.high, dist.log)
    else:
        raise TypeError(f"parameter {name!r}: unsupported Optuna distribution {dist!r}")
    if seen is None:
        return entry
    if seen[0] != entry[0]:
        raise ValueError(f"parameter {name!r} is {seen[0]} in one trial and {entry[0]} in another")
    if entry[0] == "categorical":
        return (
            "categorical",
            seen[1] + tuple(c for c in entry[1] if c not in seen[1]),
            None,
            False,
        )
    return (entry[0], min(seen[1], entry[1]), max(seen[2], entry[2]), seen[3])


def _config(trial: Any, space: SearchSpace, defaults: dict[str, Any]) -> dict[str, Any]:
    return {name: trial.params.get(name, defaults[name]) for name in space.dimensions}
