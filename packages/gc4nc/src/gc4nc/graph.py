"""Node-classification graphs, their splits and settings, and the propagation operators GNNs use.

A graph is a `GraphData` or a PyTorch Geometric `Data` (anything with these attributes is taken):
`x (N, F)`, `edge_index (2, E)` (undirected: both directions present), `y (N,)` and boolean
`train_mask` / `val_mask` / `test_mask`; optional `edge_weight (E,)`. `as_graph` converts,
`check_graph` says exactly what is missing or inconsistent. `GraphData` exists so that importing
gc4nc does not import PyG (whose import takes seconds); `GraphData.to_pyg` / `from_pyg` convert.

`Structure` is what a GNN propagates over: the original graph as a sparse matrix, or a condensed
graph's dense weighted adjacency (differentiable, so condensation can learn it), or no structure at
all (structure-free condensed graphs: the identity). Its operators are built once and cached:
`gcn` = D̃^-1/2 (A + I) D̃^-1/2 (Kipf & Welling; the normalisation GraphSlim applies to both the
original and the condensed adjacency), `mean` = D^-1 A (GraphSAGE's mean aggregator) and `cheb` =
−D^-1/2 A D^-1/2 (the scaled Laplacian 2L/λ_max − I with λ_max = 2, as PyG's ChebConv).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import numpy as np
import torch

Setting = Literal["transductive", "inductive"]
SETTINGS = ("transductive", "inductive")
MASKS = ("train_mask", "val_mask", "test_mask")


@dataclass
class GraphData:
    """A node-classification graph (the fields of a PyG `Data` that condensation uses)."""

    x: torch.Tensor
    edge_index: torch.Tensor
    y: torch.Tensor
    train_mask: torch.Tensor | None = None
    val_mask: torch.Tensor | None = None
    test_mask: torch.Tensor | None = None
    edge_weight: torch.Tensor | None = None

    @property
    def num_nodes(self) -> int:
        return self.x.shape[0]

    def clone(self, **changes: Any) -> GraphData:
        """A shallow copy (tensors shared) with `changes` applied."""
        return replace(self, **changes)

    @classmethod
    def from_pyg(cls, data: Any) -> GraphData:
        return cls(**{f.name: getattr(data, f.name, None) for f in fields(cls)})

    def to_pyg(self):
        """A `torch_geometric.data.Data` with the same tensors."""
        from gc4nc._pyg import import_pyg

        return import_pyg().data.Data(
            **{
                f.name: getattr(self, f.name)
                for f in fields(self)
                if getattr(self, f.name) is not None
            }
        )


def as_graph(graph: Any) -> GraphData:
    """`graph` as a `GraphData` (from a PyG `Data` or anything with x, edge_index, y, ...)."""
    if isinstance(graph, GraphData):
        return graph
    if not all(hasattr(graph, name) for name in ("x", "edge_index", "y")):
        raise TypeError(
            f"graph must be a gc4nc.GraphData or a torch_geometric Data with x, edge_index and y; "
            f"got {type(graph).__name__}"
        )
    return GraphData.from_pyg(graph)


def check_graph(graph: Any, *, need_split: bool = True) -> GraphData:
    """`graph` as a `GraphData`; ValueError naming what is wrong with it for node classification."""
    graph = as_graph(graph)
    for name in ("x", "edge_index", "y"):
        if getattr(graph, name, None) is None:
            raise ValueError(f"graph has no `{name}`; node classification needs x, edge_index, y")
    x, edge_index, y = graph.x, graph.edge_index, graph.y
    if x.ndim != 2:
        raise ValueError(f"graph.x must be (N, F), got shape {tuple(x.shape)}")
    n = x.shape[0]
    if y.shape != (n,):
        raise ValueError(f"graph.y must be (N,) = ({n},) integer labels, got {tuple(y.shape)}")
    if y.dtype.is_floating_point or y.dtype == torch.bool:
        raise ValueError(f"graph.y must hold integer class labels, got {y.dtype}")
    if n and int(y.min()) < 0:
        raise ValueError("graph.y has negative labels; classes must be 0..C-1")
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"graph.edge_index must be (2, E), got {tuple(edge_index.shape)}")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= n):
        raise ValueError(f"graph.edge_index refers to nodes outside [0, {n})")
    weight = getattr(graph, "edge_weight", None)
    if weight is not None and weight.shape != (edge_index.shape[1],):
        raise ValueError(
            f"graph.edge_weight must be (E,) = ({edge_index.shape[1]},), got {tuple(weight.shape)}"
        )
    if x.dtype.is_floating_point and not bool(torch.isfinite(x).all()):
        raise ValueError("graph.x contains NaN or infinite values")
    if edge_index.numel():
        keys = edge_index[0] * n + edge_index[1]
        back = edge_index[1] * n + edge_index[0]
        if not bool(torch.isin(back, keys).all()):
            raise ValueError(
                "graph.edge_index is directed: every edge needs its reverse (undirected graphs; "
                "torch_geometric.utils.to_undirected makes one)"
            )
    if not need_split:
        return graph
    for name in MASKS:
        mask = getattr(graph, name, None)
        if mask is None:
            raise ValueError(
                f"graph has no `{name}`; add a split first (gc4nc.planetoid_split or random_split)"
            )
        if mask.dtype != torch.bool or mask.shape != (n,):
            raise ValueError(f"graph.{name} must be a bool (N,) = ({n},) mask")
        if not bool(mask.any()):
            raise ValueError(f"graph.{name} selects no nodes")
    for a, b in (("train", "test"), ("train", "val"), ("val", "test")):
        if bool((getattr(graph, f"{a}_mask") & getattr(graph, f"{b}_mask")).any()):
            raise ValueError(f"graph.{a}_mask and graph.{b}_mask overlap")
    return graph


def num_classes(graph: GraphData) -> int:
    """C = 1 + the largest label."""
    return int(graph.y.max()) + 1


def _masks(n: int, train: np.ndarray, val: np.ndarray, test: np.ndarray) -> dict[str, torch.Tensor]:
    out = {}
    for name, index in zip(MASKS, (train, val, test), strict=True):
        mask = torch.zeros(n, dtype=torch.bool)
        mask[torch.from_numpy(np.asarray(index, dtype=np.int64))] = True
        out[name] = mask
    return out


def planetoid_split(
    graph: GraphData,
    *,
    per_class: int = 20,
    num_val: int = 500,
    num_test: int = 1000,
    seed: int = 0,
) -> GraphData:
    """The public Planetoid-style split: `per_class` training nodes per class, then `num_val`
    validation and `num_test` test nodes drawn from the rest, all seeded. Returns a copy."""
    graph = check_graph(graph, need_split=False)
    rng = np.random.default_rng(seed)
    y = graph.y.numpy()
    train = []
    for c in range(num_classes(graph)):
        members = np.flatnonzero(y == c)
        if members.size < per_class:
            raise ValueError(
                f"class {c} has {members.size} nodes, fewer than per_class={per_class}"
            )
        train.append(rng.choice(members, per_class, replace=False))
    train = np.sort(np.concatenate(train))
    rest = rng.permutation(np.setdiff1d(np.arange(y.size), train))
    if rest.size < num_val + num_test:
        raise ValueError(
            f"{rest.size} nodes remain after the training nodes, fewer than num_val + num_test = "
            f"{num_val + num_test}"
        )
    return graph.clone(**_masks(y.size, train, rest[:num_val], rest[num_val : num_val + num_test]))


def random_split(
    graph: GraphData, *, train: float = 0.5, val: float = 0.25, seed: int = 0, stratify: bool = True
) -> GraphData:
    """A seeded random split: fractions `train` and `val` of the nodes, the rest test; stratified
    by class by default (each class split in the same proportions). Returns a copy."""
    graph = check_graph(graph, need_split=False)
    if not (0 < train < 1 and 0 < val < 1 and train + val < 1):
        raise ValueError(f"need 0 < train, val and train + val < 1, got train={train}, val={val}")
    rng = np.random.default_rng(seed)
    y = graph.y.numpy()
    groups = [np.flatnonzero(y == c) for c in np.unique(y)] if stratify else [np.arange(y.size)]
    parts: list[list[np.ndarray]] = [[], [], []]
    for members in groups:
        members = rng.permutation(members)
        a = round(train * members.size)
        b = a + round(val * members.size)
        for part, index in zip(parts, (members[:a], members[a:b], members[b:]), strict=True):
            part.append(index)
    return graph.clone(**_masks(y.size, *(np.concatenate(p) for p in parts)))


def from_benchdata(
    graph, *, split: Literal["planetoid", "random"] = "planetoid", seed: int = 0, **split_kwargs
) -> GraphData:
    """A PyG `GraphData` from a `benchdata.Graph` (or anything with edge_index, features, labels),
    with a Planetoid-style or random split."""
    data = GraphData(graph.features.float(), graph.edge_index.long(), graph.labels.long())
    if split == "planetoid":
        return planetoid_split(data, seed=seed, **split_kwargs)
    if split == "random":
        return random_split(data, seed=seed, **split_kwargs)
    raise ValueError(f"split must be 'planetoid' or 'random', got {split!r}")


def induced_subgraph(graph: GraphData, mask: torch.Tensor) -> GraphData:
    """The subgraph on the nodes of `mask`, relabelled 0..n-1 in node order, masks carried."""
    position = torch.full((graph.num_nodes,), -1, dtype=torch.long)
    position[mask] = torch.arange(int(mask.sum()))
    src, dst = graph.edge_index
    keep = (position[src] >= 0) & (position[dst] >= 0)
    weight = graph.edge_weight
    masks = {
        name: None if getattr(graph, name) is None else getattr(graph, name)[mask] for name in MASKS
    }
    return GraphData(
        graph.x[mask],
        torch.stack([position[src[keep]], position[dst[keep]]]),
        graph.y[mask],
        **masks,
        edge_weight=None if weight is None else weight[keep],
    )


def condensation_view(graph: GraphData, setting: Setting) -> GraphData:
    """What condensation sees. Transductive: the whole graph (all features and edges; labels of
    the training nodes only are used). Inductive: the subgraph induced by the training nodes, as
    GraphSlim's inductive setting (the validation and test nodes and their edges are unseen)."""
    if setting == "transductive":
        return graph
    if setting == "inductive":
        return induced_subgraph(graph, graph.train_mask)
    raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")


