"""Replaying a method on a table of real learning curves, and scoring it by normalized regret.

A table (benchdata's `LearningCurves`: configurations × steps of validation values and costs)
answers every `ask` of an optimizer by looking the value up, as the authors' `run_bo.py` does.
Each run is scored by the normalized regret of utility after every step b:

    r_b = (U_max − U(b, ỹ_b)) / (U_max − U_min),

with U_max = max over configurations n and epochs e of U(e, y_{n,e}) (the best any single
configuration trained alone from scratch could reach) and U_min = min over n of U(B, y_{n,1}),
the authors' bounds. The run continues past the method's stop signal so regret-versus-budget
curves cover the whole budget; `stop_budget` records where the method wanted to stop.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from freeze_thaw_bo.optimizer import FreezeThawOptimizer
from freeze_thaw_bo.space import SearchSpace
from freeze_thaw_bo.utility import Utility

__all__ = [
    "CurveTable",
    "RunResult",
    "make_optimizer",
    "oracle_bounds",
    "rescore",
    "run_on_table",
]


@dataclass(frozen=True)
class CurveTable:
    """A benchmark: candidate configurations with their whole learning curves.

    Attributes:
        name: the task's name.
        space: the search space (encodes the configurations).
        configs: N configurations.
        values: (N, T) validation values in [0, 1], higher is better.
        costs: (N, T) cost of each epoch (1 everywhere when unknown).
        initial_value: every curve's value before training (y_0), when the table records it;
            CFBO's PFN reads it as its start token, as the authors' `y_0`.
    """

    name: str
    space: SearchSpace
    configs: tuple[dict, ...]
    values: np.ndarray
    costs: np.ndarray
    initial_value: float | None = None

    def __post_init__(self) -> None:
        values = np.asarray(self.values, dtype=np.float64)
        costs = np.asarray(self.costs, dtype=np.float64)
        if values.ndim != 2 or values.shape[0] != len(self.configs):
            raise ValueError(
                f"values must be ({len(self.configs)}, T) for {len(self.configs)} configurations, "
                f"got {values.shape}"
            )
        if costs.shape != values.shape:
            raise ValueError(f"costs {costs.shape} and values {values.shape} differ in shape")
        if not np.isfinite(values).all() or not np.isfinite(costs).all():
            raise ValueError(f"{self.name}: the table holds non-finite values or costs")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "costs", costs)

    @classmethod
    def from_curves(
        cls, curves: Any, *, max_configs: int | None = None, seed: int = 0, max_dim: int = 16
    ):
        """From benchdata's `LearningCurves`, optionally a seeded subset of `max_configs` rows.

        The space is narrowed to at most `max_dim` encoded dimensions (wide categoricals become
        ordinal; see `SearchSpace.narrowed`), what the shipped PFN reads.
        """
        index = np.arange(len(curves.configs))
        if max_configs is not None and max_configs < index.size:
            index = np.sort(np.random.default_rng(seed).choice(index, max_configs, replace=False))
        return cls(
            name=curves.name,
            space=SearchSpace.from_dict(curves.space).narrowed(max_dim),
            configs=tuple(curves.configs[i] for i in index),
            values=np.asarray(curves.values)[index],
            costs=np.asarray(curves.costs)[index],
            initial_value=getattr(curves, "initial_value", None),
        )

    @property
    def max_epochs(self) -> int:
        return self.values.shape[1]


def oracle_bounds(values: np.ndarray, utility: Utility) -> tuple[float, float]:
    """(U_max, U_min) of a table: U_max = max_{n,e} U(e, y_{n,e}); U_min = min_n U(B, y_{n,1})."""
    epochs = np.arange(1, values.shape[1] + 1)
    u_max = float(np.max(utility(np.broadcast_to(epochs, values.shape), values)))
    u_min = float(np.min(utility(utility.budget, values[:, 0])))
    return u_max, u_min


@dataclass
class RunResult:
    """One method's run on one table: per-step incumbents, utilities and normalized regrets."""

    method: str
    task: str
    alpha: float
    c: float
    seed: int
    budget: float
    incumbents: list[float] = field(default_factory=list)
    utilities: list[float] = field(default_factory=list)
    regrets: list[float] = field(default_factory=list)
    spent: list[float] = field(default_factory=list)
    trials: list[int] = field(default_factory=list)
    stop_budget: float | None = None
    seconds: float = 0.0

    @property
    def regret_at_stop(self) -> float:
        """Normalized regret where the method stopped (at the end when it never did)."""
        if not self.regrets:
            return math.nan
        if self.stop_budget is None:
            return self.regrets[-1]
        step = int(np.searchsorted(self.spent, self.stop_budget, side="right")) - 1
        return self.regrets[max(step, 0)]

    @property
    def best_stop_regret(self) -> float:
        """The lowest regret anywhere along this run: where an oracle would have stopped it."""
        return min(self.regrets) if self.regrets else math.nan

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["regret_at_stop"] = self.regret_at_stop
        out["best_stop_regret"] = self.best_stop_regret
        return out


