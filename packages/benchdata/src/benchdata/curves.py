"""Learning-curve tables: configurations × steps of validation values and costs.

A `LearningCurves` table is what freeze-thaw hyperparameter optimization replays: every
configuration's whole curve is known in advance, and an optimizer "trains" a configuration one step
further by looking the next value and its cost up. The tables here all come from real training:

* `fashion_mnist_curves()`: 200 MLPs trained for 30 epochs on Fashion-MNIST by
  `benchdata curves-sweep`, shipped inside the wheel;
* `lcdb_curves()`: learning curves over training-set size from LCDB (PyPI `lcdb`);
* `lcbench_curves()`, `taskset_curves()`, `pd1_curves()`: the published tables, from your copy.

Files use LCBench's JSON layout (`data_2k.json`), optionally gzip-compressed, so one reader serves
LCBench, the TaskSet table the CFBO authors distribute in that layout, and the tables saved here:

    {dataset: {"0": {"config": {...},
                     "log": {"Train/val_balanced_accuracy": [y_0, y_1, ..., y_T],
                             "Train/test_balanced_accuracy": [...],   # optional
                             "time": [t_0, t_1, ..., t_T],            # cumulative seconds
                             "epoch": [0, 1, ..., T]},                 # or "train_size"
                     "results": {}},
               "1": {...}, ...},
     "__benchdata__": {dataset: {"fidelity": ..., "space": {...}}}}   # only in files saved here

Entry 0 of every log is the state before training (LCBench evaluates each network before its first
epoch); the CFBO authors read it as the initial value y_0 and drop it from the curve.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.resources
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from benchdata._pfn import pfn_normalize
from kernels_common.cli import atomic_file

FIDELITIES = ("epoch", "train_size")
VALUE_TAG = "Train/val_balanced_accuracy"
TEST_TAG = "Train/test_balanced_accuracy"
TIME_TAG = "time"
META_KEY = "__benchdata__"
FASHION_MNIST_CURVES = "fashion_mnist_mlp_curves.json.gz"

_GZIP_MAGIC = b"\x1f\x8b"


def _check_space(space: Any) -> None:
    if not isinstance(space, dict) or not space:
        raise ValueError(f"space must be a non-empty dict of hyperparameters, got {space!r}")
    for name, entry in space.items():
        kind = entry.get("type") if isinstance(entry, dict) else None
        if kind in ("float", "int"):
            low, high = entry.get("low"), entry.get("high")
            if not all(isinstance(b, int | float) and math.isfinite(b) for b in (low, high)):
                raise ValueError(f"space[{name!r}]: low and high must be finite numbers")
            if not low < high:
                raise ValueError(f"space[{name!r}]: need low < high, got {low} and {high}")
            if entry.get("log", False) and low <= 0:
                raise ValueError(f"space[{name!r}]: a log-scaled range needs low > 0, got {low}")
            if kind == "int" and (int(low) != low or int(high) != high):
                raise ValueError(f"space[{name!r}]: int bounds must be whole, got {low}, {high}")
        elif kind == "categorical":
            choices = entry.get("choices")
            if not isinstance(choices, list | tuple) or not choices:
                raise ValueError(f"space[{name!r}]: choices must be a non-empty list")
            if len({json.dumps(c) for c in choices}) != len(choices):
                raise ValueError(f"space[{name!r}]: choices repeat: {list(choices)}")
        else:
            raise ValueError(
                f"space[{name!r}] = {entry!r}: expected {{'type': 'float'|'int', 'low', 'high', "
                "'log'}} or {'type': 'categorical', 'choices': [...]}"
            )


def _check_config(index: int, config: Any, space: dict) -> None:
    if not isinstance(config, dict):
        raise ValueError(f"configs[{index}] must be a dict, got {type(config).__name__}")
    if set(config) != set(space):
        missing, unknown = sorted(set(space) - set(config)), sorted(set(config) - set(space))
        raise ValueError(
            f"configs[{index}] must name exactly the space's hyperparameters: "
            f"missing {missing}, unknown {unknown}"
        )
    for name, entry in space.items():
        value = config[name]
        if entry["type"] == "categorical":
            if value not in entry["choices"]:
                raise ValueError(
                    f"configs[{index}][{name!r}] = {value!r} is not one of {entry['choices']}"
                )
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"configs[{index}][{name!r}] = {value!r} is not a number")
        if not entry["low"] <= value <= entry["high"]:
            raise ValueError(
                f"configs[{index}][{name!r}] = {value} is outside [{entry['low']}, {entry['high']}]"
            )
        if entry["type"] == "int" and int(value) != value:
            raise ValueError(f"configs[{index}][{name!r}] = {value} is not a whole number")


def _frozen_matrix(value: Any, what: str, shape: tuple[int, ...]) -> np.ndarray:
    array = np.array(value, dtype=np.float64)
    if array.shape != shape:
        raise ValueError(f"{what} must have shape {shape}, got {array.shape}")
    bad = np.argwhere(~np.isfinite(array))
    if bad.size:
        raise ValueError(
            f"{what} must be finite; {len(bad)} entries are NaN or infinite, first at "
            f"{tuple(int(i) for i in bad[0])}"
        )
    array.setflags(write=False)
    return array


def _check_range(array: np.ndarray, what: str, low: float, high: float | None) -> None:
    outside = (array < low) | (array > high if high is not None else False)
    if outside.any():
        where = tuple(int(i) for i in np.argwhere(outside)[0])
        allowed = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{what} must be {allowed}; {what}[{where}] = {array[where]}")


@dataclasses.dataclass(frozen=True, eq=False)
class LearningCurves:
    """Learning curves of `N` configurations over `T` steps of one fidelity.

    Attributes:
        name: the task (dataset) name.
        fidelity: "epoch" (steps are epochs) or "train_size" (steps are training-set sizes).
        configs: `N` configurations, each a JSON-able dict naming exactly the space's
            hyperparameters.
        space: per hyperparameter `{"type": "float"|"int", "low", "high", "log": bool}` or
            `{"type": "categorical", "choices": [...]}`; every configuration lies inside it.
        values: float64 `(N, T)` validation metric in [0, 1], higher is better, no NaN.
        costs: float64 `(N, T)` cost of each step alone (seconds of that step, not cumulative;
            1.0 per step where a table records no time), finite and >= 0.
        test_values: float64 `(N, T)` test metric on the same scale as `values`, or None.
        steps: float64 `(T,)` strictly increasing: epochs 1..T or training-set sizes.
        initial_value: the mean value of the configurations before training, on the scale of
            `values` (CFBO's y_0), or None where the table has no such point.

    Arrays are read-only copies. Example:
        >>> curves = fashion_mnist_curves()
        >>> curves.values.shape, curves.encode().shape
        ((200, 30), (200, 11))
    """

    name: str
    fidelity: str
    configs: tuple[dict, ...]
    space: dict
    values: np.ndarray
    costs: np.ndarray
    test_values: np.ndarray | None
    steps: np.ndarray
    initial_value: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or self.name == META_KEY:
            raise ValueError(f"name must be a non-empty string other than {META_KEY!r}")
        if self.fidelity not in FIDELITIES:
            raise ValueError(f"fidelity must be one of {FIDELITIES}, got {self.fidelity!r}")
        _check_space(self.space)
        configs = tuple(self.configs)
        if not configs:
            raise ValueError("configs is empty: a table needs at least one configuration")
        for index, config in enumerate(configs):
            _check_config(index, config, self.space)
        try:
            json.dumps([configs, self.space])
        except (TypeError, ValueError) as error:
            raise ValueError(f"configs and space must be JSON-able: {error}") from None
        steps = np.array(self.steps, dtype=np.float64)
        if steps.ndim != 1 or steps.size == 0:
            raise ValueError(f"steps must be a non-empty 1-d array, got shape {steps.shape}")
        shape = (len(configs), steps.size)
        values = _frozen_matrix(self.values, "values", shape)
        costs = _frozen_matrix(self.costs, "costs", shape)
        steps = _frozen_matrix(steps, "steps", shape[1:])
        _check_range(values, "values", 0.0, 1.0)
        _check_range(costs, "costs", 0.0, None)
        if not (steps > 0).all() or not (np.diff(steps) > 0).all():
            raise ValueError(f"steps must be positive and strictly increasing, got {steps}")
        test_values = self.test_values
        if test_values is not None:
            test_values = _frozen_matrix(test_values, "test_values", shape)
            _check_range(test_values, "test_values", 0.0, 1.0)
        initial = self.initial_value
        if initial is not None:
            initial = float(initial)
            if not 0.0 <= initial <= 1.0:  # NaN fails too
                raise ValueError(f"initial_value must be None or in [0, 1], got {initial}")
        for field, value in (
            ("configs", configs),
            ("values", values),
            ("costs", costs),
            ("test_values", test_values),
            ("steps", steps),
            ("initial_value", initial),
        ):
            object.__setattr__(self, field, value)

    @property
    def n_configs(self) -> int:
        return self.values.shape[0]

    @property
    def n_steps(self) -> int:
        return self.values.shape[1]

    def encode(self) -> np.ndarray:
        """The configurations in the unit cube: float64 `(N, D)` in [0, 1].

        Floats and ints are min-max scaled over the space's `[low, high]`, in log space where
        `log` is true; a categorical becomes a one-hot block of `len(choices)` columns. Columns
        follow the space's order. (The CFBO authors min-max scale over the observed
        configurations instead; the two differ by an affine map per column.)
        """
        columns = []
        for name, entry in self.space.items():
            raw = [config[name] for config in self.configs]
            if entry["type"] == "categorical":
                keys = [json.dumps(c) for c in entry["choices"]]
                index = np.array([keys.index(json.dumps(v)) for v in raw])
                columns.append(np.eye(len(keys))[index])
                continue
            scale = np.log if entry.get("log", False) else np.asarray
            low, high = scale(np.array([entry["low"], entry["high"]], dtype=np.float64))
            column = (scale(np.array(raw, dtype=np.float64)) - low) / (high - low)
            columns.append(np.clip(column, 0.0, 1.0)[:, None])
        return np.concatenate(columns, axis=1)

    def cfbo_normalized(self) -> LearningCurves:
        """The table with values squashed as the CFBO authors do for LCBench and PD1.

        Their reader maps every value v (and y_0) through LC-PFN's `pfn_normalize` with hard
        bounds [0, 1] and soft bounds [min, max] of the table's values and y_0: a sigmoid that is
        nearly linear between the soft bounds and sends 0 to 0 and 1 to 1. Order and [0, 1] are
        kept; the table's own range is spread out. Test values go through the same map.
        """
        pool = self.values.ravel()
        if self.initial_value is not None:
            pool = np.append(pool, self.initial_value)
        soft_lb, soft_ub = float(pool.min()), float(pool.max())
        squash = pfn_normalize(lb=0.0, ub=1.0, soft_lb=soft_lb, soft_ub=soft_ub, minimize=False)

        def unit(x):  # the ends of the sigmoid may round a hair outside [0, 1]
            return np.clip(squash(x), 0.0, 1.0)

        return dataclasses.replace(
            self,
            values=unit(self.values),
            test_values=None if self.test_values is None else unit(self.test_values),
            initial_value=None if self.initial_value is None else float(unit(self.initial_value)),
        )

    def save(self, path: str | Path) -> None:
        """Write the table in LCBench's JSON layout (module docstring), gzip'd if `path` ends
        with `.gz`. The file appears whole or not at all; `load` reads it back exactly (costs up
        to the rounding of their cumulative sums)."""
        path = Path(path)
        initial = self.initial_value
        time = np.concatenate([np.zeros((self.n_configs, 1)), np.cumsum(self.costs, axis=1)], 1)
        steps = [0, *(int(s) if float(s).is_integer() else float(s) for s in self.steps)]
        records = {}
        for i, config in enumerate(self.configs):
            log: dict[str, list] = {VALUE_TAG: [initial, *self.values[i].tolist()]}
            if self.test_values is not None:
                log[TEST_TAG] = [None, *self.test_values[i].tolist()]
            log[TIME_TAG] = time[i].tolist()
            log[self.fidelity] = steps
            records[str(i)] = {"config": config, "log": log, "results": {}}
        document = {
            self.name: records,
            META_KEY: {self.name: {"fidelity": self.fidelity, "space": self.space}},
        }
        data = json.dumps(document, separators=(",", ":")).encode()
        if path.suffix == ".gz":
            data = gzip.compress(data, mtime=0)  # the same table gives the same bytes
        with atomic_file(path) as temporary:
            temporary.write_bytes(data)

    @classmethod
    def load(cls, path: str | Path, dataset: str | None = None) -> LearningCurves:
        """A table written by `save` (`dataset` may be omitted when the file holds one).

        Published LCBench / TaskSet files carry no search space: read them with
        `lcbench_curves` / `taskset_curves`.
        """
        table = read_lcbench_layout(path, dataset, what="learning-curve table")
        if table.meta is None:
            raise ValueError(
                f"{table.path} holds no benchdata metadata ({META_KEY!r}), so its search space "
                "is unknown: a published LCBench or TaskSet file is read with lcbench_curves() "
                "or taskset_curves()"
            )
        return table.curves(table.meta["space"], table.meta["fidelity"])


@dataclasses.dataclass(frozen=True)
class LayoutTable:
    """One dataset of an LCBench-layout file, as read: entry 0 (before training) kept apart."""

    path: Path
    name: str
    configs: list[dict]
    values: np.ndarray  # (N, T)
    initial: np.ndarray  # (N,), NaN where the file has null
    test_values: np.ndarray | None
    costs: np.ndarray  # (N, T), 1.0 per step without a "time" log
    steps: np.ndarray | None  # from the fidelity's log in files saved here
    meta: dict | None

    def curves(self, space: dict, fidelity: str = "epoch", **changes: Any) -> LearningCurves:
        """`LearningCurves` of this table, the configurations cut down to the space's keys."""
        configs = []
        for config_id, config in enumerate(self.configs):
            missing = sorted(set(space) - set(config))
            if missing:
                raise ValueError(f"{self.path}: config {config_id} lacks {missing}")
            configs.append({k: _as_space_type(config[k], space[k]) for k in space})
        finite = self.initial[np.isfinite(self.initial)]
        initial = None
        if finite.size:  # a file saved here repeats y_0 in every curve: taken as is, not a mean
            initial = float(finite[0] if (finite == finite[0]).all() else finite.mean())
        fields = {
            "name": self.name,
            "fidelity": fidelity,
            "configs": tuple(configs),
            "space": space,
            "values": self.values,
            "costs": self.costs,
            "test_values": self.test_values,
            "steps": np.arange(1, self.values.shape[1] + 1) if self.steps is None else self.steps,
            "initial_value": initial,
        }
        fields.update(changes)
        try:
            return LearningCurves(**fields)
        except ValueError as error:
            raise ValueError(f"{self.path} [{self.name}]: {error}") from None


