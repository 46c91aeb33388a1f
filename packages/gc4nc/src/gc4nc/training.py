"""Training a node classifier on one graph and measuring it on another.

`fit` trains on (x, structure, targets) for a fixed number of epochs with Adam, checks accuracy on
a validation graph every epoch and restores the best-validation weights: the evaluation protocol
GraphSlim uses for condensed graphs (train on the condensed graph, select on the original graph's
validation nodes, report on its test nodes), including its schedule: at half the epochs a fresh
Adam with a tenth of the learning rate (when that rate is above 10⁻³). Soft labels train with
cross-entropy against the distribution (the gradient of GraphSlim's KL loss).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gc4nc.graph import GraphData, Setting, Structure, induced_subgraph


@dataclass
class Split:
    """Nodes `index` of graph (x, structure) with labels y: where a model is validated / tested."""

    x: torch.Tensor
    structure: Structure
    y: torch.Tensor
    index: torch.Tensor

    @classmethod
    def of(cls, graph: GraphData, mask: torch.Tensor, setting: Setting = "transductive") -> Split:
        """Transductive: the whole graph, scored on `mask`. Inductive: the subgraph induced by
        `mask` alone (GraphSlim's inductive validation / test graphs)."""
        if setting == "inductive":
            graph = induced_subgraph(graph, mask)
            mask = torch.ones(graph.num_nodes, dtype=torch.bool)
        return cls(graph.x, Structure.from_graph(graph), graph.y, mask.nonzero().flatten())

    def to(self, device: torch.device) -> Split:
        s = self.structure
        moved = Structure(
            s.num_nodes,
            None if s.edge_index is None else s.edge_index.to(device),
            None if s.edge_weight is None else s.edge_weight.to(device),
            None if s.adjacency is None else s.adjacency.to(device),
        )
        return Split(self.x.to(device), moved, self.y.to(device), self.index.to(device))


def classification_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against hard labels (n,) or soft labels (n, C)."""
    if targets.ndim == 2:
        return -(targets * F.log_softmax(logits, -1)).sum(-1).mean()
    return F.cross_entropy(logits, targets)


@torch.no_grad()
def predict(model: nn.Module, split: Split) -> torch.Tensor:
    """Logits of `split.index` (eval mode)."""
    model.eval()
    return model(split.x, split.structure)[split.index]


@torch.no_grad()
def accuracy(model: nn.Module, split: Split) -> float:
    return (predict(model, split).argmax(-1) == split.y[split.index]).float().mean().item()


@dataclass
class FitResult:
    best_val: float
    best_epoch: int
    val_history: list[float]


def fit(
    model: nn.Module,
    x: torch.Tensor,
    structure: Structure,
    targets: torch.Tensor,
    *,
    train_index: torch.Tensor | None = None,
    val: Split | None = None,
    epochs: int = 600,
    lr: float = 0.01,
    weight_decay: float = 5e-4,
    val_every: int = 1,
    decay_at_half: bool = True,
) -> FitResult:
    """Train `model` with Adam on the nodes `train_index` (all nodes if None); with `val`, keep the
    weights of the epoch with the best validation accuracy (the first such epoch on ties). With
    `decay_at_half`, a new Adam at lr/10 takes over at epoch epochs // 2 if lr > 10⁻³."""
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    labels = targets if train_index is None else targets[train_index]
    best, best_epoch, best_state, history = -1.0, -1, None, []
    for epoch in range(epochs):
        if decay_at_half and epoch == epochs // 2 and epoch and lr > 1e-3:
            optimizer = torch.optim.Adam(model.parameters(), lr=lr / 10, weight_decay=weight_decay)
        model.train()
        optimizer.zero_grad()
        logits = model(x, structure)
        if train_index is not None:
            logits = logits[train_index]
        classification_loss(logits, labels).backward()
        optimizer.step()
        if val is not None and (epoch % val_every == 0 or epoch == epochs - 1):
            score = accuracy(model, val)
            history.append(score)
            if score > best:
                best, best_epoch = score, epoch
                best_state = copy.deepcopy(model.state_dict())
    if best_state is not None:
        model.load_state_dict(best_state)
    return FitResult(best, best_epoch, history)
