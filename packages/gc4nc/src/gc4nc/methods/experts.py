"""Expert trajectories for trajectory matching (SFGC, GEOM): training them, the curriculum GEOM's
experts follow, and `ExpertBuffer`, the trajectories in memory or in one safetensors file.

An expert is a newly initialised 2-layer GCN (dropout 0) trained full batch on the condensation
graph with the loss on the training nodes; its flattened parameters (in `named_parameters` order)
are snapshotted every `SNAPSHOT_EVERY` = 10 epochs, so snapshot k holds the parameters after 10k
optimiser steps (snapshot 0: the initialisation) and `teacher_epochs` epochs give
1 + teacher_epochs // 10 snapshots. GEOM's curriculum sorts the training nodes by the entropy of
their neighbourhood's label histogram (the node itself and its distinct neighbours), easiest first,
and epoch e's loss uses the easiest `curriculum_fraction(e)` of them.

Differences from GraphSlim (`sfgc.py`, `geom.py`, `condensation/utils.py`):
- Every expert is newly initialised; GraphSlim's SFGC builds its GCN once and never re-initialises
  it (bug B6), so its 20 "experts" are one continued run with the optimiser reset every
  teacher_epochs.
- Snapshots after exactly 10k steps, and teacher_epochs epochs for both methods (GraphSlim: after
  10k + 1 steps, and teacher_epochs + 1 epochs for GEOM).
- The curriculum reads only training labels (unlabelled neighbours are left out of the histogram);
  in the transductive setting GraphSlim reads `labels_full`, leaking validation and test labels
  into the curriculum. The node itself counts once (GraphSlim adds a self loop to Â, which already
  has one, so it counts twice).
- One safetensors file with the training settings and a sha256 of the snapshots in its header,
  written only when asked, and a clear error for a missing or corrupt file (GraphSlim appends
  pickled lists, 10 experts per file, to `../<method>_buffer/...` on every run).

Memory: num_experts × (1 + teacher_epochs // 10) × P float32 values, P = F·hidden + hidden +
hidden·C + C: cora's SFGC defaults (20 experts, 251 snapshots, P ≈ 369k) take 7.4 GB.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from gc4nc.graph import Structure
from gc4nc.methods.base import CondenseTask
from gc4nc.models import GCN

logger = logging.getLogger(__name__)

SNAPSHOT_EVERY = 10  # epochs between expert snapshots (GraphSlim's cadence)
BUFFER_FORMAT = "gc4nc-expert-buffer-v1"
SCHEDULERS = ("linear", "root", "geom")


class ExpertBuffer:
    """Expert trajectories: a list of (S, P) float32 tensors, row k the flattened GCN parameters
    after k·`SNAPSHOT_EVERY` training epochs (row 0: the initialisation).

    Args:
        trajectories: one (S_i, P) tensor per expert (same P for all, S_i >= 1).
        metadata: how the experts were trained (strings; saved with the buffer).
    """

    def __init__(self, trajectories: list[torch.Tensor], metadata: dict[str, str] | None = None):
        if not trajectories:
            raise ValueError("an expert buffer needs at least one trajectory")
        widths = set()
        for i, t in enumerate(trajectories):
            if not isinstance(t, torch.Tensor) or t.ndim != 2 or t.shape[0] < 1:
                raise ValueError(f"trajectory {i} must be a (snapshots, parameters) tensor")
            widths.add(t.shape[1])
        if len(widths) != 1:
            raise ValueError(f"trajectories have different parameter counts {sorted(widths)}")
        self.trajectories = [t.detach().float().cpu() for t in trajectories]
        self.metadata = {str(k): str(v) for k, v in (metadata or {}).items()}

    def __len__(self) -> int:
        return len(self.trajectories)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.trajectories[i]

    @property
    def num_snapshots(self) -> int:
        """The shortest trajectory's number of snapshots."""
        return min(t.shape[0] for t in self.trajectories)

    @property
    def num_parameters(self) -> int:
        return self.trajectories[0].shape[1]

    def summary(self) -> dict[str, object]:
        return {
            "experts": len(self),
            "snapshots": self.num_snapshots,
            "parameters": self.num_parameters,
            "snapshot_every": SNAPSHOT_EVERY,
            **self.metadata,
        }

    def __repr__(self) -> str:
        return (
            f"ExpertBuffer({len(self)} experts x {self.num_snapshots} snapshots x "
            f"{self.num_parameters} parameters)"
        )

    def save(self, path: str | Path) -> Path:
        """Write the buffer to one safetensors file (parent folders created)."""
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {f"expert_{i:05d}": t.contiguous() for i, t in enumerate(self.trajectories)}
        header = {**self.metadata, "format": BUFFER_FORMAT, "sha256": _digest(self.trajectories)}
        save_file(tensors, str(path), metadata=header)
        return path

    @classmethod
    def load(cls, path: str | Path) -> ExpertBuffer:
        """Read a file written by `save`: FileNotFoundError if missing, ValueError if corrupt."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no expert buffer at {path} (write one with save_buffer=)")
        try:
            with safe_open(str(path), framework="pt") as f:
                metadata = dict(f.metadata() or {})
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
        except Exception as error:  # safetensors raises its own error type for bad files
            raise ValueError(f"{path} is not a readable safetensors file: {error}") from None
        if metadata.pop("format", None) != BUFFER_FORMAT:
            raise ValueError(f"{path} is not a gc4nc expert buffer (format {BUFFER_FORMAT})")
        expected = [f"expert_{i:05d}" for i in range(len(tensors))]
        if sorted(tensors) != expected:
            raise ValueError(
                f"{path} is corrupt: expected tensors {expected[:3]}..., got "
                f"{sorted(tensors)[:3]}..."
            )
        trajectories = [tensors[k] for k in expected]
        if metadata.pop("sha256", None) != _digest(trajectories):
            raise ValueError(f"{path} is corrupt: its snapshots do not match the recorded sha256")
        return cls(trajectories, metadata)


def _digest(trajectories: list[torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for t in trajectories:
        digest.update(t.detach().float().cpu().contiguous().numpy().data)
    return digest.hexdigest()


# ---------------------------------------------------------------- curriculum


def neighbourhood_entropy(
    edge_index: torch.Tensor,
    labels: torch.Tensor,
    labelled: torch.Tensor,
    nodes: torch.Tensor,
    num_classes: int,
) -> torch.Tensor:
    """Entropy (nats) of the label histogram of each node's neighbourhood: the node itself and its
    distinct neighbours, counting only labelled ones.

    Args:
        edge_index: (2, E) edges (both directions).
        labels: (N,) labels (only labelled nodes' are read).
        labelled: (N,) bool, the nodes whose labels may be used.
        nodes: the nodes to score.
        num_classes: C.

    Returns:
        (len(nodes),) float64 entropies (0 for a neighbourhood with one label or none).
    """
    n = labels.numel()
    src, dst = edge_index.cpu()
    loops = torch.arange(n)
    keys = torch.unique(torch.cat([src * n + dst, loops * n + loops]))  # distinct pairs, self once
    src, dst = keys // n, keys % n
    keep = labelled.cpu()[dst]
    counts = torch.zeros(n, num_classes, dtype=torch.float64)
    counts.index_put_(
        (src[keep], labels.cpu()[dst[keep]]),
        torch.ones(int(keep.sum()), dtype=torch.float64),
        accumulate=True,
    )
    p = counts[nodes.cpu()]
    p = p / p.sum(1, keepdim=True).clamp_min(1.0)
    return -(p * torch.log(torch.where(p > 0, p, 1.0))).sum(1)


def curriculum_fraction(scheduler: str, lam: float, epoch: int, T: float) -> float:
    """The fraction of training nodes (easiest first) in the loss at `epoch`: GEOM's schedulers,
    from `lam` at epoch 0 to 1 at epoch T."""
    t = epoch / T
    if scheduler == "linear":
        return min(1.0, lam + (1 - lam) * t)
    if scheduler == "root":
        return min(1.0, math.sqrt(lam**2 + (1 - lam**2) * t))
    if scheduler == "geom":
        return min(1.0, 2 ** (math.log2(lam) - math.log2(lam) * t))
    raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")


def curriculum_order(task: CondenseTask) -> torch.Tensor:
    """The training nodes sorted by `neighbourhood_entropy` (easiest first; stable on ties),
    reading only training labels."""
    labelled = torch.zeros(task.graph.num_nodes, dtype=torch.bool)
    labelled[task.train_index.cpu()] = True
    nodes = task.train_index.cpu()
    score = neighbourhood_entropy(
        task.graph.edge_index, task.graph.y, labelled, nodes, task.num_classes
    )
    return nodes[torch.sort(score, stable=True).indices]


# ---------------------------------------------------------------- experts


def train_expert(
    model: nn.Module,
    x: torch.Tensor,
    structure: Structure,
    labels: torch.Tensor,
    nodes: torch.Tensor,
    *,
    epochs: int,
    optim: str,
    lr: float,
    weight_decay: float,
    momentum: float = 0.0,
    fraction: Callable[[int], float] | None = None,
) -> torch.Tensor:
    """Train `model` full batch for `epochs` epochs on the cross-entropy of `nodes` and return
    its trajectory (1 + epochs // 10, P): the flattened parameters every 10 epochs.

    Args:
        model: a `GCN` (trained in place).
        x: (N, F) features.
        structure: the graph.
        labels: (N,) labels (only `nodes` are read).
        nodes: the training nodes, easiest first when `fraction` is given.
        epochs: optimiser steps.
        optim: "sgd" or "adam" (case-insensitive).
        lr: the learning rate.
        weight_decay: the L2 coefficient.
        momentum: SGD's momentum.
        fraction: epoch -> fraction of `nodes` (a prefix, at least one node) in the loss.

    Returns:
        (1 + epochs // 10, P) float32 snapshots on the CPU.
    """
    kind = optim.lower()
    params = list(model.parameters())
    if kind == "sgd":
        optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    elif kind == "adam":
        optimizer = torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    else:
        raise ValueError(f"optim must be 'SGD' or 'Adam', got {optim!r}")
    snapshots = torch.empty(1 + epochs // SNAPSHOT_EVERY, sum(p.numel() for p in params))
    snapshots[0] = nn.utils.parameters_to_vector(params).detach().cpu()
    model.train()
    for epoch in range(epochs):
        used = nodes
        if fraction is not None:
            used = nodes[: max(1, int(fraction(epoch) * nodes.numel()))]
        optimizer.zero_grad()
        F.cross_entropy(model(x, structure)[used], labels[used]).backward()
        optimizer.step()
        if (epoch + 1) % SNAPSHOT_EVERY == 0:
            row = (epoch + 1) // SNAPSHOT_EVERY
            snapshots[row] = nn.utils.parameters_to_vector(params).detach().cpu()
    return snapshots


def train_experts(
    task: CondenseTask,
    *,
    num_experts: int,
    teacher_epochs: int,
    lr_teacher: float,
    wd_teacher: float,
    optim: str,
    hidden: int = 256,
    mom_teacher: float = 0.0,
    curriculum: tuple[str, float, float] | None = None,
) -> ExpertBuffer:
    """An `ExpertBuffer` of `num_experts` newly initialised 2-layer GCNs (dropout 0) trained on
    `task`'s condensation graph (loss on its training nodes), optionally with a curriculum
    (scheduler, lam, T) over `curriculum_order`.

    Args:
        task: the condensation task (graph, training nodes, device; global RNG seeds the inits).
        num_experts: trajectories to train.
        teacher_epochs: epochs per expert.
        lr_teacher: the learning rate.
        wd_teacher: the weight decay.
        optim: "SGD" or "Adam".
        hidden: the GCN's hidden width.
        mom_teacher: SGD's momentum.
        curriculum: None, or (scheduler, lam, T) as `curriculum_fraction`.

    Returns:
        The `ExpertBuffer`, its metadata the training settings.
    """
    x, structure, y = task.x, task.structure, task.y
    nodes = (curriculum_order(task) if curriculum else task.train_index).to(task.device)
    fraction = None
    if curriculum:
        scheduler, lam, T = curriculum
        fraction = lambda e: curriculum_fraction(scheduler, lam, e, T)  # noqa: E731
    trajectories = []
    for _ in tqdm(range(num_experts), desc="experts", disable=None, mininterval=5.0):
        model = GCN(x.shape[1], hidden, task.num_classes, dropout=0.0).to(task.device)
        trajectories.append(
            train_expert(
                model,
                x,
                structure,
                y,
                nodes,
                epochs=teacher_epochs,
                optim=optim,
                lr=lr_teacher,
                weight_decay=wd_teacher,
                momentum=mom_teacher,
                fraction=fraction,
            )
        )
    meta = {
        "optim": optim,
        "lr_teacher": lr_teacher,
        "wd_teacher": wd_teacher,
        "teacher_epochs": teacher_epochs,
        "hidden": hidden,
        "curriculum": "none" if curriculum is None else "{}(lam={}, T={})".format(*curriculum),
    }
    logger.info("trained %d experts of %d epochs", num_experts, teacher_epochs)
    return ExpertBuffer(trajectories, meta)
