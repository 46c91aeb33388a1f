"""One entry point for every method: :func:`select`, and :func:`compare` over methods and
budgets (each selection judged by a fresh model trained on it for the same budget)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from cads.baselines import BASELINE_METHODS, run_baseline
from cads.bilevel import run_bilevel, run_implicit
from cads.budget import ComputeBudget, InnerConfig, as_budget
from cads.config import SelectConfig
from cads.penalty import run_cads
from cads.selection import Selection, evaluate_selection
from cads.surrogate import LossSurrogate
from cads.task import SelectionTask

__all__ = ["BILEVEL_METHODS", "METHODS", "compare", "select"]

# method name -> (solver, level)
_SOLVERS = {
    "cads-e": (run_cads, "example"),
    "cads-s": (run_cads, "source"),
    "bilevel-e": (run_bilevel, "example"),
    "bilevel-s": (run_bilevel, "source"),
    "implicit-e": (run_implicit, "example"),
    "implicit-s": (run_implicit, "source"),
}
BILEVEL_METHODS = tuple(_SOLVERS)
METHODS = BILEVEL_METHODS + BASELINE_METHODS


def select(
    task: SelectionTask,
    budget: ComputeBudget | int,
    method: str = "cads-e",
    *,
    config: SelectConfig = SelectConfig(),
    inner: InnerConfig = InnerConfig(),
    size: int | None = None,
    seed: int = 0,
    surrogate: LossSurrogate | None = None,
    progress: bool | None = None,
) -> Selection:
    """Select training data of ``task`` for a compute ``budget`` (an int: that many steps).

    Args:
        method: ``"cads-e"`` / ``"cads-s"`` (the paper's method), ``"bilevel-e"`` /
            ``"bilevel-s"`` (Bilevel-CADS), ``"implicit-e"`` / ``"implicit-s"`` (implicit
            differentiation), or a baseline: ``"random"``, ``"full"``, ``"best-source"``,
            ``"loss"``, ``"el2n"``, ``"grand"``, ``"forgetting"``.
        config: outer-loop settings (bilevel methods; ``config.size`` imposes a size there).
        inner: how every model trains within the budget.
        size: examples a baseline keeps (default: ``config.init`` of the pool, the bilevel
            methods' starting expected size); for a bilevel method, the expected size imposed
            by the projection (as ``config.size``).
        surrogate: CADS's fitted ``l(|m|)``, to share it between CADS-E and CADS-S.

    Example:
        >>> import cads, torch
        >>> task = cads.toy_task(seed=0)
        >>> selection = cads.select(
        ...     task,
        ...     20,
        ...     "cads-s",
        ...     progress=False,
        ...     config=cads.SelectConfig(outer_steps=3, samples=2, fractions=(0.2, 0.9)),
        ... )
        >>> selection.level, len(selection.probabilities) == len(task.source_names)
        ('source', True)
    """
    budget = as_budget(budget)
    if method in _SOLVERS:
        solver, level = _SOLVERS[method]
        if size is not None:  # an expected size for the bilevel methods: the projection
            config = replace(config, size=float(size))
        extra = {"surrogate": surrogate} if solver is run_cads else {}
        return solver(task, budget, level, config, inner, seed=seed, progress=progress, **extra)
    if method in BASELINE_METHODS:
        size = round(config.init * len(task)) if size is None else size
        return run_baseline(task, method, budget, size, inner, seed=seed)
    raise ValueError(f"unknown method {method!r}; known: {METHODS}")


def _source_means(task: SelectionTask, selection: Selection) -> list[float] | None:
    if selection.level != "example":
        return None
    sums = torch.zeros(len(task.source_names), dtype=torch.float64)
    sums.index_add_(0, task.sources, selection.probabilities)
    return (sums / task.source_sizes()).tolist()


def compare(
    task: SelectionTask,
    budgets: Sequence[ComputeBudget | int],
    methods: Sequence[str] = ("cads-e", "cads-s", "random", "full", "best-source"),
    *,
    config: SelectConfig = SelectConfig(),
    inner: InnerConfig = InnerConfig(),
    size: int | None = None,
    seed: int = 0,
    progress: bool | None = None,
) -> list[dict]:
    """Every method at every budget: one row per pair with the selection's size, selection
    time, its examples per source (``composition``; ``mean_probability`` per source for the
    example-level methods) and the metrics of a fresh model trained on it (validation and
    test). CADS-E and
    CADS-S share one fitted surrogate per budget; their ``seconds`` leave its fit out (it is
    in the row's ``surrogate_seconds``)."""
    from cads.surrogate import fit_loss_surrogate

    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known: {METHODS}")
    if not budgets:
        raise ValueError("compare needs at least one budget")
    rows = []
    for budget in budgets:
        budget = as_budget(budget)
        surrogate, fit_seconds = None, 0.0
        if any(m.startswith("cads-") for m in methods):
            started = time.perf_counter()
            surrogate = fit_loss_surrogate(
                task,
                budget,
                inner,
                fractions=config.fractions,
                interpolation=config.interpolation,
                seed=seed,
            )
            fit_seconds = time.perf_counter() - started
        for method in methods:
            selection = select(
                task,
                budget,
                method,
                config=config,
                inner=inner,
                size=size,
                seed=seed,
                surrogate=surrogate,
                progress=progress,
            )
            metrics = evaluate_selection(task, selection, budget, inner, seed=seed)
            rows.append(
                {
                    "method": method,
                    "budget": budget.amount,
                    "unit": budget.unit,
                    "seconds": selection.seconds,
                    "surrogate_seconds": fit_seconds if method.startswith("cads-") else 0.0,
                    **metrics,
                    "probabilities": selection.probabilities.tolist()
                    if selection.level == "source"
                    else None,
                    # selected examples per source, and (example level) the mean probability
                    "composition": torch.bincount(
                        task.sources[selection.indices], minlength=len(task.source_names)
                    ).tolist(),
                    "mean_probability": _source_means(task, selection),
                }
            )
    return rows
