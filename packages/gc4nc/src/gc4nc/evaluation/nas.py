"""NAS: does the condensed graph rank architectures the way the original graph does?

As GraphSlim (`graphslim/evaluation/nas_eval.py`): the search space is APPNP (a 2-layer MLP,
Linear(d → hidden), activation, Linear(hidden → C), then K steps H ← (1 − α) Â H + α H₀) over
K ∈ {2, 4, 6, 8, 10} × hidden ∈ {16, 32, 64, 128, 256, 512} × α ∈ {0.1, 0.2} × activation ∈
{sigmoid, tanh, relu, linear, softplus, leaky_relu, relu6, elu}: 480 architectures. Each
architecture trains once on the condensed graph (`condensed_epochs`, GraphSlim 300) and once on
the original graph (`original_epochs`, GraphSlim 600), with the evaluator's schedule (dropout 0,
weight decay 5e-4, lr 0.01 then 0.001 from the half-way point, best-validation weights); its score
on each is the best validation accuracy on the original graph's validation nodes. Reported:

- the Pearson correlation of the two lists of validation accuracies;
- the Pearson correlation of their ranks (descending, ties get the smallest rank, as
  `scipy.stats.rankdata(-v, method="min")`: effectively Spearman's correlation);
- the architecture with the best score on each graph (the first one on ties) and the test accuracy
  (original graph's test nodes, `test_runs` seeds, `test_epochs` epochs, GraphSlim 10 and 600) of
  the best-on-condensed architecture trained on the original graph (what NAS on a condensed graph
  delivers) next to the best-on-original one's; also the best-on-condensed architecture trained on
  the condensed graph (GraphSlim's `test_params_syn`).

Difference from the anchor: `num_architectures` evaluates a seeded random subset of the space
(quick runs); with None (the default) every architecture is evaluated, as the anchor. A constant
list of scores has no correlation: it is reported as None (scipy warns and returns NaN).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from gc4nc.condensed import CondensedGraph
from gc4nc.evaluation.performance import (
    EvalConfig,
    _summary,
    train_on_condensed,
    train_on_original,
)
from gc4nc.graph import GraphData, Setting, check_graph
from gc4nc.training import Split, accuracy

logger = logging.getLogger(__name__)

HOPS = (2, 4, 6, 8, 10)
HIDDEN = (16, 32, 64, 128, 256, 512)
ALPHAS = (0.1, 0.2)
NAS_ACTIVATIONS = ("sigmoid", "tanh", "relu", "linear", "softplus", "leaky_relu", "relu6", "elu")


@dataclass(frozen=True)
class Architecture:
    """One APPNP architecture of the search space."""

    hops: int
    hidden: int
    alpha: float
    activation: str

    def config(self, base: EvalConfig, epochs: int) -> EvalConfig:
        """`base` (lr, weight decay, dropout) with this APPNP and `epochs`."""
        kwargs = {"hops": self.hops, "alpha": self.alpha, "act": self.activation, "layers": 2}
        return replace(
            base, model="appnp", hidden=self.hidden, epochs=epochs, runs=1, model_kwargs=kwargs
        )


def search_space() -> list[Architecture]:
    """The 480 architectures, in GraphSlim's order (K, then hidden, then α, then activation)."""
    return [
        Architecture(*values) for values in itertools.product(HOPS, HIDDEN, ALPHAS, NAS_ACTIVATIONS)
    ]


def sample_architectures(num_architectures: int | None, seed: int = 0) -> list[Architecture]:
    """Every architecture (None) or a seeded random subset of `num_architectures`, kept in
    search-space order."""
    space = search_space()
    if num_architectures is None:
        return space
    if not 2 <= num_architectures <= len(space):
        raise ValueError(f"num_architectures must be in [2, {len(space)}], got {num_architectures}")
    chosen = np.sort(
        np.random.default_rng(seed).choice(len(space), num_architectures, replace=False)
    )
    return [space[i] for i in chosen]


