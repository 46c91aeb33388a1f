"""Denoising: how condensation copes with a corrupted original graph.

The original graph is corrupted *before* condensation; the condensed graph (and, as the
reference, a model trained on the whole corrupted graph) is then evaluated, and compared with the
same pipeline on the clean graph. As GraphSlim (`graphslim/dataset/attack.py`,
`benchmark/scripts/robustness.sh`, rate 0.5), the corruptions are:

- "random_adj" (`add_random_edges`): int(rate · undirected edges) node pairs that are not edges,
  drawn uniformly, added in both directions (no self loops).
- "random_feat" (`feature_noise(kind="mask_columns")`): int(rate · d) feature columns, chosen
  uniformly, set to zero. This is what GraphSlim's "random_feat" does.
- "gaussian_feat" (`feature_noise(kind="gaussian")`): the features of int(rate · N) uniformly
  chosen nodes replaced by standard normal noise, as GraphSlim's (unused) `add_feature_noise`.
- "prbcd" (alias "metattack", GraphSlim's name for it): the PRBCD structure attack
  (`gc4nc.evaluation.prbcd`), budget int(rate · undirected edges) flips.

Settings. Transductive (`setting="transductive"`): the whole graph is corrupted; condensation sees
it and the test runs on it, as the anchor. Inductive: GraphSlim corrupts only its training graph
(`adj_train` / `feat_train`) and tests on the never-corrupted test-induced subgraph. We do the
same: edges are added only between training nodes (budget from the train-induced subgraph's
edges), features are corrupted only on training nodes, and PRBCD attacks the whole graph (budget
from its edges) but keeps only the flips between two training nodes. Since inductive validation
and testing use the subgraphs induced by the validation / test nodes, they stay clean; the
inductive numbers therefore measure robustness to a corrupted *training* graph only.

Differences from the anchor: the seeded NumPy generator replaces the global RNG, and candidate
non-edges are drawn in vectorised batches (or enumerated when non-edges are scarce) rather than
one pair at a time; the distribution (uniform over non-edges, without repetition) is the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from gc4nc.condense import condense
from gc4nc.condensed import CondensedGraph
from gc4nc.evaluation.performance import EvalConfig, condensed_accuracy, whole_graph_accuracy
from gc4nc.evaluation.prbcd import PRBCDConfig, flip_pairs, pair_keys, prbcd_attack
from gc4nc.graph import SETTINGS, GraphData, Setting, check_graph

ATTACKS = ("random_adj", "random_feat", "gaussian_feat", "prbcd", "metattack")


def _check_rate(rate: float) -> None:
    if not 0 <= rate <= 1:
        raise ValueError(f"rate must be in [0, 1], got {rate}")


def _check_setting(setting: str) -> None:
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")


def _random_non_edges(
    nodes: np.ndarray, n: int, existing: np.ndarray, count: int, rng: np.random.Generator
) -> np.ndarray:
    """`count` distinct keys i·n + j (i < j, both in `nodes`) uniformly among pairs of `nodes`
    whose key is not in `existing` (sorted)."""
    m = nodes.size
    free = m * (m - 1) // 2 - int(_both_in(existing, nodes, n).sum())
    if count > free:
        raise ValueError(f"cannot add {count} edges: only {free} node pairs are not edges")
    if count == 0:
        return np.empty(0, dtype=np.int64)
    if 2 * count > free and m * m <= 4e6:  # scarce: enumerate every non-edge, pick without repeats
        candidates = np.setdiff1d(_all_pair_keys(nodes, n), existing)
        return rng.choice(candidates, count, replace=False)
    chosen = np.empty(0, dtype=np.int64)
    while chosen.size < count:
        need = count - chosen.size
        i = nodes[rng.integers(m, size=2 * need + 16)]
        j = nodes[rng.integers(m, size=2 * need + 16)]
        keys = np.minimum(i, j) * n + np.maximum(i, j)
        keys = keys[(i != j) & ~np.isin(keys, existing) & ~np.isin(keys, chosen)]
        _, first = np.unique(keys, return_index=True)
        chosen = np.concatenate([chosen, keys[np.sort(first)][:need]])
    return chosen


def _all_pair_keys(nodes: np.ndarray, n: int) -> np.ndarray:
    i, j = np.triu_indices(nodes.size, k=1)
    a, b = nodes[i], nodes[j]
    return np.minimum(a, b) * n + np.maximum(a, b)


def _both_in(keys: np.ndarray, nodes: np.ndarray, n: int) -> np.ndarray:
    return np.isin(keys // n, nodes) & np.isin(keys % n, nodes)


def add_random_edges(
    graph: GraphData, rate: float, seed: int = 0, *, setting: Setting = "transductive"
) -> GraphData:
    """`graph` plus int(rate · undirected edges) uniformly random new undirected edges.

    Args:
        graph: the clean graph.
        rate: the number of new edges as a fraction of the existing undirected edges, in [0, 1].
        seed: seeds the choice.
        setting: "transductive" (pairs anywhere, budget from all edges) or "inductive" (pairs of
            training nodes only, budget from the edges between training nodes).

    Returns:
        A copy of `graph` whose edge_index also holds the new pairs in both directions (weight 1
        if the graph is weighted).

    Example:
        >>> noisy = add_random_edges(graph, 0.5, seed=0)  # doctest: +SKIP
    """
    graph = check_graph(graph, need_split=setting == "inductive")
    _check_rate(rate)
    _check_setting(setting)
    n = graph.num_nodes
    existing = pair_keys(graph.edge_index, n).numpy()
    if setting == "inductive":
        nodes = graph.train_mask.nonzero().flatten().numpy()
        budget_edges = int(_both_in(existing, nodes, n).sum())
    else:
        nodes, budget_edges = np.arange(n), existing.size
    rng = np.random.default_rng(seed)
    keys = _random_non_edges(nodes, n, existing, int(rate * budget_edges), rng)
    return flip_pairs(graph, torch.from_numpy(keys))


def feature_noise(
    graph: GraphData,
    rate: float,
    seed: int = 0,
    *,
    kind: Literal["mask_columns", "gaussian"] = "mask_columns",
    setting: Setting = "transductive",
) -> GraphData:
    """`graph` with corrupted features.

    Args:
        graph: the clean graph.
        rate: the corrupted fraction, in [0, 1]: of the feature columns ("mask_columns") or of
            the nodes ("gaussian").
        seed: seeds the choice and the noise.
        kind: "mask_columns" zeroes int(rate · d) random columns (GraphSlim's "random_feat");
            "gaussian" replaces the features of int(rate · N) random nodes by N(0, 1) noise
            (GraphSlim's `add_feature_noise`).
        setting: "transductive" corrupts every node; "inductive" only the training nodes (the
            columns are zeroed on those rows; the noisy nodes are drawn among them).

    Returns:
        A copy of `graph` with new features (the other tensors shared).
    """
    graph = check_graph(graph, need_split=setting == "inductive")
    _check_rate(rate)
    _check_setting(setting)
    rng = np.random.default_rng(seed)
    x = graph.x.clone()
    rows = (
        graph.train_mask.nonzero().flatten().numpy()
        if setting == "inductive"
        else np.arange(graph.num_nodes)
    )
    if kind == "mask_columns":
        columns = rng.permutation(x.shape[1])[: int(rate * x.shape[1])]
        x[np.ix_(rows, columns)] = 0
    elif kind == "gaussian":
        noisy = rng.permutation(rows)[: int(rate * rows.size)]
        noise = rng.standard_normal((noisy.size, x.shape[1]))
        x[torch.from_numpy(noisy)] = torch.from_numpy(noise).to(x.dtype)
    else:
        raise ValueError(f"kind must be 'mask_columns' or 'gaussian', got {kind!r}")
    return graph.clone(x=x)


def corrupt(
    graph: GraphData,
    attack: str,
    rate: float,
    *,
    seed: int = 0,
    setting: Setting = "transductive",
    prbcd: PRBCDConfig | None = None,
    device: str | torch.device = "cpu",
) -> GraphData:
    """`graph` corrupted by `attack` (one of `ATTACKS`, see the module docstring) at `rate`.

    Args:
        graph: the clean graph with its split.
        attack: "random_adj", "random_feat", "gaussian_feat", "prbcd" or "metattack".
        rate: the attack's rate (GraphSlim's ptb_r).
        seed: seeds the attack.
        setting: which side is corrupted (module docstring).
        prbcd: PRBCD's schedule (its defaults when None).
        device: where PRBCD computes.

    Returns:
        The corrupted copy of `graph`.
    """
    graph = check_graph(graph)
    _check_setting(setting)
    if attack == "random_adj":
        return add_random_edges(graph, rate, seed, setting=setting)
    if attack in ("random_feat", "gaussian_feat"):
        kind = "mask_columns" if attack == "random_feat" else "gaussian"
        return feature_noise(graph, rate, seed, kind=kind, setting=setting)
    if attack in ("prbcd", "metattack"):
        _check_rate(rate)
        train_only = graph.train_mask if setting == "inductive" else None
        return prbcd_attack(
            graph, rate, seed=seed, config=prbcd, train_only=train_only, device=device
        )
    raise ValueError(f"attack must be one of {ATTACKS}, got {attack!r}")


def robustness(
    graph: GraphData,
    methods: Sequence[str] | Mapping[str, Mapping[str, Any]],
    attack: str = "random_adj",
    rate: float = 0.5,
    *,
    reduction_rate: float = 0.5,
    setting: Setting = "transductive",
    config: EvalConfig | None = None,
    seed: int = 0,
    prbcd: PRBCDConfig | None = None,
    clean: Mapping[str, CondensedGraph] | None = None,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Clean vs corrupted test accuracy, for condensed graphs and for whole-graph training.

    For each method: condense the clean graph and evaluate on it; condense the corrupted graph
    and evaluate on the corrupted graph (its clean val / test subgraphs in the inductive setting).
    The whole-graph reference trains on the clean and on the corrupted graph.

    Args:
        graph: the clean graph with its split.
        methods: method names, or a mapping name -> hyperparameters for `gc4nc.condense`.
        attack: one of `ATTACKS`.
        rate: the attack's rate (GraphSlim's robustness script: 0.5).
        reduction_rate: the condensation rate.
        setting: "transductive" or "inductive".
        config: the evaluation schedule (`EvalConfig()` when None).
        seed: seeds the attack and the condensation.
        prbcd: PRBCD's schedule, for attack "prbcd" / "metattack".
        clean: already condensed clean graphs by method name (made with the same rate, setting
            and seed), reused instead of condensing the clean graph again.
        device: where to compute.

    Returns:
        {"attack", "rate", "setting", "whole": {"clean", "attacked"},
        "methods": {name: {"clean", "attacked"}}}, each accuracy a `performance.Accuracy`.

    Example:
        >>> robustness(graph, ["random"], "random_adj", 0.5)["methods"]["random"]  # doctest: +SKIP
    """
    graph = check_graph(graph)
    config = config or EvalConfig()
    if not isinstance(methods, Mapping):
        methods = {name: {} for name in methods}
    attacked = corrupt(graph, attack, rate, seed=seed, setting=setting, prbcd=prbcd, device=device)
    result: dict[str, Any] = {
        "attack": attack,
        "rate": rate,
        "setting": setting,
        "whole": {
            "clean": whole_graph_accuracy(graph, config, setting=setting, seed=seed, device=device),
            "attacked": whole_graph_accuracy(
                attacked, config, setting=setting, seed=seed, device=device
            ),
        },
        "methods": {},
    }
    for name, hparams in methods.items():
        scores = {}
        for label, data in (("clean", graph), ("attacked", attacked)):
            if label == "clean" and clean is not None and name in clean:
                condensed = clean[name]
            else:
                condensed = condense(
                    data, name, reduction_rate, setting, seed=seed, device=device, **dict(hparams)
                )
            scores[label] = condensed_accuracy(condensed, data, config, seed=seed, device=device)
        result["methods"][name] = scores
    return result
