"""Search spaces: named hyperparameters, seeded sampling, and an encoding into the unit cube.

Freeze-thaw BO (like the authors' code) chooses among a finite pool of candidate configurations:
a benchmark's table, or a seeded sample from a user's space. Surrogates see each configuration
encoded in [0, 1]^D: floats and integers min-max scaled (in log space when `log=True`),
categoricals one-hot.

The dictionary form `{"lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}, ...}` is
the one benchdata's `LearningCurves.space` uses, so a benchmark's space loads with `from_dict`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Categorical", "Float", "Integer", "SearchSpace"]


@dataclass(frozen=True)
class Float:
    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise ValueError(f"need finite low < high, got low={self.low}, high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"a log-scaled range needs low > 0, got {self.low}")

    @property
    def width(self) -> int:
        return 1

    def _scale(self, value: np.ndarray) -> np.ndarray:
        return np.log(value) if self.log else value

    def encode(self, value: Any) -> list[float]:
        v = float(value)
        if not self.low <= v <= self.high:
            raise ValueError(f"{v} is outside [{self.low}, {self.high}]")
        lo, hi = self._scale(np.array([self.low, self.high]))
        return [float((self._scale(np.array(v)) - lo) / (hi - lo))]

    def sample(self, rng: np.random.Generator) -> float:
        lo, hi = self._scale(np.array([self.low, self.high]))
        u = rng.uniform(lo, hi)
        return float(math.exp(u) if self.log else u)

    def to_dict(self) -> dict:
        return {"type": "float", "low": self.low, "high": self.high, "log": self.log}


@dataclass(frozen=True)
class Integer(Float):
    def __post_init__(self) -> None:
        super().__post_init__()
        if int(self.low) != self.low or int(self.high) != self.high:
            raise ValueError(f"integer bounds must be whole numbers, got {self.low}, {self.high}")

    def sample(self, rng: np.random.Generator) -> int:
        return int(min(max(round(super().sample(rng)), self.low), self.high))

    def to_dict(self) -> dict:
        return {"type": "int", "low": self.low, "high": self.high, "log": self.log}


@dataclass(frozen=True)
class Categorical:
    """Unordered choices, encoded one-hot, or as one ordinal number in [0, 1] (`ordinal=True`)
    when one-hot would make the encoding wider than a surrogate accepts."""

    choices: tuple
    ordinal: bool = False

    def __post_init__(self) -> None:
        if len(self.choices) < 1:
            raise ValueError("a categorical needs at least one choice")
        if len(set(map(repr, self.choices))) != len(self.choices):
            raise ValueError(f"categorical choices repeat: {self.choices}")

    @property
    def width(self) -> int:
        return 1 if self.ordinal else len(self.choices)

    def encode(self, value: Any) -> list[float]:
        if value not in self.choices:
            raise ValueError(f"{value!r} is not one of {list(self.choices)}")
        index = self.choices.index(value)
        if self.ordinal:
            return [index / max(len(self.choices) - 1, 1)]
        return [1.0 if i == index else 0.0 for i in range(len(self.choices))]

    def sample(self, rng: np.random.Generator) -> Any:
        return self.choices[int(rng.integers(len(self.choices)))]

    def to_dict(self) -> dict:
        out = {"type": "categorical", "choices": list(self.choices)}
        return {**out, "ordinal": True} if self.ordinal else out


Dimension = Float | Integer | Categorical


class SearchSpace:
    """Named hyperparameters with seeded sampling and a unit-cube encoding.

    Example:
        >>> space = SearchSpace({"lr": Float(1e-4, 1e-1, log=True), "width": Integer(16, 512)})
        >>> configs = space.sample(4, seed=0)
        >>> space.encode(configs).shape
        (4, 2)
    """

    def __init__(self, dimensions: dict[str, Dimension]) -> None:
        if not dimensions:
            raise ValueError("a search space needs at least one hyperparameter")
        for name, dim in dimensions.items():
            if not isinstance(dim, Float | Categorical):
                raise TypeError(f"{name}: expected Float, Integer or Categorical, got {dim!r}")
        self.dimensions = dict(dimensions)

    @classmethod
    def from_dict(cls, spec: dict[str, dict]) -> SearchSpace:
        """From `{name: {"type": "float"|"int"|"categorical", ...}}` (benchdata's layout)."""
        dims: dict[str, Dimension] = {}
        for name, entry in spec.items():
            kind = entry.get("type")
            if kind == "float":
                dims[name] = Float(entry["low"], entry["high"], bool(entry.get("log", False)))
            elif kind == "int":
                dims[name] = Integer(entry["low"], entry["high"], bool(entry.get("log", False)))
            elif kind == "categorical":
                dims[name] = Categorical(tuple(entry["choices"]), bool(entry.get("ordinal")))
            else:
                raise ValueError(
                    f"{name}: unknown type {kind!r}; allowed: 'float', 'int', 'categorical'"
                )
        return cls(dims)

    def to_dict(self) -> dict[str, dict]:
        return {name: dim.to_dict() for name, dim in self.dimensions.items()}

    def narrowed(self, max_dim: int) -> SearchSpace:
        """This space with the widest one-hot categoricals made ordinal until D <= max_dim.

        The learning-curve PFN reads at most 16 encoded dimensions (as FT-PFN does); LCDB's
        single 'learner' choice among ~20 would be 20 wide one-hot.
        """
        dims = dict(self.dimensions)
        wide = sorted(
            (n for n, d in dims.items() if isinstance(d, Categorical) and not d.ordinal),
            key=lambda n: -dims[n].width,
        )
        for name in wide:
            if sum(d.width for d in dims.values()) <= max_dim:
                break
            dims[name] = Categorical(dims[name].choices, ordinal=True)
        narrowed = SearchSpace(dims)
        if narrowed.dim > max_dim:
            raise ValueError(f"the space encodes to {narrowed.dim} > {max_dim} dimensions")
        return narrowed

    @property
    def dim(self) -> int:
        """D, the width of the encoding."""
        return sum(d.width for d in self.dimensions.values())

    def sample(self, n: int, seed: int | np.random.Generator = 0) -> list[dict[str, Any]]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        return [{k: d.sample(rng) for k, d in self.dimensions.items()} for _ in range(n)]

    def encode(self, configs: list[dict[str, Any]]) -> np.ndarray:
        """(n, D) float64 in [0, 1]."""
        rows = []
        for i, config in enumerate(configs):
            missing = set(self.dimensions) - set(config)
            extra = set(config) - set(self.dimensions)
            if missing or extra:
                raise ValueError(
                    f"configuration {i}: missing {sorted(missing)}, unknown {sorted(extra)}"
                )
            row: list[float] = []
            for name, dim in self.dimensions.items():
                try:
                    row.extend(dim.encode(config[name]))
                except ValueError as err:
                    raise ValueError(f"configuration {i}, {name}: {err}") from None
            rows.append(row)
        return np.asarray(rows, dtype=np.float64).reshape(len(configs), self.dim)
