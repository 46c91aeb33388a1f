"""Coreset selection: keep real training nodes, class by class, and the edges among them.

Random, herding and k-center choose `counts[c]` training nodes of each class c; herding and
k-center work on the output of a GCN trained on the condensation graph (as GraphSlim / GCond's
coreset baselines), degree and PageRank keep each class's most central training nodes. The
condensed graph is the selected nodes' features, labels and induced subgraph (the original edges
among them, weight 1).

Differences from GraphSlim: every method (coresets included) uses the condensation class counts
(`gc4nc.condense.RATE_DEFINITION`), where GraphSlim's standalone coresets give every class
max(1, floor(rate·n_c)) with no remainder correction; PageRank is the standard one (networkx's),
where GraphSlim multiplies by (D⁻¹A) on the left; in the inductive setting herding and k-center
rank the training nodes' own embeddings (GraphSlim indexes full-graph rows by training positions).
"""

from __future__ import annotations

import torch

from gc4nc.graph import Structure
from gc4nc.methods.base import Condensed, CondenseTask, register
from gc4nc.models import GCN
from gc4nc.training import Split, fit


def herding(features: torch.Tensor, budget: int) -> torch.Tensor:
    """Welling's herding: greedily add the point that brings the running sum closest to
    (t + 1)·mean. Returns `budget` distinct row indices in selection order."""
    if not 0 <= budget <= features.shape[0]:
        raise ValueError(f"budget must be in [0, {features.shape[0]}], got {budget}")
    mean = features.mean(0)
    chosen: list[int] = []
    left = torch.ones(features.shape[0], dtype=torch.bool)
    total = torch.zeros_like(mean)
    for t in range(budget):
        target = mean * (t + 1) - total
        distance = torch.linalg.vector_norm(features - target, dim=1)
        distance[~left] = torch.inf
        i = int(distance.argmin())
        chosen.append(i)
        left[i] = False
        total = total + features[i]
    return torch.tensor(chosen, dtype=torch.long)


def k_center(features: torch.Tensor, budget: int) -> torch.Tensor:
    """Greedy k-center (farthest-point): start at the point nearest the mean, then repeatedly add
    the point farthest from its nearest chosen centre. Returns `budget` distinct indices."""
    n = features.shape[0]
    if not 0 <= budget <= n:
        raise ValueError(f"budget must be in [0, {n}], got {budget}")
    if budget == 0:
        return torch.empty(0, dtype=torch.long)
    first = int(torch.linalg.vector_norm(features - features.mean(0), dim=1).argmin())
    chosen = [first]
    nearest = torch.linalg.vector_norm(features - features[first], dim=1)
    for _ in range(budget - 1):
        nearest[chosen] = -1.0  # never re-pick a centre (all distances are >= 0)
        i = int(nearest.argmax())
        chosen.append(i)
        nearest = torch.minimum(nearest, torch.linalg.vector_norm(features - features[i], dim=1))
    return torch.tensor(chosen, dtype=torch.long)


def induced(task: CondenseTask, nodes: torch.Tensor) -> Condensed:
    """The condensed graph made of real nodes: their features, labels and induced adjacency."""
    nodes = nodes.to(task.graph.x.device)
    position = torch.full((task.graph.num_nodes,), -1, dtype=torch.long)
    position[nodes.cpu()] = torch.arange(nodes.numel())
    src, dst = task.graph.edge_index.cpu()
    keep = (position[src] >= 0) & (position[dst] >= 0)
    adjacency = torch.zeros(nodes.numel(), nodes.numel())
    adjacency[position[src[keep]], position[dst[keep]]] = 1.0
    adjacency.fill_diagonal_(0.0)
    adjacency = torch.maximum(adjacency, adjacency.t())
    return Condensed(
        task.graph.x[nodes].float(), adjacency, task.graph.y[nodes], {"selected": nodes.tolist()}
    )


def _per_class(task: CondenseTask, choose) -> torch.Tensor:
    picks = []
    for c, k in enumerate(task.counts.tolist()):
        if k:
            members = task.class_members(c)
            if k > members.numel():
                raise ValueError(
                    f"class {c} has {members.numel()} training nodes, fewer than "
                    f"the {k} a coreset must select"
                )
            picks.append(members[choose(members, k).cpu()])
    return torch.cat(picks)


