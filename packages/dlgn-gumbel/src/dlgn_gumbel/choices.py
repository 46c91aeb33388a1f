"""The named options of a logic gate network, importable without torch (the command line's
choices)."""

from __future__ import annotations

from typing import Literal

__all__ = [
    "CONNECTIONS",
    "INITS",
    "LAYOUTS",
    "NOISES",
    "RELAXATIONS",
    "Connections",
    "Init",
    "Layout",
    "Noise",
    "Relaxation",
    "check_choice",
]

Connections = Literal["random", "unique", "difflogic"]
Relaxation = Literal["softmax", "gumbel", "dirichlet"]
Init = Literal["randn", "residual"]
Noise = Literal["shared", "per_example"]
Layout = Literal["feature", "threshold"]

CONNECTIONS: tuple[str, ...] = ("random", "unique", "difflogic")
RELAXATIONS: tuple[str, ...] = ("softmax", "gumbel", "dirichlet")
INITS: tuple[str, ...] = ("randn", "residual")
NOISES: tuple[str, ...] = ("shared", "per_example")
LAYOUTS: tuple[str, ...] = ("feature", "threshold")


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    """Raise ``ValueError`` naming ``name`` and the allowed values unless ``value`` is one."""
    if value not in choices:
        options = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {options}; got {value!r}")
