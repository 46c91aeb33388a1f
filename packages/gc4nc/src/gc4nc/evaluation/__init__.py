"""GC4NC's evaluation of a condensed graph along its dimensions, and `evaluate`, which runs any of
them and returns one JSON-serialisable dict.

Dimensions (`DIMENSIONS`):

- "performance": test accuracy of the evaluation model trained on the condensed graph, and of the
  same model trained on the whole graph (`performance`);
- "efficiency": condensation seconds, peak memory and storage (`efficiency`);
- "privacy": membership-inference attack accuracy (`privacy`);
- "denoising": clean vs corrupted accuracy, the method re-run on a corrupted graph (`denoising`);
- "nas": correlation of APPNP architecture rankings (`nas`);
- "transferability": other architectures trained on the condensed graph (`transfer`);
- "properties": homophily, spectral radius, clustering, degrees, density (`properties`).

Example:
    >>> import gc4nc
    >>> from gc4nc.evaluation import evaluate
    >>> condensed = gc4nc.condense(graph, "random", 0.5)  # doctest: +SKIP
    >>> dims = ("performance", "properties")
    >>> report = evaluate(condensed, graph, dims, quick=True)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from gc4nc.condensed import CondensedGraph
from gc4nc.evaluation.denoising import ATTACKS, robustness
from gc4nc.evaluation.efficiency import condensation_cost, scaling_sweep
from gc4nc.evaluation.nas import nas_correlation
from gc4nc.evaluation.performance import EvalConfig, condensed_accuracy, whole_graph_accuracy
from gc4nc.evaluation.prbcd import PRBCDConfig
from gc4nc.evaluation.privacy import membership_inference
from gc4nc.evaluation.properties import graph_properties
from gc4nc.evaluation.transfer import TRANSFER_MODELS, transferability
from gc4nc.graph import GraphData, check_graph

DIMENSIONS = (
    "performance",
    "efficiency",
    "privacy",
    "denoising",
    "nas",
    "transferability",
    "properties",
)
DEFAULT_DIMENSIONS = ("performance", "efficiency", "properties")
QUICK_CONFIG = EvalConfig(epochs=100, runs=3)


def _jsonable(value: Any) -> Any:
    """`value` with dataclasses, tuples, NumPy / torch scalars turned into JSON types and NaN /
    infinity into None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, torch.Tensor | np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# every runner: (condensed, graph, config, seed, device, quick, options) -> the dimension's result


def _performance(condensed, graph, config, seed, device, quick, options):
    setting = condensed.metadata.get("setting", "transductive")
    return {
        "condensed": condensed_accuracy(
            condensed, graph, config, seed=seed, device=device, **options
        ),
        "whole": whole_graph_accuracy(
            graph, config, setting=setting, seed=seed, device=device, **options
        ),
    }


def _efficiency(condensed, graph, config, seed, device, quick, options):
    return condensation_cost(condensed, graph, **options)


def _privacy(condensed, graph, config, seed, device, quick, options):
    return membership_inference(condensed, graph, config, seed=seed, device=device, **options)


def _denoising(condensed, graph, config, seed, device, quick, options):
    meta = condensed.metadata
    missing = [k for k in ("method", "reduction_rate", "setting") if k not in meta]
    if missing:
        raise ValueError(
            f"the denoising dimension re-runs the condensation method on a corrupted "
            f"graph, but condensed.metadata lacks {missing}"
        )
    options = {"attack": "random_adj", "rate": 0.5, **options}
    if quick and options["attack"] in ("prbcd", "metattack"):
        options.setdefault(
            "prbcd", PRBCDConfig(epochs=100, fine_tune_epochs=25, surrogate_epochs=200)
        )
    method = meta["method"]
    # the attacked graph gets its own experts: a clean expert buffer (or the file it was saved
    # to) must be neither reused nor overwritten
    hparams = {
        k: v
        for k, v in meta.get("hyperparameters", {}).items()
        if k not in ("buffer", "save_buffer")
    }
    return robustness(
        graph,
        {method: hparams},
        reduction_rate=meta["reduction_rate"],
        setting=meta["setting"],
        config=config,
        seed=meta.get("seed", seed),
        clean={method: condensed},
        device=device,
        **options,
    )


