"""Condensation methods, registered by name in `METHODS` (importing this package registers all)."""

from gc4nc.methods import (  # noqa: F401
    coarsening,
    coreset,
    distribution,
    gradient,
    sgdd,
    trajectory,
)
from gc4nc.methods.base import METHODS, Condensed, CondenseTask, MethodSpec, register

__all__ = ["METHODS", "CondenseTask", "Condensed", "MethodSpec", "register"]
