"""Every method on one table, side by side: regret of utility versus budget, and stopping points.

CFBO is run once per (α, seed): the utility drives its choices. A baseline's choices ignore the
utility, so it runs once per seed and `rescore` scores that trajectory under each α (with the
baselines' fixed-threshold stopping rule), exactly as separate runs would.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from freeze_thaw_bo.benchmark import CurveTable, RunResult, make_optimizer, rescore, run_on_table
from freeze_thaw_bo.methods import METHODS
from freeze_thaw_bo.utility import Utility

__all__ = ["Comparison", "compare_methods"]

logger = logging.getLogger(__name__)

#: methods whose choices depend on the utility (run once per α)
UTILITY_AWARE = frozenset({"cfbo"})


@dataclass
class Comparison:
    """Runs of several methods on one table: `runs[(method, alpha)]` lists one result per seed."""

    task: str
    budget: float
    c: float
    runs: dict[tuple[str, float], list[RunResult]]

    def mean_regret(self, method: str, alpha: float) -> np.ndarray:
        """(steps,) mean normalized regret over seeds (shorter runs padded with their last)."""
        curves = [r.regrets for r in self.runs[(method, alpha)]]
        steps = max(len(c) for c in curves)
        padded = [np.pad(c, (0, steps - len(c)), mode="edge") for c in curves]
        return np.mean(padded, axis=0)

    def summary_rows(self) -> list[dict[str, Any]]:
        """One row per (method, α): final regret, regret at the stop, oracle stop regret."""
        rows = []
        ordered = sorted(self.runs.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        for (method, alpha), results in ordered:
            rows.append(
                {
                    "task": self.task,
                    "method": method,
                    "alpha": alpha,
                    "c": self.c,
                    "final_regret": float(np.mean([r.regrets[-1] for r in results])),
                    "mean_regret": float(np.mean([np.mean(r.regrets) for r in results])),
                    "regret_at_stop": float(np.mean([r.regret_at_stop for r in results])),
                    "best_stop_regret": float(np.mean([r.best_stop_regret for r in results])),
                    "stop_budget": float(np.mean([_stop(r) for r in results])),
                    "seconds": float(np.mean([r.seconds for r in results])),
                    "seeds": len(results),
                }
            )
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "budget": self.budget,
            "c": self.c,
            "summary": self.summary_rows(),
            "runs": [r.to_dict() for results in self.runs.values() for r in results],
        }


def compare_methods(
    table: CurveTable,
    *,
    methods: Sequence[str] = METHODS,
    alphas: Sequence[float] = (0.0, 2**-6, 2**-4, 2**-2),
    c: float = 1.0,
    budget: float = 300,
    seeds: Sequence[int] = (0,),
    method_kwargs: dict[str, dict[str, Any]] | None = None,
) -> Comparison:
    """Run `methods` on `table` for every α and seed; see the module docstring."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    if not alphas:
        raise ValueError("alphas is empty")
    method_kwargs = method_kwargs or {}
    runs: dict[tuple[str, float], list[RunResult]] = {}
    for method in methods:
        kwargs = method_kwargs.get(method, {})
        for seed in seeds:
            if method in UTILITY_AWARE:
                for alpha in alphas:
                    opt = make_optimizer(
                        method, table, Utility(alpha, c, budget), budget=budget, seed=seed, **kwargs
                    )
                    result = run_on_table(opt, table)
                    runs.setdefault((method, alpha), []).append(result)
                    _log(result)
                continue
            utility = Utility(0.0, c, budget)
            opt = make_optimizer(method, table, utility, budget=budget, seed=seed, **kwargs)
            base = run_on_table(opt, table)
            for alpha in alphas:
                result = rescore(base, table, Utility(alpha, c, budget))
                runs.setdefault((method, alpha), []).append(result)
            _log(base)
    return Comparison(task=table.name, budget=float(budget), c=float(c), runs=runs)


def _stop(result: RunResult) -> float:
    return result.budget if result.stop_budget is None else result.stop_budget


def _log(result: RunResult) -> None:
    logger.info(
        "%s %s alpha=%g seed=%d: final regret %.4f, stop at %s, %.1f s",
        result.task,
        result.method,
        result.alpha,
        result.seed,
        result.regrets[-1] if result.regrets else math.nan,
        result.stop_budget,
        result.seconds,
    )


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The summary rows as a Markdown table."""
    lines = [
        "| task | α | method | regret at the end ×100 | mean regret ×100 | stops at "
        "| regret at stop ×100 | oracle stop regret ×100 |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['task']} | {row['alpha']:.4g} | {row['method']} "
            f"| {100 * row['final_regret']:.2f} | {100 * row['mean_regret']:.2f} "
            f"| {row['stop_budget']:.0f} "
            f"| {100 * row['regret_at_stop']:.2f} | {100 * row['best_stop_regret']:.2f} |"
        )
    return "\n".join(lines)


def write_comparison(comparison: Comparison, out: Path, *, plots: bool = True) -> list[str]:
    """`comparison.json`, `comparison.md` and one regret-versus-budget PNG per α into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    stem = comparison.task.replace("/", "_").replace(":", "_")
    (out / f"{stem}.json").write_text(json.dumps(comparison.to_dict(), indent=1))
    (out / f"{stem}.md").write_text(markdown_table(comparison.summary_rows()) + "\n")
    figures: list[str] = []
    if not plots:
        return figures
    from kernels_common.plotting import plot_curves

    for alpha in sorted({a for _, a in comparison.runs}):
        curves = {}
        for method, a in comparison.runs:
            if a == alpha:
                regret = comparison.mean_regret(method, alpha)
                curves[method] = (list(range(1, regret.size + 1)), regret.tolist())
        name = f"{stem}_regret_alpha{alpha:.4g}.png"
        plot_curves(
            curves,
            out / name,
            title=f"{comparison.task}: α = {alpha:.4g}, c = {comparison.c:g}",
            xlabel="budget spent (epochs)",
            ylabel="normalized regret of utility",
            logy=False,
        )
        figures.append(name)
    return figures