@dataclass(eq=False)
class Structure:
    """What a GNN propagates over: a sparse graph, a dense weighted adjacency, or the identity.

    Build with `Structure.from_graph(data)`, `Structure.dense(adj)` or `Structure.identity(n)`.
    Operators are computed on first use and cached; a dense adjacency keeps its autograd graph.
    """

    num_nodes: int
    edge_index: torch.Tensor | None = None
    edge_weight: torch.Tensor | None = None
    adjacency: torch.Tensor | None = None  # dense (n, n), symmetric, non-negative
    _cache: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def from_graph(cls, graph: GraphData) -> Structure:
        weight = getattr(graph, "edge_weight", None)
        return cls(graph.num_nodes, graph.edge_index, weight)

    @classmethod
    def dense(cls, adjacency: torch.Tensor) -> Structure:
        if adjacency.ndim != 2 or adjacency.shape[0] != adjacency.shape[1]:
            raise ValueError(f"adjacency must be square (n, n), got {tuple(adjacency.shape)}")
        return cls(adjacency.shape[0], adjacency=adjacency)

    @classmethod
    def identity(cls, num_nodes: int) -> Structure:
        return cls(num_nodes)

    @property
    def is_identity(self) -> bool:
        return self.adjacency is None and self.edge_index is None

    @property
    def device(self) -> torch.device:
        for t in (self.adjacency, self.edge_index):
            if t is not None:
                return t.device
        return torch.device("cpu")

    def _sparse(self, values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        n = self.num_nodes
        # COO: on CPU its products (forward and backward) beat CSR's, and it carries gradients
        return torch.sparse_coo_tensor(index, values, (n, n), check_invariants=False).coalesce()

    def _weights(self) -> torch.Tensor:
        if self.edge_weight is not None:
            return self.edge_weight.float()
        return torch.ones(self.edge_index.shape[1], device=self.edge_index.device)

    def _operator(self, kind: str) -> torch.Tensor | None:
        n = self.num_nodes
        if self.is_identity:
            return None  # propagation is the identity
        if self.adjacency is not None:
            a = self.adjacency
            if kind == "gcn":
                a = a + torch.eye(n, device=a.device, dtype=a.dtype)
            deg = a.sum(1)
            if kind == "mean":
                return a / deg.clamp_min(1e-12)[:, None]
            inv = deg.clamp_min(1e-12).rsqrt() * (deg > 0)
            norm = inv[:, None] * a * inv[None, :]
            return -norm if kind == "cheb" else norm
        index, weight = self.edge_index, self._weights()
        if kind == "gcn":
            loops = torch.arange(n, device=index.device)
            index = torch.cat([index, torch.stack([loops, loops])], 1)
            weight = torch.cat([weight, torch.ones(n, device=weight.device)])
        deg = torch.zeros(n, device=weight.device).index_add_(0, index[0], weight)
        if kind == "mean":
            values = weight / deg.clamp_min(1e-12)[index[0]]
        else:
            inv = deg.clamp_min(1e-12).rsqrt() * (deg > 0)
            values = inv[index[0]] * weight * inv[index[1]]
            if kind == "cheb":
                values = -values
        return self._sparse(values, index)

    def operator(self, kind: Literal["gcn", "mean", "cheb"] = "gcn") -> torch.Tensor | None:
        """The (n, n) propagation matrix (dense or sparse), or None for the identity."""
        if kind not in ("gcn", "mean", "cheb"):
            raise ValueError(f"operator kind must be 'gcn', 'mean' or 'cheb', got {kind!r}")
        if self.adjacency is not None and self.adjacency.requires_grad:
            return self._operator(kind)  # never cache a tensor that carries an autograd graph
        if kind not in self._cache:
            self._cache[kind] = self._operator(kind)
        return self._cache[kind]

    def propagate(
        self, x: torch.Tensor, kind: Literal["gcn", "mean", "cheb"] = "gcn"
    ) -> torch.Tensor:
        op = self.operator(kind)
        if op is None:
            return x if kind != "cheb" else torch.zeros_like(x)  # identity graph: L̃ = 0
        return op @ x if not op.is_sparse else torch.sparse.mm(op, x)

    def edges(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(edge_index, edge_weight) for edge-list layers (GAT): a dense adjacency's non-zero
        off-diagonal entries; the identity has no edges (layers add self loops)."""
        if self.adjacency is not None:
            a = self.adjacency
            index = (a.detach() > 0).nonzero().t()
            index = index[:, index[0] != index[1]]
            return index, a[index[0], index[1]]
        if self.edge_index is None:
            return torch.empty(2, 0, dtype=torch.long), None
        return self.edge_index, self.edge_weight
