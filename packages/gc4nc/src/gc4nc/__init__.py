"""GC4NC: graph condensation for node classification on PyTorch Geometric, evaluated along six
dimensions (NeurIPS 2025)."""

from __future__ import annotations

from importlib import metadata as _metadata

from gc4nc.condense import class_counts, condense
from gc4nc.condensed import CondensedGraph, CondensedGraphError
from gc4nc.graph import Structure, check_graph, from_benchdata, planetoid_split, random_split
from gc4nc.methods import METHODS

try:
    __version__ = _metadata.version("gc4nc")
except _metadata.PackageNotFoundError:  # imported from a source tree (PYTHONPATH), not installed
    __version__ = "0.0.0+source"

__all__ = [
    "METHODS",
    "CondensedGraph",
    "CondensedGraphError",
    "Structure",
    "__version__",
    "check_graph",
    "class_counts",
    "condense",
    "from_benchdata",
    "planetoid_split",
    "random_split",
]
