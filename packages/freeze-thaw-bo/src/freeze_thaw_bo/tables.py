"""Benchmarks by name: the curve tables benchdata loads, as `CurveTable`s.

fashion-mnist          200 MLPs × 30 epochs trained on Fashion-MNIST (ships with benchdata)
lcdb:<openml id>       LCDB learners over training-set sizes (`pip install --no-deps lcdb`)
lcbench:<dataset>      LCBench's data_2k.json from --data PATH
taskset:<dataset>      the TaskSet table as the CFBO authors distribute it, from --data PATH
pd1:<dataset>          the PD1 table as the CFBO authors distribute it, from --data PATH
"""

from __future__ import annotations

from pathlib import Path

from freeze_thaw_bo.benchmark import CurveTable

__all__ = ["BENCHMARKS", "load_table"]

BENCHMARKS = (
    "fashion-mnist",
    "lcdb:<openml id>",
    "lcbench:<dataset>",
    "taskset:<dataset>",
    "pd1:<dataset>",
)


def load_table(
    spec: str, *, data: str | Path | None = None, max_configs: int | None = None, seed: int = 0
) -> CurveTable:
    """The benchmark `spec` (see the module docstring), optionally a seeded subset of configs."""
    try:
        import benchdata
    except ImportError:
        raise ImportError(
            "benchmarks come from benchdata: pip install 'benchdata[curves]'"
        ) from None
    kind, _, name = spec.partition(":")
    if kind == "fashion-mnist" and not name:
        curves = benchdata.fashion_mnist_curves(path=data)
    elif kind == "lcdb" and name:
        try:
            openml_id = int(name)
        except ValueError:
            raise ValueError(f"lcdb needs an OpenML dataset id, got {name!r}") from None
        curves = benchdata.lcdb_curves(openml_id, path=data)
    elif kind in ("lcbench", "taskset", "pd1") and name:
        if data is None:
            raise ValueError(f"{kind} reads your copy of its table: pass its path (--data PATH)")
        loader = getattr(benchdata, f"{kind}_curves")
        curves = loader(data, name)
    else:
        raise ValueError(f"unknown benchmark {spec!r}; choose from {', '.join(BENCHMARKS)}")
    return CurveTable.from_curves(curves, max_configs=max_configs, seed=seed)
