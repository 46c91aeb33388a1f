"""What the adapters share: lazy imports with a helpful error, and metric → performance."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

MODES = ("max", "min")


def require(module: str, extra: str) -> ModuleType:
    """Import `module`, or raise an ImportError that names the extra installing it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"this freeze_thaw_bo integration needs `{module}`, which is not installed; "
            f"install it with `pip install freeze-thaw-bo[{extra}]`"
        ) from err


def performance_function(
    mode: str, performance: Callable[[float], float] | None
) -> Callable[[float], float]:
    """The map from a reported metric to the performance the optimizer maximises.

    `performance` when given; otherwise the identity for `mode="max"` (accuracies) and `1 − value`
    for `mode="min"` (error rates in [0, 1]). The default surrogate expects performances in [0, 1].
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if performance is not None:
        if not callable(performance):
            raise TypeError(f"performance must be callable, got {performance!r}")
        return performance
    if mode == "max":
        return float
    return _one_minus


def _one_minus(value: float) -> float:
    return 1.0 - float(value)


def reported(result: dict, key: str) -> float:
    """`result[key]` as a float (possibly not finite); a KeyError lists the keys that are there."""
    if key not in result:
        raise KeyError(f"the reported result has no {key!r}; its keys are {sorted(result)}")
    return float(result[key])