def trained_embeddings(
    task: CondenseTask, *, hidden: int, epochs: int, lr: float, weight_decay: float
) -> torch.Tensor:
    """Log-softmax output (N, C) of a 2-layer GCN (dropout 0) trained on the condensation graph's
    training nodes, best-validation weights when the graph has validation nodes (GraphSlim's
    herding / k-center embedding)."""
    model = GCN(task.graph.x.shape[1], hidden, task.num_classes, dropout=0.0).to(task.device)
    val = None
    if task.graph.val_mask is not None and bool(task.graph.val_mask.any()):
        index = task.graph.val_mask.nonzero().flatten().to(task.device)
        val = Split(task.x, task.structure, task.y, index)
    fit(
        model,
        task.x,
        task.structure,
        task.y,
        train_index=task.train_index.to(task.device),
        val=val,
        epochs=epochs,
        lr=lr,
        weight_decay=weight_decay,
    )
    model.eval()
    with torch.no_grad():
        return torch.log_softmax(model(task.x, task.structure), -1).cpu()


# GraphSlim trains the embedding GCN in 'train' mode: 300 epochs, lr 0.01, weight decay 0
EMBEDDING_DEFAULTS = {"hidden": 256, "epochs": 300, "lr": 0.01, "weight_decay": 0.0}


@register("random", family="coreset", structure="kept")
def random_coreset(task: CondenseTask) -> Condensed:
    """Random: uniformly chosen training nodes per class."""
    return induced(
        task, _per_class(task, lambda m, k: torch.randperm(m.numel(), generator=task.generator)[:k])
    )


@register("herding", family="coreset", structure="kept", defaults=EMBEDDING_DEFAULTS)
def herding_coreset(task: CondenseTask, **embedding) -> Condensed:
    """Herding on a trained GCN's outputs, per class."""
    z = trained_embeddings(task, **embedding)
    return induced(task, _per_class(task, lambda m, k: herding(z[m], k)))


@register("kcenter", family="coreset", structure="kept", defaults=EMBEDDING_DEFAULTS)
def k_center_coreset(task: CondenseTask, **embedding) -> Condensed:
    """K-center on a trained GCN's outputs, per class."""
    z = trained_embeddings(task, **embedding)
    return induced(task, _per_class(task, lambda m, k: k_center(z[m], k)))


def degree_centrality(structure: Structure) -> torch.Tensor:
    """(N,) number of neighbours."""
    index = structure.edge_index.cpu()
    return torch.zeros(structure.num_nodes).index_add_(0, index[0], torch.ones(index.shape[1]))


def pagerank(
    structure: Structure, *, damping: float = 0.85, tol: float = 1e-10, max_iter: int = 1000
) -> torch.Tensor:
    """(N,) PageRank by power iteration on the random walk D^-1 A (dangling nodes teleport
    uniformly), the definition networkx uses."""
    n = structure.num_nodes
    index = structure.edge_index.cpu()
    weight = torch.ones(index.shape[1], dtype=torch.float64)
    if structure.edge_weight is not None:
        weight = structure.edge_weight.cpu().double()
    out_degree = torch.zeros(n, dtype=torch.float64).index_add_(0, index[0], weight)
    dangling = out_degree == 0
    # (D^-1 A)^T: rank flows from each source along its out-edges, split by weight
    walk_t = torch.sparse_coo_tensor(
        index.flip(0), weight / out_degree[index[0]], (n, n), check_invariants=False
    ).coalesce()
    rank = torch.full((n,), 1.0 / n, dtype=torch.float64)
    for _ in range(max_iter):
        new = (
            damping * (torch.sparse.mm(walk_t, rank[:, None])[:, 0] + rank[dangling].sum() / n)
            + (1 - damping) / n
        )
        if (new - rank).abs().sum() < n * tol:
            return new.float()
        rank = new
    return rank.float()


def _top(score: torch.Tensor):
    return lambda members, k: torch.sort(score[members], descending=True, stable=True).indices[:k]


@register("degree", family="coreset", structure="kept")
def degree_coreset(task: CondenseTask) -> Condensed:
    """Degree centrality: each class's highest-degree training nodes."""
    return induced(task, _per_class(task, _top(degree_centrality(task.structure))))


@register("pagerank", family="coreset", structure="kept", defaults={"damping": 0.85})
def pagerank_coreset(task: CondenseTask, damping: float) -> Condensed:
    """PageRank centrality: each class's highest-PageRank training nodes."""
    return induced(task, _per_class(task, _top(pagerank(task.structure, damping=damping))))
