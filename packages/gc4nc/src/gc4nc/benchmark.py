"""The performance benchmark: methods × datasets × reduction rates, one JSON, one Markdown table and
heatmaps (`gc4nc benchmark`).

Each cell condenses the dataset with the method at the rate (timed, peak memory measured), then
trains the evaluation GCN on the condensed graph `EvalConfig.runs` times and tests it on the
original test nodes; each dataset also gets the whole-graph reference. A method that fails on a
cell is recorded with its error and the sweep goes on (the table shows "failed", the JSON the
message).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gc4nc.condense import condense
from gc4nc.datasets import default_rates, load_dataset
from gc4nc.evaluation.performance import EvalConfig, condensed_accuracy, whole_graph_accuracy
from gc4nc.methods import METHODS

logger = logging.getLogger(__name__)


@dataclass
class Cell:
    dataset: str
    method: str
    rate: float
    accuracy: float | None = None
    std: float | None = None
    seconds: float | None = None
    peak_memory_bytes: int | None = None
    num_synthetic: int | None = None
    error: str | None = None


@dataclass
class Sweep:
    cells: list[Cell] = field(default_factory=list)
    whole_graph: dict[str, dict[str, float]] = field(default_factory=dict)
    graphs: dict[str, dict[str, int]] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "cells": [asdict(c) for c in self.cells],
            "whole_graph": self.whole_graph,
            "graphs": self.graphs,
            "settings": self.settings,
        }

    def cell(self, dataset: str, method: str, rate: float) -> Cell | None:
        for c in self.cells:
            if (c.dataset, c.method, c.rate) == (dataset, method, rate):
                return c
        return None


def check_methods(methods: Sequence[str]) -> list[str]:
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {sorted(METHODS)}")
    if not methods:
        raise ValueError("no methods given")
    return list(methods)


def sweep(
    datasets: Sequence[str],
    methods: Sequence[str],
    rates: Sequence[float] | None = None,
    *,
    config: EvalConfig | None = None,
    hparams: dict[str, dict[str, Any]] | None = None,
    seed: int = 0,
    device: str = "cpu",
    progress: bool = True,
) -> Sweep:
    """Condense and evaluate every (dataset, method, rate); rates default per dataset.

    Args:
        hparams: per-method hyperparameters, e.g. {"gcond": {"epochs": 100}}.
    """
    from tqdm.auto import tqdm

    methods = check_methods(methods)
    for rate in rates or ():
        if not 0 < rate < 1:
            raise ValueError(f"reduction rates must be in (0, 1), got {rate}")
    config = config or EvalConfig()
    hparams = hparams or {}
    result = Sweep(
        settings={
            "methods": methods,
            "rates": list(rates) if rates else "per dataset",
            "eval": asdict(config),
            "hparams": hparams,
            "seed": seed,
        }
    )
    for name in datasets:
        graph = load_dataset(name, seed=seed)
        result.graphs[name] = {
            "nodes": graph.num_nodes,
            "edges": graph.edge_index.shape[1] // 2,
            "features": graph.x.shape[1],
            "classes": int(graph.y.max()) + 1,
            "train": int(graph.train_mask.sum()),
        }
        started = time.perf_counter()
        whole = whole_graph_accuracy(graph, config, seed=seed, device=device)
        result.whole_graph[name] = {
            "accuracy": whole.mean,
            "std": whole.std,
            "seconds": time.perf_counter() - started,
        }
        cells = [(m, r) for r in (rates or default_rates(name)) for m in methods]
        for method, rate in tqdm(cells, desc=name, disable=not progress):
            cell = Cell(name, method, rate)
            try:
                condensed = condense(
                    graph, method, rate, seed=seed, device=device, **hparams.get(method, {})
                )
                accuracy = condensed_accuracy(condensed, graph, config, seed=seed, device=device)
            except Exception as error:
                logger.warning("%s on %s at %g failed: %s", method, name, rate, error)
                cell.error = f"{type(error).__name__}: {error}"
            else:
                meta = condensed.metadata
                cell.accuracy, cell.std = accuracy.mean, accuracy.std
                cell.seconds, cell.peak_memory_bytes = meta["seconds"], meta["peak_memory_bytes"]
                cell.num_synthetic = meta["num_synthetic"]
            result.cells.append(cell)
    return result


def _pct(value: float | None, std: float | None = None) -> str:
    if value is None:
        return "failed"
    return f"{100 * value:.1f}" + (f" ± {100 * std:.1f}" if std is not None else "")


def markdown(result: Sweep) -> str:
    """One table per dataset: methods × rates (accuracy ± std, seconds), whole graph first."""
    parts = []
    for name, info in result.graphs.items():
        rates = sorted({c.rate for c in result.cells if c.dataset == name})
        whole = result.whole_graph[name]
        head = (
            f"**{name}** ({info['nodes']:,} nodes, {info['edges']:,} edges, "
            f"{info['train']:,} training nodes); whole graph: "
            f"{_pct(whole['accuracy'], whole['std'])}"
        )
        rows = [
            "| method | " + " | ".join(f"r = {r:g}" for r in rates) + " |",
            "|---" * (len(rates) + 1) + "|",
        ]
        for method in dict.fromkeys(c.method for c in result.cells if c.dataset == name):
            entries = []
            for r in rates:
                c = result.cell(name, method, r)
                entries.append(
                    "failed"
                    if c is None or c.error
                    else f"{_pct(c.accuracy, c.std)} ({c.seconds:.1f} s)"
                )
            rows.append(f"| {method} | " + " | ".join(entries) + " |")
        parts.append(head + "\n\n" + "\n".join(rows))
    return "\n\n".join(parts) + "\n"


def heatmaps(result: Sweep, out: Path) -> list[str]:
    """accuracy_<dataset>.png and time_<dataset>.png (methods × rates); needs matplotlib."""
    import numpy as np

    from kernels_common.plotting import new_figure, save_figure

    written = []
    for name in result.graphs:
        rates = sorted({c.rate for c in result.cells if c.dataset == name})
        methods = list(dict.fromkeys(c.method for c in result.cells if c.dataset == name))
        for key, label, fmt in (
            ("accuracy", "test accuracy (%)", "{:.1f}"),
            ("seconds", "condensation time (s)", "{:.3g}"),
        ):
            grid = np.full((len(methods), len(rates)), np.nan)
            for i, m in enumerate(methods):
                for j, r in enumerate(rates):
                    c = result.cell(name, m, r)
                    value = None if c is None else getattr(c, key)
                    if value is not None:
                        grid[i, j] = 100 * value if key == "accuracy" else value
            fig = new_figure(1.6 + 1.1 * len(rates), 1.0 + 0.35 * len(methods))
            ax = fig.add_subplot(111)
            shown = np.log10(grid) if key == "seconds" else grid
            image = ax.imshow(shown, aspect="auto", cmap="viridis")
            ax.set_xticks(range(len(rates)), [f"{r:g}" for r in rates])
            ax.set_yticks(range(len(methods)), methods)
            ax.set_xlabel("reduction rate")
            for i in range(len(methods)):
                for j in range(len(rates)):
                    text = "failed" if math.isnan(grid[i, j]) else fmt.format(grid[i, j])
                    ax.text(j, i, text, ha="center", va="center", fontsize=7, color="w")
            ax.set_title(f"{name}: {label}" + (" (colour: log10)" if key == "seconds" else ""))
            fig.colorbar(image, ax=ax)
            path = out / f"{'accuracy' if key == 'accuracy' else 'time'}_{_slug(name)}.png"
            save_figure(fig, path)
            written.append(path.name)
    return written


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)


def write(result: Sweep, out: str | Path, *, plots: bool = True) -> list[str]:
    """benchmark.json, benchmark.md and (with matplotlib) the heatmaps into `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmark.json").write_text(json.dumps(result.to_dict(), indent=2))
    (out / "benchmark.md").write_text(markdown(result))
    files = ["benchmark.json", "benchmark.md"]
    if plots:
        files += heatmaps(result, out)
    return files