def make_optimizer(
    method: str,
    table: CurveTable,
    utility: Utility,
    *,
    budget: float,
    seed: int = 0,
    **kwargs: Any,
) -> FreezeThawOptimizer:
    """An optimizer of the registered `method` over the table's configurations."""
    from freeze_thaw_bo.methods import method_class

    cls = method_class(method)
    if method in ("cfbo", "ifbo") and "surrogate" not in kwargs:
        from freeze_thaw_bo.surrogates.pfn import PFNSurrogate

        kwargs["surrogate"] = PFNSurrogate(initial_value=table.initial_value)
    common = {
        "max_epochs": table.max_epochs,
        "candidates": list(table.configs),
        "seed": seed,
        **kwargs,
    }
    return cls(table.space, budget=budget, utility=utility, **common)


def run_on_table(
    optimizer: FreezeThawOptimizer, table: CurveTable, *, stop_early: bool = False
) -> RunResult:
    """Replay `optimizer` on `table` until the budget (or, with `stop_early`, its stop signal)."""
    if optimizer.budget_unit != "epoch":
        raise ValueError("tables are replayed with budgets in epochs (budget_unit='epoch')")
    if [dict(c) for c in table.configs] != optimizer.candidates:
        raise ValueError("the optimizer's candidates are not the table's configurations")
    utility = optimizer.utility
    u_max, u_min = oracle_bounds(table.values, utility)
    span = u_max - u_min if u_max > u_min else 1.0
    result = RunResult(
        method=optimizer.method,
        task=table.name,
        alpha=utility.alpha,
        c=utility.c,
        seed=optimizer.seed,
        budget=optimizer.budget,
    )
    start = time.perf_counter()
    while True:
        trial, epoch = optimizer.ask(ignore_stop=not stop_early)
        if trial is None:
            break
        cost = float(table.costs[trial, epoch - 1])
        optimizer.tell(trial, epoch, float(table.values[trial, epoch - 1]), cost=cost)
        u = float(utility(optimizer.budget_spent, optimizer.incumbent))
        result.incumbents.append(optimizer.incumbent)
        result.utilities.append(u)
        result.regrets.append((u_max - u) / span)
        result.spent.append(optimizer.budget_spent)
        result.trials.append(trial)
    result.stop_budget = optimizer.stop_budget
    result.seconds = time.perf_counter() - start
    return result


def rescore(
    result: RunResult, table: CurveTable, utility: Utility, *, threshold: float = 0.2
) -> RunResult:
    """The same trajectory scored under another utility, with the fixed-threshold stopping rule.

    A baseline's choices do not depend on the utility (it enters only through the stopping rule),
    so one run per seed serves every α: this recomputes the utilities, the normalized regrets and
    where the rule "estimated regret >= threshold" would have fired, exactly as the optimizer
    evaluates it before each further step (tested against direct runs).
    """
    if not math.isclose(utility.budget, result.budget):
        raise ValueError(f"the utility's budget {utility.budget} is not the run's {result.budget}")
    u_max_table, u_min_table = oracle_bounds(table.values, utility)
    span = u_max_table - u_min_table if u_max_table > u_min_table else 1.0
    spent = np.asarray(result.spent)
    utilities = [float(u) for u in utility(spent, np.asarray(result.incumbents))]
    stop_budget = None
    if utilities:
        u_min = float(utility(utility.budget, result.incumbents[0]))
        u_max = -math.inf
        for k in range(len(utilities) - 1):  # the rule is checked before steps 2..n
            u_max = max(u_max, utilities[k])
            if (
                not np.isclose(u_max, u_min)
                and (u_max - utilities[k]) / (u_max - u_min) >= threshold
            ):
                stop_budget = float(spent[k])
                break
    return RunResult(
        method=result.method,
        task=result.task,
        alpha=utility.alpha,
        c=utility.c,
        seed=result.seed,
        budget=result.budget,
        incumbents=list(result.incumbents),
        utilities=utilities,
        regrets=[(u_max_table - u) / span for u in utilities],
        spent=list(result.spent),
        trials=list(result.trials),
        stop_budget=stop_budget,
        seconds=result.seconds,
    )
