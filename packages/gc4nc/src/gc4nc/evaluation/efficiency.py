"""Efficiency: what condensation costs, and how that cost grows with the graph.

`condensation_cost` reads what `gc4nc.condense` measured (wall seconds and peak memory: CUDA's
peak allocation above the start on GPU, the sampled peak resident set size above the start on
CPU; see `gc4nc._measure`) and adds the storage of the condensed graph next to the original's.
`scaling_sweep` condenses graphs of growing size and fits the log-log slope of time against the
number of nodes (1: linear; 2: quadratic), GC4NC's scalability study.

GraphSlim reports time and memory with a decorator around `reduce`; its benchmark also times the
evaluation. Here the condensation call alone is timed (data loading and evaluation excluded).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from gc4nc.condense import condense
from gc4nc.condensed import CondensedGraph
from gc4nc.graph import GraphData, Setting, check_graph


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def condensation_cost(condensed: CondensedGraph, graph: GraphData | None = None) -> dict[str, Any]:
    """Seconds, peak memory and size of a condensed graph (from its metadata).

    Args:
        condensed: a graph returned by `gc4nc.condense` (its metadata holds the measurements).
        graph: the original graph, to compare storage with (optional).

    Returns:
        {"seconds", "peak_memory_bytes", "memory_source", "device", "num_synthetic",
        "condensed_bytes"} and, with `graph`, "original_bytes" and "storage_ratio"
        (condensed / original; features, labels and edges as stored).
    """
    missing = [k for k in ("seconds", "peak_memory_bytes") if k not in condensed.metadata]
    if missing:
        raise ValueError(
            f"condensed.metadata lacks {missing}: efficiency needs a graph made by "
            f"gc4nc.condense (or loaded from its saved folder)"
        )
    meta = condensed.metadata
    out = {
        "seconds": float(meta["seconds"]),
        "peak_memory_bytes": int(meta["peak_memory_bytes"]),
        "memory_source": meta.get("memory_source", ""),
        "device": meta.get("device", ""),
        "num_synthetic": condensed.num_nodes,
        "condensed_bytes": _nbytes(condensed.x, condensed.adjacency, condensed.y),
    }
    if graph is not None:
        graph = check_graph(graph, need_split=False)
        out["original_bytes"] = _nbytes(graph.x, graph.edge_index, graph.edge_weight, graph.y)
        out["storage_ratio"] = out["condensed_bytes"] / out["original_bytes"]
    return out


def loglog_slope(sizes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of log(seconds) = slope · log(size) + intercept.

    Args:
        sizes: the graph sizes (> 0, at least two distinct).
        seconds: the time at each size (> 0).

    Returns:
        (slope, intercept) (natural logarithms; time ≈ exp(intercept) · size^slope).

    Example:
        >>> round(loglog_slope([10, 100, 1000], [0.02, 2.0, 200.0])[0], 6)
        2.0
    """
    x, y = np.asarray(sizes, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"sizes and seconds must be 1-D of equal length, got {x.shape}, {y.shape}")
    if (x <= 0).any() or (y <= 0).any():
        raise ValueError("sizes and seconds must be positive for a log-log fit")
    if np.unique(x).size < 2:
        raise ValueError("need at least two distinct sizes")
    slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
    return float(slope), float(intercept)


def scaling_sweep(
    make_graph: Callable[[int], GraphData],
    sizes: Sequence[int],
    method: str,
    rate: float,
    *,
    setting: Setting = "transductive",
    repeats: int = 1,
    seed: int = 0,
    device: str | torch.device = "cpu",
    **hparams: Any,
) -> dict[str, Any]:
    """Condensation time and memory over growing graphs, and the log-log slope of time.

    Args:
        make_graph: size -> a graph with that many nodes and a split (e.g. a seeded CSBM).
        sizes: the node counts to sweep (at least two distinct).
        method: a name in `gc4nc.METHODS`.
        rate: the reduction rate.
        setting: "transductive" or "inductive".
        repeats: condensations per size; the median time is kept.
        seed: the condensation seed.
        device: where to condense.
        **hparams: the method's hyperparameters.

    Returns:
        {"sizes", "seconds" (median per size), "peak_memory_bytes" (max per size),
        "slope", "intercept"}.

    Example:
        >>> scaling_sweep(make_csbm, [500, 1000, 2000], "random", 0.1)  # doctest: +SKIP
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    sizes = [int(n) for n in sizes]
    seconds, memory = [], []
    for n in sizes:
        graph = make_graph(n)
        if graph.num_nodes != n:
            raise ValueError(f"make_graph({n}) returned a graph of {graph.num_nodes} nodes")
        times, peaks = [], []
        for _ in range(repeats):
            condensed = condense(graph, method, rate, setting, seed=seed, device=device, **hparams)
            times.append(condensed.metadata["seconds"])
            peaks.append(condensed.metadata["peak_memory_bytes"])
        seconds.append(float(np.median(times)))
        memory.append(int(max(peaks)))
    slope, intercept = loglog_slope(sizes, seconds)
    return {
        "method": method,
        "rate": rate,
        "sizes": sizes,
        "seconds": seconds,
        "peak_memory_bytes": memory,
        "slope": slope,
        "intercept": intercept,
    }
