"""The registered methods by name: CFBO and the baselines."""

from __future__ import annotations

from freeze_thaw_bo.optimizer import _REGISTRY, FreezeThawOptimizer

__all__ = ["METHODS", "method_class"]

#: every method's name, CFBO first; each is a `FreezeThawOptimizer` subclass's `method`
METHODS = ("cfbo", "ifbo", "dyhpo", "dpl", "random", "sh", "hyperband", "asha")


def method_class(name: str) -> type[FreezeThawOptimizer]:
    """The optimizer class registered as `name`."""
    import freeze_thaw_bo.baselines
    import freeze_thaw_bo.cfbo  # noqa: F401  (importing registers the classes)

    if name not in _REGISTRY:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    return _REGISTRY[name]
