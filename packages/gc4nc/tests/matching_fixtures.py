"""Helpers shared by the gradient- and distribution-matching tests."""

from __future__ import annotations

import numpy as np
import torch

from gc4nc.condense import class_counts, seed_everything
from gc4nc.graph import GraphData
from gc4nc.methods.base import CondenseTask


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1.3e-6, atol: float = 1e-5
) -> None:
    """|actual − expected| <= atol + rtol·|expected| elementwise (torch.testing.assert_close's
    rule and float32 defaults, without its import, which costs seconds)."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    gap = (actual - expected).abs() - (atol + rtol * expected.abs())
    assert bool((gap <= 0).all()), f"max excess {gap.max().item():.3g}"


def make_task(graph: GraphData, rate: float = 0.25, seed: int = 0) -> CondenseTask:
    train = graph.train_mask.nonzero().flatten()
    counts = class_counts(graph.y[train], rate, int(graph.y.max()) + 1)
    return CondenseTask(
        graph, train, counts, "transductive", seed, torch.device("cpu"), seed_everything(seed)
    )


def dense_gcn_operator(graph: GraphData) -> torch.Tensor:
    """D̃^-1/2 (A + I) D̃^-1/2 built with numpy from the edge list (independent of gc4nc)."""
    n = graph.num_nodes
    a = np.zeros((n, n))
    src, dst = graph.edge_index.numpy()
    np.add.at(a, (src, dst), 1.0)
    a += np.eye(n)
    d = a.sum(1) ** -0.5
    return torch.from_numpy(d[:, None] * a * d[None, :]).float()