def pearson(a: np.ndarray, b: np.ndarray) -> float | None:
    """Pearson's correlation of two equal-length lists; None when either is constant."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size < 2:
        raise ValueError(f"need two 1-D lists of the same length >= 2, got {a.shape}, {b.shape}")
    a, b = a - a.mean(), b - b.mean()
    scale = np.sqrt((a @ a) * (b @ b))
    if scale == 0:
        return None
    return float(np.clip((a @ b) / scale, -1.0, 1.0))


def descending_min_rank(values: np.ndarray) -> np.ndarray:
    """Rank 1 for the largest value; ties share the smallest rank (1 + how many are larger)."""
    values = np.asarray(values, dtype=np.float64)
    ascending = np.sort(values)
    return 1 + values.size - np.searchsorted(ascending, values, side="right")


def _best_val(
    model: torch.nn.Module, graph: GraphData, setting: Setting, device: torch.device
) -> float:
    # the model holds its best-validation weights: its validation accuracy is the best one
    return accuracy(model, Split.of(graph, graph.val_mask, setting).to(device))


def _test_accuracy(
    arch: Architecture,
    condensed: CondensedGraph | None,
    graph: GraphData,
    base: EvalConfig,
    epochs: int,
    runs: int,
    seed: int,
    setting: Setting,
    device: torch.device,
) -> dict[str, Any]:
    config = arch.config(base, epochs)
    scores = []
    for run in range(runs):
        if condensed is None:
            model, test = train_on_original(
                graph, config, seed=seed + run, setting=setting, device=device
            )
        else:
            model, test = train_on_condensed(
                condensed, graph, config, seed=seed + run, setting=setting, device=device
            )
        scores.append(accuracy(model, test))
    return _summary(scores).to_dict()


def nas_correlation(
    condensed: CondensedGraph,
    graph: GraphData,
    config: EvalConfig | None = None,
    *,
    num_architectures: int | None = None,
    condensed_epochs: int = 300,
    original_epochs: int = 600,
    test_runs: int = 10,
    test_epochs: int = 600,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Rank APPNP architectures on the condensed and on the original graph and compare.

    Args:
        condensed: the condensed graph (its metadata's "setting" is used; transductive if absent).
        graph: the original graph with its split.
        config: lr, weight decay and dropout of every training (`EvalConfig()` when None).
        num_architectures: evaluate a seeded subset of this many; every one of the 480 if None.
        condensed_epochs: epochs of each search run on the condensed graph (GraphSlim 300).
        original_epochs: epochs of each search run on the original graph (GraphSlim 600).
        test_runs: seeds for the test accuracy of the selected architectures (0 skips it).
        test_epochs: epochs of those test runs (GraphSlim 600).
        seed: seeds the subset and every run.
        device: where to train.

    Returns:
        {"architectures": [...], "val_condensed": [...], "val_original": [...],
        "pearson_accuracy", "pearson_rank", "best_on_condensed", "best_on_original", and with
        test_runs > 0 "test": {"best_on_condensed_trained_on_original",
        "best_on_original_trained_on_original", "best_on_condensed_trained_on_condensed"}}.

    Example:
        >>> result = nas_correlation(condensed, graph, num_architectures=20)  # doctest: +SKIP
    """
    graph = check_graph(graph)
    config = config or EvalConfig()
    if min(condensed_epochs, original_epochs, test_epochs) < 1 or test_runs < 0:
        raise ValueError("epochs must be >= 1 and test_runs >= 0")
    setting = condensed.metadata.get("setting", "transductive")
    device = torch.device(device)
    architectures = sample_architectures(num_architectures, seed)
    val_condensed, val_original = [], []
    for arch in tqdm(architectures, desc="NAS", disable=None, mininterval=10):
        model, _ = train_on_condensed(
            condensed,
            graph,
            arch.config(config, condensed_epochs),
            seed=seed,
            setting=setting,
            device=device,
        )
        val_condensed.append(_best_val(model, graph, setting, device))
        model, _ = train_on_original(
            graph, arch.config(config, original_epochs), seed=seed, setting=setting, device=device
        )
        val_original.append(_best_val(model, graph, setting, device))
    best_condensed = architectures[int(np.argmax(val_condensed))]
    best_original = architectures[int(np.argmax(val_original))]
    result: dict[str, Any] = {
        "num_architectures": len(architectures),
        "architectures": [asdict(a) for a in architectures],
        "val_condensed": val_condensed,
        "val_original": val_original,
        "pearson_accuracy": pearson(val_condensed, val_original),
        "pearson_rank": pearson(
            descending_min_rank(val_condensed), descending_min_rank(val_original)
        ),
        "best_on_condensed": asdict(best_condensed),
        "best_on_original": asdict(best_original),
    }
    if test_runs:
        common = (config, test_epochs, test_runs, seed, setting, device)
        result["test"] = {
            "best_on_condensed_trained_on_original": _test_accuracy(
                best_condensed, None, graph, *common
            ),
            "best_on_original_trained_on_original": _test_accuracy(
                best_original, None, graph, *common
            ),
            "best_on_condensed_trained_on_condensed": _test_accuracy(
                best_condensed, condensed, graph, *common
            ),
        }
    logger.info(
        "NAS: Pearson r of accuracies %s, of ranks %s",
        result["pearson_accuracy"],
        result["pearson_rank"],
    )
    return result
