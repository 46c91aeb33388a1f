"""Named graphs for the command line, the benchmark and `reproduce`, all offline (benchdata).

- `debian`: the Debian package graph (benchdata; 37,646 packages, Depends / Pre-Depends /
  Recommends edges, MiniLM embeddings of the descriptions, the 10 largest Sections as classes),
  the ogbn-arxiv analogue; random stratified 50 / 25 / 25 % split; rates 0.0025, 0.005, 0.01.
- `debian-bow`: the same graph with 512-d hashed bag-of-words features.
- `fashion-knn`: 10-NN graph over 5,000 real Fashion-MNIST images (pixels), the Cora analogue;
  Planetoid-style split (20 per class / 500 / 1000); rates 0.1, 0.25, 0.5.
- `digits-knn`: 10-NN graph over scikit-learn's 1,797 digits; 20 per class / 300 / 1000.
- `csbm`: contextual SBM, 3,000 nodes, 5 classes, homophily 0.8; Planetoid-style split.
- `karate`: Zachary's karate club (PyG), 4 communities; random 50 / 25 / 25 % split.
- `planetoid:ROOT:NAME`: Cora / CiteSeer / PubMed from a user folder (raw Planetoid files), with
  the public split; rates 0.1, 0.25, 0.5.
- `ogb:ROOT:NAME`: ogbn-arxiv / ogbn-products from a user folder (raw OGB files), with OGB's
  split; rates 0.001, 0.005, 0.01.

Planetoid features are row-normalised (L1) and OGB features standardised on the training nodes, as
GraphSlim loads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gc4nc.graph import GraphData, from_benchdata, induced_subgraph

DATASETS = ("debian", "debian-bow", "fashion-knn", "digits-knn", "csbm", "karate")
USER_PATH_KINDS = ("planetoid", "ogb")


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    rates: tuple[float, ...]
    description: str


RATES = {
    # GraphSlim's ogbn-arxiv rates are 0.001 / 0.005 / 0.01 of 90k training nodes; 0.001 of the
    # 4,000 training nodes of reproduce's 8,000-node Debian subgraph leaves 4 nodes for 10
    # classes, so the smallest rate here is 0.0025 (10 nodes)
    "debian": (0.0025, 0.005, 0.01),
    "debian-bow": (0.0025, 0.005, 0.01),
    "fashion-knn": (0.1, 0.25, 0.5),
    "digits-knn": (0.1, 0.25, 0.5),
    "csbm": (0.1, 0.25, 0.5),
    "karate": (0.5,),
    "planetoid": (0.1, 0.25, 0.5),
    "ogb": (0.001, 0.005, 0.01),
}


def _with_split(x, edge_index, y, split: dict[str, torch.Tensor]) -> GraphData:
    masks = {}
    for key, name in (("train", "train_mask"), ("val", "val_mask"), ("test", "test_mask")):
        mask = torch.zeros(y.numel(), dtype=torch.bool)
        mask[split[key]] = True
        masks[name] = mask
    return GraphData(x, edge_index, y, **masks)


def default_rates(name: str) -> tuple[float, ...]:
    """The reduction rates the benchmark sweeps for dataset `name`."""
    return RATES[name.split(":", 1)[0]]


def load_dataset(name: str, *, seed: int = 0, num_nodes: int | None = None) -> GraphData:
    """The graph called `name` (see the module table), with its split, seeded.

    Args:
        name: one of `DATASETS`, or `planetoid:ROOT:NAME` / `ogb:ROOT:NAME` for a user's files.
        seed: seeds the split (and node subsampling) of generated / random-split graphs.
        num_nodes: for `fashion-knn`, `csbm` and `debian`: use this many nodes (a seeded subset
            for the real graphs, induced edges kept) - the efficiency sweep's sizes.
    """
    import benchdata

    kind, _, rest = name.partition(":")
    if kind in USER_PATH_KINDS:
        root, _, dataset = rest.rpartition(":")
        if not root or not dataset:
            raise ValueError(f"{kind} datasets are named {kind}:ROOT:NAME, got {name!r}")
        if kind == "planetoid":
            graph, split = benchdata.planetoid_graph(root, dataset)
            x = graph.features.float()
            x = x / x.sum(1, keepdim=True).clamp_min(1e-12)  # GraphSlim's pre_norm (L1 rows)
            return _with_split(x, graph.edge_index, graph.labels, split)
        graph, split = benchdata.ogb_node_graph(root, dataset)
        x = graph.features.float()
        train = x[split["train"]]
        x = (x - train.mean(0)) / train.std(0, unbiased=False).clamp_min(1e-12)
        return _with_split(x, graph.edge_index, graph.labels, split)
    if name not in DATASETS:
        raise ValueError(
            f"unknown dataset {name!r}; choose one of {list(DATASETS)} or planetoid:ROOT:NAME / "
            "ogb:ROOT:NAME"
        )
    if name in ("debian", "debian-bow"):
        text = benchdata.debian_packages_graph(features="minilm" if name == "debian" else "bow")
        g = text.graph
        graph = GraphData(g.features.float(), g.edge_index, g.labels)
        if num_nodes is not None and num_nodes < graph.num_nodes:
            # a seeded random node subset, its induced edges kept
            keep = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(seed))
            mask = torch.zeros(graph.num_nodes, dtype=torch.bool)
            mask[keep[:num_nodes]] = True
            graph = induced_subgraph(graph, mask)
        return _random(graph, seed)
    if name == "fashion-knn":
        graph = benchdata.image_knn_graph(
            "fashion_mnist", k=10, num_nodes=num_nodes or 5000, seed=seed
        )
        return from_benchdata(graph, split="planetoid", seed=seed)
    if name == "digits-knn":
        graph = benchdata.image_knn_graph("digits", k=10)
        return from_benchdata(graph, split="planetoid", seed=seed, num_val=300, num_test=1000)
    if name == "csbm":
        graph = benchdata.csbm(
            num_nodes or 3000, num_classes=5, homophily=0.8, num_features=64, seed=seed
        )
        return from_benchdata(graph, split="planetoid", seed=seed)
    # karate
    from gc4nc._pyg import import_pyg

    data = import_pyg().datasets.KarateClub()[0]
    graph = GraphData(data.x.float(), data.edge_index, data.y)
    return _random(graph, seed)


def _random(graph: GraphData, seed: int) -> GraphData:
    from gc4nc.graph import random_split

    return random_split(graph, train=0.5, val=0.25, seed=seed)
