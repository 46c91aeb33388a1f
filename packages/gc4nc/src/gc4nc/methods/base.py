"""What every condensation method receives and returns, and the method registry.

A method is a function `(task: CondenseTask, **hparams) -> Condensed` registered with
`@register(name, family=..., defaults={...})`. `gc4nc.condense` builds the task (the graph the
setting lets condensation see, the labelled nodes, how many synthetic nodes each class gets, the
seeded generator), merges the user's hyperparameters over the defaults, times the call and wraps
the result in a `CondensedGraph` with its metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gc4nc.graph import GraphData, Setting, Structure


@dataclass
class Condensed:
    """A method's output: features, adjacency (None: structure-free), labels (hard or soft), and
    anything worth recording (loss curves, the structure it learns)."""

    x: torch.Tensor
    adjacency: torch.Tensor | None
    y: torch.Tensor
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class CondenseTask:
    """The input of a condensation method.

    Attributes:
        graph: the graph condensation sees (transductive: the whole graph; inductive: the
            subgraph induced by the training nodes). Only labels of `train_index` may be used.
        train_index: (m,) the labelled training nodes, indices into `graph`.
        counts: (C,) synthetic nodes per class (0 for a class absent from the training nodes).
        setting: "transductive" or "inductive".
        seed: the seed; `generator` is a CPU `torch.Generator` seeded with it, and the global
            torch / numpy RNGs are seeded with it too before the method runs.
        device: where to compute.
    """

    graph: GraphData
    train_index: torch.Tensor
    counts: torch.Tensor
    setting: Setting
    seed: int
    device: torch.device
    generator: torch.Generator
    _structure: Structure | None = None

    @property
    def num_classes(self) -> int:
        return self.counts.numel()

    @property
    def num_synthetic(self) -> int:
        return int(self.counts.sum())

    @property
    def structure(self) -> Structure:
        """The original graph's structure on `device` (operators cached across calls)."""
        if self._structure is None:
            g = self.graph
            weight = getattr(g, "edge_weight", None)
            self._structure = Structure(
                g.num_nodes,
                g.edge_index.to(self.device),
                None if weight is None else weight.to(self.device),
            )
        return self._structure

    @property
    def x(self) -> torch.Tensor:
        return self.graph.x.to(self.device)

    @property
    def y(self) -> torch.Tensor:
        """Labels of every node of `graph` (use only `train_index`)."""
        return self.graph.y.to(self.device)

    def synthetic_labels(self) -> torch.Tensor:
        """(n,) class of each synthetic node, classes in order, `counts[c]` nodes of class c."""
        return torch.repeat_interleave(torch.arange(self.num_classes), self.counts).to(self.device)

    def class_members(self, c: int) -> torch.Tensor:
        """Training nodes of class c (indices into `graph`)."""
        idx = self.train_index
        return idx[self.graph.y[idx] == c]

    def sample_real(self) -> torch.Tensor:
        """(n,) indices of real training nodes, `counts[c]` drawn without replacement from class c
        (with replacement when the class has fewer), in the order of `synthetic_labels`: the
        usual initialisation of synthetic features (GCond, SFGC, GEOM...)."""
        picks = []
        for c, k in enumerate(self.counts.tolist()):
            if k == 0:
                continue
            members = self.class_members(c)
            if members.numel() >= k:
                order = torch.randperm(members.numel(), generator=self.generator)[:k]
            else:
                order = torch.randint(members.numel(), (k,), generator=self.generator)
            picks.append(members[order])
        return torch.cat(picks)


Method = Callable[..., Condensed]


@dataclass(frozen=True)
class MethodSpec:
    name: str
    function: Method
    family: str
    defaults: dict[str, Any]
    structure: str  # "learned", "kept" (induced / coarsened), "none"
    summary: str


METHODS: dict[str, MethodSpec] = {}
FAMILIES = ("coreset", "coarsening", "gradient", "distribution", "trajectory", "broadcast")


def register(name: str, *, family: str, structure: str, defaults: dict[str, Any] | None = None):
    """Decorator adding a method to `METHODS`."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")

    def wrap(function: Method) -> Method:
        doc = (function.__doc__ or "").strip().splitlines()
        METHODS[name] = MethodSpec(
            name, function, family, dict(defaults or {}), structure, doc[0] if doc else name
        )
        return function

    return wrap
