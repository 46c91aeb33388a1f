"""`condense(graph, method, reduction_rate, setting)`: one entry point for every method."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from gc4nc.condensed import CondensedGraph
from gc4nc.graph import SETTINGS, GraphData, Setting, check_graph, condensation_view, num_classes
from gc4nc.methods.base import METHODS, CondenseTask

RATE_DEFINITION = (
    "synthetic nodes = reduction_rate x training nodes (GCond / GraphSlim): each class but the "
    "largest gets max(1, floor(rate x its training nodes)); the largest takes the remainder of "
    "floor(rate x training nodes), and a rate so low that this leaves it none is refused "
    "(GraphSlim would give it one anyway, exceeding the rate)"
)


def class_counts(labels: torch.Tensor, rate: float, num_classes: int) -> torch.Tensor:
    """(C,) synthetic nodes per class for training labels `labels` at `rate` (`RATE_DEFINITION`).

    Classes are visited in increasing order of their training count (ties: order of first
    appearance in `labels`, as Python's stable sort over a Counter); classes without training
    nodes get none."""
    if not 0 < rate < 1:
        raise ValueError(f"reduction_rate must be in (0, 1), got {rate}")
    values, first, counts = np.unique(labels.cpu().numpy(), return_index=True, return_counts=True)
    order = np.lexsort((first, counts))  # by count, then by first appearance
    total = int(labels.numel() * rate)
    out = torch.zeros(num_classes, dtype=torch.long)
    assigned = 0
    for rank, i in enumerate(order):
        if rank == len(order) - 1:
            out[values[i]] = total - assigned
        else:
            out[values[i]] = max(int(counts[i] * rate), 1)
            assigned += int(out[values[i]])
    if int(out[values[order[-1]]]) < 1:
        raise ValueError(
            f"reduction_rate={rate} gives {total} synthetic nodes for {len(values)} classes "
            f"({labels.numel()} training nodes); every class needs at least one: raise the rate"
        )
    return out


def seed_everything(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - methods may draw from the global RNGs
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def condense(
    graph: GraphData,
    method: str = "gcond",
    reduction_rate: float = 0.5,
    setting: Setting = "transductive",
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
    **hparams: Any,
) -> CondensedGraph:
    """Condense `graph`'s training nodes to `reduction_rate` of their number with `method`.

    Args:
        graph: a `GraphData` or PyG `Data` with x, edge_index, y and train / val / test masks
            (`check_graph`).
        method: a name in `gc4nc.METHODS` (`gc4nc methods` lists them).
        reduction_rate: synthetic nodes as a fraction of the training nodes, in (0, 1).
        setting: "transductive" (condensation sees the whole graph) or "inductive" (only the
            subgraph induced by the training nodes).
        seed: seeds the method (and the global torch / numpy / random RNGs).
        device: where to compute.
        **hparams: the method's hyperparameters; unknown names are an error.

    Returns:
        The `CondensedGraph` with metadata: method, hyperparameters (defaults merged), seed,
        setting, rate and its definition, seconds, peak memory bytes.
    """
    from gc4nc._measure import measure

    graph = check_graph(graph)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {sorted(METHODS)}")
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    spec = METHODS[method]
    unknown = set(hparams) - set(spec.defaults)
    if unknown:
        raise ValueError(
            f"{method} has no hyperparameter(s) {sorted(unknown)}; it takes {sorted(spec.defaults)}"
        )
    settings = {**spec.defaults, **hparams}
    device = torch.device(device)
    view = condensation_view(graph, setting)
    train_index = view.train_mask.nonzero().flatten()
    counts = class_counts(view.y[train_index], reduction_rate, num_classes(graph))
    generator = seed_everything(seed)
    task = CondenseTask(view, train_index, counts, setting, seed, device, generator)
    with measure(device) as cost:
        result = spec.function(task, **settings)
    y = result.y.detach().cpu()
    adjacency = None if result.adjacency is None else result.adjacency.detach().float().cpu()
    metadata = {
        "method": method,
        "family": spec.family,
        "hyperparameters": settings,
        "seed": seed,
        "setting": setting,
        "reduction_rate": reduction_rate,
        "rate_definition": RATE_DEFINITION,
        "num_synthetic": int(result.x.shape[0]),
        "class_counts": counts.tolist(),
        "original_nodes": graph.num_nodes,
        "original_train_nodes": int(graph.train_mask.sum()),
        "num_features": int(graph.x.shape[1]),
        "num_classes": int(counts.numel()),
        "seconds": cost.seconds,
        "peak_memory_bytes": cost.peak_bytes,
        "memory_source": cost.source,
        "device": str(device),
        **({"info": result.info} if result.info else {}),
    }
    return CondensedGraph(result.x.detach().float().cpu(), adjacency, y, metadata)
