"""Performance: a GNN trained on the condensed graph, tested on the original graph's test nodes.

As GraphSlim's evaluator: the model (GCN, hidden 256 by default) trains on every condensed node for
a fixed schedule (`EvalConfig`), the weights of the best validation epoch on the original graph are
kept, and the test accuracy is reported as mean ± std over seeds. `whole_graph_accuracy` is the
reference: the same model trained on the original graph's training nodes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from gc4nc.condense import seed_everything
from gc4nc.condensed import CondensedGraph
from gc4nc.graph import GraphData, Setting, check_graph, condensation_view, num_classes
from gc4nc.models import build_model
from gc4nc.training import Split, accuracy, fit


@dataclass
class EvalConfig:
    """The evaluation schedule: GraphSlim's evaluator (2-layer GCN, hidden 256, dropout 0, Adam
    lr 0.01 then 0.001 from epoch 150, weight decay 5e-4, 300 epochs, best-validation weights,
    10 runs)."""

    model: str = "gcn"
    hidden: int = 256
    epochs: int = 300
    lr: float = 0.01
    weight_decay: float = 5e-4
    dropout: float = 0.0
    runs: int = 10
    val_every: int = 1  # validate every k epochs (1: GraphSlim; more: faster on large graphs)
    model_kwargs: dict = field(default_factory=dict)

    def fit_kwargs(self) -> dict:
        return {
            "epochs": self.epochs,
            "lr": self.lr,
            "weight_decay": self.weight_decay,
            "val_every": self.val_every,
        }

    def build(self, in_dim: int, out_dim: int) -> torch.nn.Module:
        kwargs = dict(self.model_kwargs)
        if self.model.lower() not in ("sgc",):
            kwargs.setdefault("dropout", self.dropout)
        return build_model(self.model, in_dim, out_dim, hidden=self.hidden, **kwargs)


@dataclass
class Accuracy:
    mean: float
    std: float
    runs: list[float]

    def __str__(self) -> str:
        return f"{100 * self.mean:.2f} ± {100 * self.std:.2f}"

    def to_dict(self) -> dict:
        return asdict(self)


def _summary(values: list[float]) -> Accuracy:
    return Accuracy(float(np.mean(values)), float(np.std(values)), values)


def train_on_condensed(
    condensed: CondensedGraph,
    graph: GraphData,
    config: EvalConfig,
    *,
    seed: int = 0,
    setting: Setting | None = None,
    device: str | torch.device = "cpu",
) -> tuple[torch.nn.Module, Split]:
    """One model trained on `condensed` with best-validation selection on `graph`; returns the
    model and the test split."""
    setting = setting or condensed.metadata.get("setting", "transductive")
    device = torch.device(device)
    val = Split.of(graph, graph.val_mask, setting).to(device)
    test = Split.of(graph, graph.test_mask, setting).to(device)
    seed_everything(seed)
    model = config.build(graph.x.shape[1], num_classes(graph)).to(device)
    c = condensed.to(device)
    fit(model, c.x, c.structure(), c.y, val=val, **config.fit_kwargs())
    return model, test


def train_on_original(
    graph: GraphData,
    config: EvalConfig,
    *,
    seed: int = 0,
    setting: Setting = "transductive",
    device: str | torch.device = "cpu",
) -> tuple[torch.nn.Module, Split]:
    """The whole-graph reference: one model trained on the training nodes of the graph that the
    setting allows (transductive: the whole graph; inductive: the training subgraph)."""
    device = torch.device(device)
    view = condensation_view(graph, setting)
    val = Split.of(graph, graph.val_mask, setting).to(device)
    test = Split.of(graph, graph.test_mask, setting).to(device)
    seed_everything(seed)
    model = config.build(graph.x.shape[1], num_classes(graph)).to(device)
    train = Split.of(view, view.train_mask).to(device)
    fit(
        model,
        train.x,
        train.structure,
        train.y,
        train_index=train.index,
        val=val,
        **config.fit_kwargs(),
    )
    return model, test


def condensed_accuracy(
    condensed: CondensedGraph,
    graph: GraphData,
    config: EvalConfig | None = None,
    *,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> Accuracy:
    """Test accuracy (mean ± std over `config.runs` seeds) of models trained on `condensed`."""
    graph = check_graph(graph)
    config = config or EvalConfig()
    scores = []
    for run in range(config.runs):
        model, test = train_on_condensed(condensed, graph, config, seed=seed + run, device=device)
        scores.append(accuracy(model, test))
    return _summary(scores)


def whole_graph_accuracy(
    graph: GraphData,
    config: EvalConfig | None = None,
    *,
    setting: Setting = "transductive",
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> Accuracy:
    """Test accuracy of the same model trained on the original graph (the reference)."""
    graph = check_graph(graph)
    config = config or EvalConfig()
    scores = []
    for run in range(config.runs):
        model, test = train_on_original(
            graph, config, seed=seed + run, setting=setting, device=device
        )
        scores.append(accuracy(model, test))
    return _summary(scores)