def _as_space_type(value: Any, entry: dict) -> Any:
    if entry["type"] == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    if entry["type"] == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _read_json(path: Path) -> Any:
    data = path.read_bytes()
    if data[:2] == _GZIP_MAGIC:
        data = gzip.decompress(data)
    try:
        return json.loads(data)
    except ValueError as error:
        raise ValueError(f"{path} is not a JSON learning-curve table: {error}") from None


def _float_rows(rows: list[list], what: str) -> np.ndarray:
    lengths = {len(row) for row in rows}
    if len(lengths) != 1:
        raise ValueError(f"{what}: curves differ in length ({sorted(lengths)})")
    try:
        return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{what}: a curve holds a non-number ({error})") from None


def read_lcbench_layout(
    path: str | Path, dataset: str | None, *, what: str, value_tag: str = VALUE_TAG
) -> LayoutTable:
    """Read one dataset of an LCBench-layout JSON file (gzip'd or not) into arrays.

    Configurations are ordered by their numeric id. Every curve must hold the same number of
    entries, at least 2 (entry 0 before training, then T >= 1 steps).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found at {path}: pass the path of your copy")
    document = _read_json(path)
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected an object of datasets (LCBench's layout)")
    names = [name for name in document if name != META_KEY]
    if dataset is None:
        if len(names) != 1:
            raise ValueError(f"{path} holds {len(names)} datasets; name one of {names[:20]}")
        dataset = names[0]
    if dataset not in names:
        raise ValueError(
            f"dataset {dataset!r} is not in {path}; it holds {len(names)}: {sorted(names)[:20]}"
        )
    records = document[dataset]
    if not isinstance(records, dict) or not records:
        raise ValueError(f"{path} [{dataset}]: expected a non-empty object of configurations")
    try:
        ordered = [records[k] for k in sorted(records, key=int)]
        logs = [record["log"] for record in ordered]
        configs = [record["config"] for record in ordered]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{path} [{dataset}]: expected configurations keyed by integer ids, each with "
            f"'config' and 'log' ({type(error).__name__}: {error})"
        ) from None
    meta = document.get(META_KEY, {}).get(dataset)
    where = f"{path} [{dataset}]"
    if value_tag not in logs[0]:
        raise ValueError(f"{where}: no {value_tag!r} log; its logs are {sorted(logs[0])[:20]}")
    values = _float_rows([log[value_tag] for log in logs], f"{where} {value_tag}")
    if values.shape[1] < 2:
        raise ValueError(f"{where}: curves need an entry before training and >= 1 step")
    test = None
    if all(TEST_TAG in log for log in logs):
        test = _float_rows([log[TEST_TAG] for log in logs], f"{where} {TEST_TAG}")[:, 1:]
    costs = np.ones_like(values[:, 1:])
    if all(TIME_TAG in log for log in logs):
        time = _float_rows([log[TIME_TAG] for log in logs], f"{where} {TIME_TAG}")
        if time.shape != values.shape:
            raise ValueError(f"{where}: 'time' has {time.shape[1]} entries per curve")
        # cumulative seconds: step 1 costs all the time until its result, like syne-tune's import
        costs = np.diff(time[:, 1:], axis=1, prepend=0.0)
    steps = None
    if meta is not None and all(meta["fidelity"] in log for log in logs):
        steps = np.array(logs[0][meta["fidelity"]][1:], dtype=np.float64)
    return LayoutTable(
        path=path,
        name=dataset,
        configs=configs,
        values=values[:, 1:],
        initial=values[:, 0],
        test_values=test,
        costs=costs,
        steps=steps,
        meta=meta,
    )


def fashion_mnist_curves(*, path: str | Path | None = None) -> LearningCurves:
    """200 MLPs trained for 30 epochs on Fashion-MNIST: real curves that ship with benchdata.

    Produced by `benchdata curves-sweep --out FILE --configs 200 --epochs 30 --seed 0` (see
    `benchdata.curves_sweep` and the README for the data split, the search space and the run's
    hardware). Values are validation accuracies (fractions), `test_values` the test accuracies,
    `costs` the measured seconds of each epoch (training plus the validation pass), and
    `initial_value` the mean accuracy before training.

    Args:
        path: a table written by `LearningCurves.save` to load instead of the shipped one.
    Returns:
        `LearningCurves` with values `(200, 30)`, steps 1..30, 7 hyperparameters (D = 11).
    """
    if path is not None:
        return LearningCurves.load(path)
    resource = importlib.resources.files("benchdata") / "data" / FASHION_MNIST_CURVES
    with importlib.resources.as_file(resource) as file:
        return LearningCurves.load(file)
