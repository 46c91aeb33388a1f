"""Graph generators: contextual stochastic block models and k-NN graphs over real image features.

No registry here ships citation graphs (Cora, CiteSeer, ogbn-*). A contextual SBM gives node
classification data with a chosen homophily; a k-NN graph over real images gives real features
with the homophily the data has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import numpy as np
import torch

from benchdata.vision import digits, fashion_mnist, mnist_5k


class Graph(NamedTuple):
    """An undirected node-classification graph.

    `edge_index` int64 `(2, E)` holds both directions of every edge, no self loops, no duplicates,
    sorted by (source, target); `features` float32 `(N, F)`; `labels` int64 `(N,)`.
    """

    edge_index: torch.Tensor
    features: torch.Tensor
    labels: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return self.labels.numel()


def edge_homophily(edge_index: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of edges whose two ends share a label (Zhu et al., 2020)."""
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must be (2, E), got {tuple(edge_index.shape)}")
    if edge_index.shape[1] == 0:
        raise ValueError("edge homophily is undefined for a graph without edges")
    return (labels[edge_index[0]] == labels[edge_index[1]]).double().mean().item()


def _undirected(pairs: np.ndarray, num_nodes: int) -> torch.Tensor:
    """Unique undirected pairs `(P, 2)` -> sorted `edge_index` `(2, 2P)` with both directions."""
    both = np.concatenate([pairs, pairs[:, ::-1]])
    keys = np.unique(both[:, 0].astype(np.int64) * num_nodes + both[:, 1])
    return torch.from_numpy(np.stack([keys // num_nodes, keys % num_nodes]))


def _unique_pairs(
    rng: np.random.Generator,
    count: int,
    sample: Callable[[np.random.Generator, int], np.ndarray],
    num_nodes: int,
) -> np.ndarray:
    """`count` distinct undirected pairs drawn with `sample(rng, n) -> (n, 2)`, in random order."""
    found = np.empty(0, dtype=np.int64)
    while found.size < count:
        pairs = np.sort(sample(rng, 2 * (count - found.size) + 16), axis=1)
        keys = pairs[:, 0] * num_nodes + pairs[:, 1]
        _, first = np.unique(np.concatenate([found, keys]), return_index=True)
        found = np.concatenate([found, keys])[np.sort(first)]
    keys = found[:count]
    return np.stack([keys // num_nodes, keys % num_nodes], axis=1)


def csbm(
    num_nodes: int,
    *,
    num_classes: int = 2,
    homophily: float = 0.8,
    average_degree: float = 10.0,
    num_features: int = 32,
    feature_signal: float = 1.0,
    seed: int = 0,
) -> Graph:
    """A contextual stochastic block model (Deshpande et al., 2018) with exact edge homophily.

    Labels are balanced over `num_classes`. Node i's features are `μ_{y_i} + N(0, I)`, with the
    class means orthogonal and of norm `feature_signal` (so two class means lie
    `feature_signal·√2` apart). The graph has `round(num_nodes·average_degree/2)` undirected
    edges, `round(homophily·E)` of them inside a class: each picks a uniform node, then a uniform
    partner in the same class (intra) or in another class (inter); duplicates are redrawn.

    Returns:
        `Graph` with `edge_homophily(...)` = `homophily` up to the rounding of edge counts.
    """
    if num_classes < 2 or num_nodes < 2 * num_classes:
        raise ValueError(
            f"need num_classes >= 2 and num_nodes >= 2·num_classes, got {num_nodes}, {num_classes}"
        )
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"homophily must be in [0, 1], got {homophily}")
    if num_features < num_classes:
        raise ValueError(f"num_features must be >= num_classes ({num_classes}), got {num_features}")
    if average_degree <= 0 or feature_signal < 0:
        raise ValueError("average_degree must be > 0 and feature_signal >= 0")
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(num_nodes) % num_classes)
    members = [np.flatnonzero(labels == c) for c in range(num_classes)]
    sizes = np.array([m.size for m in members])

    num_edges = round(num_nodes * average_degree / 2)
    num_intra = round(homophily * num_edges)
    possible_intra = int((sizes * (sizes - 1) // 2).sum())
    possible_inter = num_nodes * (num_nodes - 1) // 2 - possible_intra
    if num_intra > possible_intra or num_edges - num_intra > possible_inter:
        raise ValueError(
            f"{num_edges} edges at homophily {homophily} do not fit {num_nodes} nodes: "
            "lower average_degree"
        )

    rank = np.empty(num_nodes, dtype=np.int64)  # a node's position among its class's members
    class_members = np.zeros((num_classes, sizes.max()), dtype=np.int64)
    for c, m in enumerate(members):
        rank[m] = np.arange(m.size)
        class_members[c, : m.size] = m

    def intra(rng, n):
        source = rng.integers(0, num_nodes, n)
        group = labels[source]
        offset = rng.integers(1, sizes[group])  # uniform over the other members of the class
        return np.stack([source, class_members[group, (rank[source] + offset) % sizes[group]]], 1)

    def inter(rng, n):
        source = rng.integers(0, num_nodes, n)
        target = rng.integers(0, num_nodes, n)
        keep = labels[source] != labels[target]
        return np.stack([source[keep], target[keep]], 1)

    pairs = np.concatenate(
        [
            _unique_pairs(rng, num_intra, intra, num_nodes),
            _unique_pairs(rng, num_edges - num_intra, inter, num_nodes),
        ]
    )
    means = np.linalg.qr(rng.standard_normal((num_features, num_classes)))[0].T * feature_signal
    features = means[labels] + rng.standard_normal((num_nodes, num_features))
    return Graph(
        _undirected(pairs, num_nodes),
        torch.from_numpy(features.astype(np.float32)),
        torch.from_numpy(labels.astype(np.int64)),
    )


def knn_graph(
    features: torch.Tensor,
    k: int,
    *,
    metric: Literal["euclidean", "cosine"] = "euclidean",
    block_size: int = 1024,
) -> torch.Tensor:
    """The symmetrized k-nearest-neighbour graph of `features` `(N, F)` as `edge_index (2, E)`.

    Each node links to its k nearest other nodes; an edge is kept if either end chose it. Ties
    between equal computed distances go to the lower index. Distances are computed in float64:
    exactly for integer-valued features such as pixels, so mathematically equal distances tie;
    for other features two equal distances can differ in their last bit and then the nearer one
    by that rounding wins. Computed in row blocks: memory O(block_size·N).
    """
    if features.ndim != 2:
        raise ValueError(f"features must be (N, F), got shape {tuple(features.shape)}")
    num_nodes = features.shape[0]
    if not 1 <= k < num_nodes:
        raise ValueError(f"k must be in [1, N-1] = [1, {num_nodes - 1}], got {k}")
    if metric not in ("euclidean", "cosine"):
        raise ValueError(f"metric must be 'euclidean' or 'cosine', got {metric!r}")
    x = features.double()
    if metric == "cosine":
        x = torch.nn.functional.normalize(x, dim=1)
    neighbours = []
    for start in range(0, num_nodes, block_size):
        rows = x[start : start + block_size]
        distance = torch.cdist(rows, x)
        distance[torch.arange(rows.shape[0]), torch.arange(start, start + rows.shape[0])] = np.inf
        # stable sort: among equal distances the lower index comes first
        neighbours.append(torch.sort(distance, dim=1, stable=True).indices[:, :k])
    target = torch.cat(neighbours).reshape(-1).numpy()
    source = np.repeat(np.arange(num_nodes), k)
    return _undirected(np.stack([source, target], 1), num_nodes)


def image_knn_graph(
    dataset: Literal["digits", "mnist_5k", "fashion_mnist"] = "digits",
    *,
    k: int = 10,
    num_nodes: int | None = None,
    metric: Literal["euclidean", "cosine"] = "euclidean",
    seed: int = 0,
) -> Graph:
    """A k-NN graph over real images: nodes are images, features their pixels scaled to [0, 1].

    Args:
        dataset: "digits" (1,797 nodes), "mnist_5k" (5,000) or "fashion_mnist" (60,000 train).
        num_nodes: keep a seeded random subset of this many images (None: all).
    """
    loaders = {"digits": digits, "mnist_5k": mnist_5k, "fashion_mnist": fashion_mnist}
    if dataset not in loaders:
        raise ValueError(f"dataset must be one of {sorted(loaders)}, got {dataset!r}")
    images, labels, _ = loaders[dataset]()
    if num_nodes is not None:
        if not 2 <= num_nodes <= labels.size:
            raise ValueError(f"num_nodes must be in [2, {labels.size}], got {num_nodes}")
        keep = np.sort(np.random.default_rng(seed).choice(labels.size, num_nodes, replace=False))
        images, labels = images[keep], labels[keep]
    scale = 16.0 if dataset == "digits" else 255.0
    features = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / scale)
    return Graph(knn_graph(features, k, metric=metric), features, torch.from_numpy(labels))