def _nas(condensed, graph, config, seed, device, quick, options):
    if quick:
        options = {
            "num_architectures": 16,
            "condensed_epochs": config.epochs,
            "original_epochs": 2 * config.epochs,
            "test_runs": 2,
            "test_epochs": 2 * config.epochs,
            **options,
        }
    return nas_correlation(condensed, graph, config, seed=seed, device=device, **options)


def _transferability(condensed, graph, config, seed, device, quick, options):
    return transferability(condensed, graph, config, seed=seed, device=device, **options)


def _properties(condensed, graph, config, seed, device, quick, options):
    return graph_properties(condensed, graph, **options)


_RUNNERS = {
    "performance": _performance,
    "efficiency": _efficiency,
    "privacy": _privacy,
    "denoising": _denoising,
    "nas": _nas,
    "transferability": _transferability,
    "properties": _properties,
}


def evaluate(
    condensed: CondensedGraph,
    graph: GraphData,
    dims: Sequence[str] = DEFAULT_DIMENSIONS,
    config: EvalConfig | None = None,
    quick: bool = False,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Evaluate `condensed` (made from `graph`) along the dimensions `dims`.

    Args:
        condensed: the condensed graph (its metadata tells the setting, and for "denoising" and
            "efficiency" the method, rate, seed and measured cost).
        graph: the original graph with its split.
        dims: names from `DIMENSIONS` (default: performance, efficiency, properties: the cheap
            ones; privacy, denoising, nas and transferability train many more models).
        config: the evaluation schedule shared by every dimension (`EvalConfig()`, GraphSlim's,
            or `QUICK_CONFIG` with `quick`).
        quick: small settings for a fast look: `QUICK_CONFIG` and, for NAS, 16 architectures
            with the config's epochs (original graph: twice as many) and 2 test runs; a shorter
            PRBCD schedule. `options` override these.
        seed: the first seed of every run.
        device: where to train.
        options: keyword arguments for a dimension's function, by dimension name:
            privacy → `membership_inference` (runs), denoising → `robustness` (attack, rate,
            prbcd), nas → `nas_correlation`, transferability → `transferability`, properties →
            `graph_properties`.

    Returns:
        {"dims", "quick", "config", and one entry per dimension}, JSON-serialisable (NaN and
        undefined correlations as None, structure-free properties as "n/a").
    """
    graph = check_graph(graph)
    dims = list(dims)
    unknown = [d for d in dims if d not in DIMENSIONS]
    if unknown:
        raise ValueError(f"unknown evaluation dimension(s) {unknown}; choose from {DIMENSIONS}")
    if not dims:
        raise ValueError(f"dims is empty; choose from {DIMENSIONS}")
    options = dict(options or {})
    stray = [d for d in options if d not in DIMENSIONS]
    if stray:
        raise ValueError(f"options for unknown dimension(s) {stray}; choose from {DIMENSIONS}")
    config = config or (QUICK_CONFIG if quick else EvalConfig())
    report: dict[str, Any] = {"dims": dims, "quick": quick, "config": config}
    for dim in dict.fromkeys(dims):
        report[dim] = _RUNNERS[dim](
            condensed, graph, config, seed, device, quick, dict(options.get(dim, {}))
        )
    return _jsonable(report)


__all__ = [
    "ATTACKS",
    "DEFAULT_DIMENSIONS",
    "DIMENSIONS",
    "QUICK_CONFIG",
    "TRANSFER_MODELS",
    "EvalConfig",
    "condensation_cost",
    "evaluate",
    "graph_properties",
    "membership_inference",
    "nas_correlation",
    "robustness",
    "scaling_sweep",
    "transferability",
]
