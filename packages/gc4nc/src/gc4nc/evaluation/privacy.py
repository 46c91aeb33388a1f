"""Privacy: a confidence-threshold membership-inference attack on models trained on condensed data.

The question (GC4NC, section "privacy preservation"): does a model trained on the condensed graph
leak less about *which nodes were in the original training set* than a model trained on the
original graph? The attacker sees the target model's softmax output for a node and its true label,
and guesses "member" when the probability of the true label is at least a threshold δ.

As GraphSlim (`Evaluator.test(MIA=True)` with `inference_via_confidence`):

- target models: the evaluation model (`EvalConfig`, a GCN by default) trained on the condensed
  graph (`performance.train_on_condensed`), and the same model trained on the original graph
  (`performance.train_on_original`), the reference;
- members are the original graph's training nodes, non-members its test nodes;
- the score of a node is the softmax probability of its true label. Transductive: the model runs
  on the whole original graph. Inductive: members are scored on the subgraph induced by the
  training nodes, non-members on the subgraph induced by the test nodes;
- attack accuracy = max(0.5, max over thresholds δ of (TPR(δ) + TNR(δ)) / 2), δ ranging over
  every observed score (members and non-members) and a node predicted a member iff score ≥ δ.
  0.5 is chance; GraphSlim starts its running maximum at 0.5, and so do we (a threshold above
  every score, which predicts "non-member" for all, reaches exactly 0.5 anyway).

Difference from the anchor: GraphSlim scans every threshold and recounts both groups for each,
O(n²); `attack_accuracy` sorts once and counts with binary search, O(n log n), with the same result
(ties included: a member whose score equals δ counts as predicted member). GraphSlim's
`MIA_evaluate` is never called by its scripts; here `membership_inference` is the dimension.
"""

from __future__ import annotations

import numpy as np
import torch

from gc4nc.condensed import CondensedGraph
from gc4nc.evaluation.performance import (
    Accuracy,
    EvalConfig,
    _summary,
    train_on_condensed,
    train_on_original,
)
from gc4nc.graph import GraphData, Setting, check_graph
from gc4nc.training import Split, predict

CHANCE = 0.5


def attack_accuracy(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> float:
    """The best balanced accuracy of a threshold attack "member iff score ≥ δ".

    Args:
        member_scores: (m,) scores of the members (true-label confidences).
        nonmember_scores: (k,) scores of the non-members.

    Returns:
        max(0.5, max over δ in the observed scores of (TPR(δ) + TNR(δ)) / 2), where TPR(δ) is the
        fraction of members with score ≥ δ and TNR(δ) the fraction of non-members with score < δ.
        O((m + k) log(m + k)).

    Example:
        >>> attack_accuracy(np.array([0.9, 0.8]), np.array([0.1, 0.85]))
        0.75
    """
    members = np.sort(np.asarray(member_scores, dtype=np.float64).ravel())
    nonmembers = np.sort(np.asarray(nonmember_scores, dtype=np.float64).ravel())
    if members.size == 0 or nonmembers.size == 0:
        raise ValueError(
            f"need at least one member and one non-member score, got {members.size} and "
            f"{nonmembers.size}"
        )
    if np.isnan(members).any() or np.isnan(nonmembers).any():
        raise ValueError("scores contain NaN")
    thresholds = np.unique(np.concatenate([members, nonmembers]))
    # members at or above δ = m − (members strictly below δ); non-members below δ
    tpr = 1.0 - np.searchsorted(members, thresholds, side="left") / members.size
    tnr = np.searchsorted(nonmembers, thresholds, side="left") / nonmembers.size
    return float(max(CHANCE, 0.5 * (tpr + tnr).max()))


def true_label_confidence(model: torch.nn.Module, split: Split) -> np.ndarray:
    """(len(split.index),) the softmax probability the model gives each node's true label."""
    probabilities = predict(model, split).softmax(-1)
    labels = split.y[split.index]
    return probabilities.gather(1, labels[:, None]).squeeze(1).double().cpu().numpy()


def model_attack_accuracy(
    model: torch.nn.Module, graph: GraphData, setting: Setting, device: torch.device
) -> float:
    """The attack's accuracy against `model`: members = `graph`'s training nodes, non-members =
    its test nodes, scored on the whole graph (transductive) or on each one's induced subgraph
    (inductive)."""
    members = Split.of(graph, graph.train_mask, setting).to(device)
    nonmembers = Split.of(graph, graph.test_mask, setting).to(device)
    return attack_accuracy(
        true_label_confidence(model, members), true_label_confidence(model, nonmembers)
    )


def membership_inference(
    condensed: CondensedGraph,
    graph: GraphData,
    config: EvalConfig | None = None,
    runs: int | None = None,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    original: bool = True,
) -> dict[str, Accuracy]:
    """Membership-inference attack accuracy against models trained on `condensed` and on `graph`.

    Args:
        condensed: the condensed graph (its metadata's "setting" picks transductive / inductive
            scoring; transductive when absent).
        graph: the original graph with its split; members are its training nodes, non-members its
            test nodes.
        config: the target model and its schedule (GraphSlim's evaluator by default).
        runs: target models per side, seeds seed, seed + 1, ...; `config.runs` when None.
        seed: the first seed.
        device: where to train.
        original: also attack models trained on the original graph (the reference, the same for
            every condensed graph of `graph`: compute it once when comparing many).

    Returns:
        {"condensed": Accuracy, "original": Accuracy} ("original" only with `original`): attack
        accuracy mean ± std over runs (0.5 is chance; lower is more private).

    Example:
        >>> result = membership_inference(condensed, graph, EvalConfig(epochs=50), runs=2)
        >>> result["condensed"].mean <= 1.0
        True
    """
    graph = check_graph(graph)
    config = config or EvalConfig()
    runs = config.runs if runs is None else runs
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    setting = condensed.metadata.get("setting", "transductive")
    device = torch.device(device)
    on_condensed, on_original = [], []
    for run in range(runs):
        model, _ = train_on_condensed(
            condensed, graph, config, seed=seed + run, setting=setting, device=device
        )
        on_condensed.append(model_attack_accuracy(model, graph, setting, device))
        if original:
            model, _ = train_on_original(
                graph, config, seed=seed + run, setting=setting, device=device
            )
            on_original.append(model_attack_accuracy(model, graph, setting, device))
    if not original:
        return {"condensed": _summary(on_condensed)}
    return {"condensed": _summary(on_condensed), "original": _summary(on_original)}
