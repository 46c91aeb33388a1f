"""The published epoch-level HPO tables, read from your copy as the CFBO authors read them.

No registry ships LCBench, TaskSet or PD1; these readers take the files in the form the authors
of CFBO (Lee et al., NeurIPS 2025, github.com/db-Lee/CFBO, `benchmark/*.py`) use them:

* LCBench: `data_2k.json` (2,000 configurations x 52 entries per dataset), LCBench's JSON layout.
* TaskSet: `taskset_chosen.json`, the same layout; its `Train/val_balanced_accuracy` log holds
  validation *losses* (the authors' reader reads that tag and treats it as a loss).
* PD1: syne-tune's blackbox-repository folder `pd1/` (`metadata.json`,
  `<task>-hyperparameters.parquet`, `<task>-objectives_evaluations.npy`, ...), which the authors
  load through `syne_tune.blackbox_repository.load_blackbox("pd1")`.

How each becomes values in [0, 1], higher is better (as in the authors' readers; entry 0 of every
curve is the value before training, y_0, kept as `initial_value` and dropped from the curve):

* LCBench: the balanced validation accuracy is already a fraction (LCBench's
  `Train/val_accuracy` is a percentage; the authors use the balanced one). With `normalize=True`
  (default) values and y_0 go through `LearningCurves.cfbo_normalized()`: LC-PFN's sigmoid with
  hard bounds [0, 1] and soft bounds [min, max] of the dataset's values and y_0.
* TaskSet: losses L >= 0 go through LC-PFN's map with hard bounds [0, inf), soft bounds
  [0, y_0] (y_0 the mean loss before training) and `minimize=True`: 1 at L = 0, about 0.5 at
  L = y_0/2, tending to 0 as L grows. A non-finite loss (a diverged run) scores 0.
* PD1: 1 - validation error rate (mean over seeds), each curve linearly interpolated onto
  `num_steps + 1` equally spaced points of its evaluations; point 0 is y_0 and the rest are steps
  1..num_steps (fidelity "epoch"). With `normalize=True` (default), `cfbo_normalized()` as LCBench.

Costs are the seconds of each step from the cumulative `time` log (LCBench) or
`metric_elapsed_time` (PD1, interpolated like the values), and 1.0 per step where a file records no
time (the authors count TaskSet and PD1 budgets in steps). Configurations are cut down to the
hyperparameters the authors search over, with the ranges each table was sampled from.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchdata._files import optional_import
from benchdata._pfn import pfn_normalize
from benchdata.curves import LearningCurves, read_lcbench_layout

logger = logging.getLogger(__name__)


def _float(low: float, high: float, log: bool = False) -> dict:
    return {"type": "float", "low": low, "high": high, "log": log}


def _int(low: int, high: int, log: bool = False) -> dict:
    return {"type": "int", "low": low, "high": high, "log": log}


# the authors' hyperparameters and log flags, over the ranges LCBench sampled from
LCBENCH_SPACE = {
    "batch_size": _int(16, 512, log=True),
    "learning_rate": _float(1e-4, 1e-1, log=True),
    "momentum": _float(0.1, 0.99),
    "weight_decay": _float(1e-5, 1e-1),
    "num_layers": _int(1, 5),
    "max_units": _int(64, 1024, log=True),
    "max_dropout": _float(0.0, 1.0),
}
# TaskSet's optimizer family (Metz et al. 2020); the authors' bounds are the sampled extremes
TASKSET_SPACE = {
    "learning_rate": _float(1e-8, 10.0, log=True),
    "beta1": _float(0.0, 1.0),
    "beta2": _float(0.0, 1.0),
    "epsilon": _float(1e-10, 1e3, log=True),
    "l1": _float(1e-8, 10.0, log=True),
    "l2": _float(1e-8, 10.0, log=True),
    "linear_decay": _float(1e-7, 1e-4, log=True),
    "exponential_decay": _float(1e-6, 1e-3, log=True),
}
# syne-tune's PD1 configuration space
PD1_SPACE = {
    "lr_initial_value": _float(1e-5, 10.0, log=True),
    "lr_power": _float(0.1, 2.0),
    "lr_decay_steps_factor": _float(0.01, 0.99),
    "one_minus_momentum": _float(1e-3, 1.0, log=True),
}
PD1_ERROR = "metric_valid_error_rate"
PD1_TIME = "metric_elapsed_time"


def lcbench_curves(
    path: str | Path, dataset: str | None = None, *, normalize: bool = True
) -> LearningCurves:
    """One dataset of LCBench's `data_2k.json` (or of a table saved by `LearningCurves.save`).

    Args:
        path: the JSON file, gzip'd or not.
        dataset: e.g. "segment"; may be omitted when the file holds one dataset.
        normalize: apply the CFBO authors' squashing (`LearningCurves.cfbo_normalized`); False
            keeps the balanced accuracies as they are.
    Returns:
        `LearningCurves`: values `(2000, 51)` for LCBench (fidelity "epoch", steps 1..51), test
        values from `Train/test_balanced_accuracy`, 7 hyperparameters (`LCBENCH_SPACE`).
        A file saved here keeps its own space, fidelity and steps.
    """
    table = read_lcbench_layout(path, dataset, what="LCBench table (data_2k.json)")
    if table.meta is not None:
        curves = table.curves(table.meta["space"], table.meta["fidelity"])
    else:
        curves = table.curves(LCBENCH_SPACE)
    return curves.cfbo_normalized() if normalize else curves


def taskset_curves(path: str | Path, dataset: str | None = None) -> LearningCurves:
    """One task of the CFBO authors' `taskset_chosen.json` (LCBench layout, losses).

    Args:
        path: the JSON file, gzip'd or not.
        dataset: e.g. "rnn_text_classification_family_seed8"; may be omitted for a single task.
    Returns:
        `LearningCurves` over 8 optimizer hyperparameters (`TASKSET_SPACE`), values the
        normalized losses (module docstring; (1000, 50) for the authors' file), no test values.
    """
    table = read_lcbench_layout(path, dataset, what="TaskSet table (taskset_chosen.json)")
    losses = np.where(np.isfinite(table.values), table.values, np.inf)
    initial = table.initial[np.isfinite(table.initial)]
    if initial.size == 0 or initial.mean() <= 0:
        raise ValueError(
            f"{table.path} [{table.name}]: TaskSet curves need a finite, positive mean loss "
            "before training (entry 0), the authors' soft upper bound"
        )
    y_0 = float(initial.mean())
    squash = pfn_normalize(lb=0.0, ub=np.inf, soft_lb=0.0, soft_ub=y_0, minimize=True)
    if (losses < 0).any():
        raise ValueError(f"{table.path} [{table.name}]: TaskSet losses must be >= 0")
    return table.curves(
        TASKSET_SPACE,
        values=np.clip(squash(losses), 0.0, 1.0),
        test_values=None,
        initial_value=float(np.clip(squash(y_0), 0.0, 1.0)),
    )


def _interpolate(curves: np.ndarray, points: int) -> np.ndarray:
    """Each row resampled linearly at `points` equally spaced positions of its entries."""
    x_old = np.arange(curves.shape[1])
    x_new = np.linspace(0, curves.shape[1] - 1, points)
    return np.stack([np.interp(x_new, x_old, row) for row in curves])


def pd1_curves(
    path: str | Path,
    task: str,
    *,
    normalize: bool = True,
    num_steps: int = 50,
    indices: Sequence[int] | None = None,
) -> LearningCurves:
    """One task of PD1 from syne-tune's blackbox-repository folder (needs pyarrow).

    Args:
        path: the `pd1` folder (`metadata.json` and per-task files).
        task: e.g. "imagenet_resnet_batch_size_512".
        normalize: apply `LearningCurves.cfbo_normalized` (the authors do); False keeps
            1 - error rate.
        num_steps: steps after interpolation (the authors use 50).
        indices: rows to keep (the authors keep a fixed list of 240, `VALID_INDICES` in their
            `benchmark/utils.py`); every kept curve must be complete. By default every
            configuration whose curve has no missing (NaN) evaluation is kept.
    Returns:
        `LearningCurves`, values `(N, num_steps)`, 4 hyperparameters (`PD1_SPACE`), no test values.
    """
    folder = Path(path)
    metadata_file = folder / "metadata.json"
    if not metadata_file.is_file():
        raise FileNotFoundError(
            f"PD1 blackbox not found at {folder}: pass syne-tune's `pd1` folder "
            f"(no {metadata_file.name} there)"
        )
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    metadata = json.loads(metadata_file.read_text())
    tasks, objectives = metadata.get("task_names", []), metadata.get("objectives_names", [])
    if task not in tasks:
        raise ValueError(f"task {task!r} is not in {folder}; it holds {len(tasks)}: {tasks[:20]}")
    if PD1_ERROR not in objectives:
        raise ValueError(f"{metadata_file}: no {PD1_ERROR!r} among objectives {objectives}")
    evaluations = np.load(folder / f"{task}-objectives_evaluations.npy", allow_pickle=False)
    if evaluations.ndim != 4 or evaluations.shape[-1] != len(objectives):
        raise ValueError(
            f"{task}-objectives_evaluations.npy: expected (configs, seeds, steps, "
            f"{len(objectives)} objectives), got {evaluations.shape}"
        )
    parquet = optional_import("pyarrow.parquet", "pd1")
    columns = parquet.read_table(folder / f"{task}-hyperparameters.parquet").to_pydict()
    missing = sorted(set(PD1_SPACE) - set(columns))
    if missing:
        raise ValueError(f"{task}-hyperparameters.parquet lacks the columns {missing}")
    error = evaluations[..., objectives.index(PD1_ERROR)].astype(np.float64).mean(axis=1)
    elapsed = None
    if PD1_TIME in objectives:
        elapsed = evaluations[..., objectives.index(PD1_TIME)].astype(np.float64).mean(axis=1)
    if len(columns[next(iter(PD1_SPACE))]) != error.shape[0]:
        raise ValueError(f"{task}: the hyperparameters and evaluations differ in row count")
    complete = np.isfinite(error).all(axis=1)
    if elapsed is not None:
        complete &= np.isfinite(elapsed).all(axis=1)
    if indices is not None:
        rows = np.asarray(indices, dtype=np.int64)
        if rows.size == 0 or rows.min() < 0 or rows.max() >= error.shape[0]:
            raise ValueError(f"indices must lie in 0..{error.shape[0] - 1}")
        if not complete[rows].all():
            raise ValueError(f"{task}: rows {rows[~complete[rows]][:10].tolist()} are incomplete")
    else:
        rows = np.flatnonzero(complete)
        if rows.size < error.shape[0]:
            logger.info(
                "%s: %d of %d curves are incomplete and dropped",
                task,
                error.shape[0] - rows.size,
                error.shape[0],
            )
        if rows.size == 0:
            raise ValueError(f"{task}: no configuration has a complete curve")
    accuracy = _interpolate(1.0 - error[rows], num_steps + 1)
    costs = np.ones((rows.size, num_steps))
    if elapsed is not None:  # cumulative seconds, interpolated like the values
        costs = np.diff(_interpolate(elapsed[rows], num_steps + 1)[:, 1:], axis=1, prepend=0.0)
    configs = tuple(
        {name: float(columns[name][row]) for name in PD1_SPACE} for row in rows.tolist()
    )
    curves = LearningCurves(
        name=task,
        fidelity="epoch",
        configs=configs,
        space=PD1_SPACE,
        values=np.clip(accuracy[:, 1:], 0.0, 1.0),
        costs=costs,
        test_values=None,
        steps=np.arange(1, num_steps + 1),
        initial_value=float(np.clip(accuracy[:, 0].mean(), 0.0, 1.0)),
    )
    return curves.cfbo_normalized() if normalize else curves
