"""Gradient matching: GCond, GCondX, DosCond and DosCondX (Jin et al., ICLR 2022 / KDD 2022).

The synthetic graph (features X' and, for GCond / DosCond, an adjacency A' = PGE(X')) is learned so
that, class by class, the gradient of a condensation GNN's loss on the synthetic nodes matches its
gradient on real training nodes: L = Σ_c (n'_c / n') · D(∇θ ℓ(X', Â'; c), ∇θ ℓ(X, Â; c)).

Following GraphSlim (the GC4NC anchor, `condensation/gcond*.py`, `doscond*.py`; the shared pieces
are in `gc4nc.methods.matching`):

- X' starts from random real training nodes of each class (`CondenseTask.sample_real`); A' is
  GraphSlim's PGE (`PGE`), A' = sigmoid((S + Sᵀ)/2) with a zero diagonal; both Â' and the real Â
  get the GCN normalisation D̃^-1/2 (A + I) D̃^-1/2 (so the identity stays the identity).
- The condensation model is GraphSlim's SGC (`ntrans` linear layers, then `nlayers` propagations:
  Â²(XW + b) for ntrans = 1, the bias *before* propagation) or its 2-layer GCN, with dropout 0.
- `match_distance` is GraphSlim's `match_loss` ("ours", "mse", "cos").
- GCond: every epoch a freshly initialised model; `outer_loop` matching steps, each followed by
  `inner_loop` Adam steps of the model on the synthetic graph; in each block of 50 epochs the first
  10 step the PGE only and the other 40 the features only. GCondX: A' = I. DosCond (one-step
  matching): no inner training, PGE and X' stepped at every outer step. DosCondX: A' = I.
- GCond / DosCond return the raw sigmoid adjacency after the threshold GraphSlim applies before
  evaluation (entries < `threshold` set to 0); `info` records the threshold and the loss curve.

Deliberate differences from GraphSlim:

- Real-graph gradients use the *exact* neighbourhoods of the sampled nodes (up to `real_batch`
  training nodes of the class) on the whole condensation graph, where GraphSlim samples fan-outs
  [10, 5] (un-rescaled, so its sampled Â rows are truncated). For SGC with ntrans = 1 the model is
  linear in Â²X and Â²1, which are computed once (logits = (Â²X)Wᵀ + (Â²1)bᵀ); GCN uses ÂX once
  and one exact hop; SGC with ntrans ≥ 2 uses exact two-hop computation trees.
- GCondX updates the features at every outer step; GraphSlim steps its unused PGE optimiser instead
  at outer steps 0, 5, 10, … (bug B10), skipping those feature updates.
- Checkpoint selection (GraphSlim evaluates 3 × 300-epoch GCNs every epochs/10 epochs and keeps
  the best-validation graph) is the option `checkpoint_every` (0, the default, is off: the final
  graph is returned; it is slow on CPU). It needs the validation nodes, so the transductive
  setting only (the inductive condensation graph holds none).
- PGE's first layer is computed as W_a x'_i + W_b x'_j (the same numbers as the concatenation, in
  O(n·d·h + n²·h) instead of O(n²·d·h)); GraphSlim's reddit chunking is therefore not needed.
- The per-dataset PGE width (256 on arxiv, flickr, reddit) is the `pge_hidden` entry of `PRESETS`
  (GraphSlim uses 128 on reddit at rate 0.01: pass `pge_hidden=128` there).
- Checkpoint evaluations run with the global RNG states saved and restored, so turning them on
  does not change the condensation's random stream.

Hyperparameters keep GraphSlim's names (epochs, outer_loop, inner_loop, lr_feat, lr_adj,
dis_metric, condense_model, ntrans, hidden, nlayers, threshold) plus lr_model (its `lr`, the
model's Adam rate), real_batch (its 256 real nodes per class), pge_hidden and checkpoint_every /
checkpoint_epochs / checkpoint_runs. Defaults are GraphSlim's cora configs; `PRESETS[method][ds]`
holds every dataset's, e.g. `gc4nc.condense(graph, "gcond", 0.01, **PRESETS["gcond"]["arxiv"])`.

Example:
    >>> import gc4nc
    >>> from benchdata import csbm
    >>> graph = gc4nc.from_benchdata(
    ...     csbm(300, num_classes=3, num_features=8), per_class=10, num_val=60, num_test=100
    ... )
    >>> out = gc4nc.condense(graph, "gcond", 0.5, epochs=2, outer_loop=2, inner_loop=1)
    >>> out.x.shape, out.adjacency.shape
    (torch.Size([15, 8]), torch.Size([15, 15]))
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gc4nc.methods.base import Condensed, CondenseTask, register
from gc4nc.methods.matching import (
    METRICS,
    PGE,
    Checkpoints,
    CondensationGCN,
    CondensationSGC,
    RealGraph,
    match_distance,
    matching_loss,
    normalized,
    real_batches,
    thresholded,
)

__all__ = [
    "DOSCONDX_PRESETS",
    "DOSCOND_PRESETS",
    "GCONDX_PRESETS",
    "GCOND_PRESETS",
    "PGE",
    "PRESETS",
    "CondensationGCN",
    "CondensationSGC",
    "MatchingConfig",
    "RealGraph",
    "doscond",
    "doscondx",
    "gcond",
    "gcondx",
    "gradient_matching",
    "match_distance",
    "matching_loss",
]

CONDENSE_MODELS = ("sgc", "gcn")

STRUCTURE_EPOCHS = (50, 10)  # GCond: of every 50 epochs, the first 10 update A' (PGE) only


@dataclass(frozen=True)
class MatchingConfig:
    """Hyperparameters of the gradient-matching loop (GraphSlim's names; see `PRESETS`)."""

    epochs: int = 1000
    outer_loop: int = 20
    inner_loop: int = 15
    lr_feat: float = 1e-4
    lr_adj: float = 1e-4
    lr_model: float = 0.01
    dis_metric: str = "ours"
    condense_model: str = "sgc"
    ntrans: int = 1
    hidden: int = 256
    nlayers: int = 2
    real_batch: int = 256
    threshold: float = 0.0
    pge_hidden: int = 128
    checkpoint_every: int = 0
    checkpoint_epochs: int = 300
    checkpoint_runs: int = 3

    def __post_init__(self) -> None:
        for name in (
            "epochs",
            "outer_loop",
            "ntrans",
            "hidden",
            "nlayers",
            "real_batch",
            "pge_hidden",
            "checkpoint_epochs",
            "checkpoint_runs",
        ):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("inner_loop", "checkpoint_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {getattr(self, name)!r}")
        for name in ("lr_feat", "lr_adj", "lr_model"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.threshold < 1:
            raise ValueError(f"threshold must be in [0, 1), got {self.threshold!r}")
        if self.dis_metric not in METRICS:
            raise ValueError(f"dis_metric must be one of {METRICS}, got {self.dis_metric!r}")
        if self.condense_model not in CONDENSE_MODELS:
            raise ValueError(
                f"condense_model must be one of {CONDENSE_MODELS}, got {self.condense_model!r}"
            )

    def model(self, in_dim: int, out_dim: int) -> nn.Module:
        if self.condense_model == "gcn":
            return CondensationGCN(in_dim, self.hidden, out_dim, layers=self.nlayers)
        return CondensationSGC(in_dim, self.hidden, out_dim, ntrans=self.ntrans, hops=self.nlayers)


def gradient_matching(
    task: CondenseTask,
    config: MatchingConfig,
    *,
    structure: nn.Module | None,
    alternate: bool,
    inner: bool,
    regulariser: nn.Module | None = None,
) -> Condensed:
    """The GCond-family loop (see the module docstring).

    Args:
        task: the condensation task.
        config: hyperparameters.
        structure: the adjacency generator (`forward(x) -> (n, n)` and `inference(x)`), or None
            for A' = I (the X variants).
        alternate: GCond's schedule (structure or features, by epoch); otherwise both are
            stepped at every outer step.
        inner: train the model on the synthetic graph for `config.inner_loop` steps after each
            outer step (GCond) or not (DosCond: all matching at initialisation).
        regulariser: an extra loss on the generated adjacency (`forward(adj) -> scalar`) whose
            parameters are stepped with the structure's (SGDD's transport term).

    Returns:
        The condensed graph; `info` holds the loss curve (mean per outer step, every 10 epochs),
        the threshold and the checkpoint history.
    """
    n, device = task.num_synthetic, task.device
    if structure is not None and n < 2:
        raise ValueError(f"learning a structure needs at least 2 synthetic nodes, got {n}")
    real, real_y = RealGraph(task), task.y
    y_syn = task.synthetic_labels()
    x_syn = nn.Parameter(task.x[task.sample_real().to(device)].float().clone())
    opt_x = torch.optim.Adam([x_syn], lr=config.lr_feat)
    opt_s = None
    if structure is not None:
        structure = structure.to(device)
        params = list(structure.parameters())
        if regulariser is not None:
            params += list(regulariser.to(device).parameters())
        opt_s = torch.optim.Adam(params, lr=config.lr_adj)
    checkpoints = Checkpoints(
        task, config.checkpoint_every, config.checkpoint_epochs, config.checkpoint_runs
    )

    def current_adjacency() -> torch.Tensor | None:
        return None if structure is None else structure.inference(x_syn.detach())

    period, structure_epochs = STRUCTURE_EPOCHS
    curve, block = [], []
    for epoch in range(config.epochs):
        model = config.model(x_syn.shape[1], task.num_classes).to(device)
        opt_model = torch.optim.Adam(model.parameters(), lr=config.lr_model) if inner else None
        if alternate and structure is not None:  # gradients only where a step will be taken
            on_structure = epoch % period < structure_epochs
            x_syn.requires_grad_(not on_structure)
            for p in opt_s.param_groups[0]["params"]:
                p.requires_grad_(on_structure)
        adj = None if structure is None else structure(x_syn)
        epoch_loss = 0.0
        for step in range(config.outer_loop):
            loss = matching_loss(
                model,
                real,
                real_y,
                real_batches(task, config.real_batch),
                x_syn,
                normalized(adj),
                y_syn,
                config.dis_metric,
            )
            if regulariser is not None:
                loss = loss + regulariser(adj)
            opt_x.zero_grad()
            if opt_s is not None:
                opt_s.zero_grad()
            loss.backward()
            if opt_s is None or (alternate and not on_structure):
                opt_x.step()
            elif alternate:
                opt_s.step()
            else:
                opt_s.step()
                opt_x.step()
            epoch_loss += loss.item()
            last = step == config.outer_loop - 1
            if structure is not None and not last:
                adj = structure(x_syn)  # the next step's A'
            if inner and config.inner_loop:
                adj_inner = None  # the X variants
                if structure is not None and not last and structure.inference_matches_forward:
                    adj_inner = adj.detach()  # the same numbers as `inference`
                elif structure is not None:
                    adj_inner = current_adjacency()
                adj_inner = normalized(adj_inner)
                x_inner = x_syn.detach()
                for _ in range(config.inner_loop):
                    opt_model.zero_grad()
                    F.cross_entropy(model(x_inner, adj_inner), y_syn).backward()
                    opt_model.step()
        block.append(epoch_loss / config.outer_loop)
        if len(block) == 10 or epoch == config.epochs - 1:
            curve.append(float(np.mean(block)))
            block = []
        if checkpoints.due(epoch, config.epochs):
            adj_now = current_adjacency()
            adj_now = None if adj_now is None else thresholded(adj_now, config.threshold)
            checkpoints.offer(epoch, x_syn, adj_now, y_syn)

    info = {
        "loss_curve": curve,
        "loss_every": 10,
        "threshold": config.threshold,
        "config": asdict(config),
    }
    if checkpoints.best is not None:
        score, best_epoch, x_out, adj_out = checkpoints.best
        info.update(checkpoints=checkpoints.history, best_epoch=best_epoch, best_val=score)
        return Condensed(x_out, adj_out, y_syn, info)
    adj_out = current_adjacency()
    if adj_out is not None:
        adj_out = thresholded(adj_out, config.threshold)
    return Condensed(x_syn.detach().clone(), adj_out, y_syn, info)


COMMON_DEFAULTS = {
    "lr_model": 0.01,
    "hidden": 256,
    "nlayers": 2,
    "real_batch": 256,
    "checkpoint_every": 0,
    "checkpoint_epochs": 300,
    "checkpoint_runs": 3,
}
_DATASETS = ("cora", "citeseer", "pubmed", "arxiv", "flickr", "reddit")


def _table(keys: str, rows: dict[str, tuple]) -> dict[str, dict]:
    names = keys.split()
    return {ds: dict(zip(names, rows[ds], strict=True)) for ds in _DATASETS}


# GraphSlim's configs/<method>/<dataset>.json (spec section 3); absent keys are cli defaults.
GCOND_PRESETS = _table(
    "lr_feat lr_adj outer_loop inner_loop threshold dis_metric condense_model ntrans epochs "
    "pge_hidden",
    {
        "cora": (1e-4, 1e-4, 20, 15, 0.05, "ours", "sgc", 1, 1000, 128),
        "citeseer": (1e-4, 1e-4, 20, 15, 0.05, "ours", "sgc", 1, 1000, 128),
        "pubmed": (1e-4, 1e-4, 20, 15, 0.05, "ours", "sgc", 1, 1000, 128),
        "arxiv": (0.01, 0.01, 20, 3, 0.01, "ours", "sgc", 2, 600, 256),
        "flickr": (0.005, 0.005, 10, 1, 0.01, "ours", "sgc", 2, 1000, 256),
        "reddit": (0.1, 0.1, 10, 1, 0.01, "ours", "sgc", 1, 1000, 256),
    },
)
GCONDX_PRESETS = _table(
    "lr_feat outer_loop inner_loop dis_metric condense_model ntrans epochs",
    {
        "cora": (0.01, 10, 1, "mse", "gcn", 1, 1000),
        "citeseer": (0.01, 10, 1, "mse", "gcn", 1, 1000),
        "pubmed": (0.01, 10, 1, "mse", "gcn", 1, 1000),
        "arxiv": (0.1, 5, 1, "mse", "sgc", 2, 1000),
        "flickr": (0.01, 10, 1, "mse", "gcn", 1, 1000),
        "reddit": (0.1, 10, 1, "ours", "sgc", 1, 400),
    },
)
DOSCOND_PRESETS = _table(
    "lr_feat lr_adj outer_loop threshold dis_metric condense_model ntrans epochs pge_hidden",
    {
        "cora": (0.01, 0.01, 3, 0.05, "mse", "gcn", 1, 1000, 128),
        "citeseer": (0.01, 0.01, 5, 0.05, "mse", "gcn", 1, 1000, 128),
        "pubmed": (0.01, 0.01, 5, 0.05, "mse", "gcn", 1, 1000, 128),
        "arxiv": (0.01, 0.02, 5, 0.01, "ours", "sgc", 1, 1000, 256),
        "flickr": (0.005, 0.005, 10, 0.01, "mse", "gcn", 1, 1000, 256),
        "reddit": (0.1, 0.1, 10, 0.01, "ours", "gcn", 1, 1000, 256),
    },
)
DOSCONDX_PRESETS = _table(
    "lr_feat outer_loop dis_metric condense_model ntrans epochs",
    {
        "cora": (0.01, 10, "mse", "gcn", 1, 1000),
        "citeseer": (0.01, 10, "mse", "gcn", 1, 1000),
        "pubmed": (0.01, 10, "mse", "gcn", 1, 1000),
        "arxiv": (0.1, 5, "mse", "sgc", 2, 1000),
        "flickr": (0.01, 10, "mse", "gcn", 1, 1000),
        "reddit": (0.1, 5, "mse", "gcn", 1, 1000),
    },
)
#: per method, per dataset: `gc4nc.condense(g, "gcond", **PRESETS["gcond"]["arxiv"])`
PRESETS = {
    "gcond": GCOND_PRESETS,
    "gcondx": GCONDX_PRESETS,
    "doscond": DOSCOND_PRESETS,
    "doscondx": DOSCONDX_PRESETS,
}


@register(
    "gcond",
    family="gradient",
    structure="learned",
    defaults={**COMMON_DEFAULTS, **GCOND_PRESETS["cora"]},
)
def gcond(task: CondenseTask, **hparams) -> Condensed:
    """GCond: gradient matching with a PGE-generated adjacency and inner model training."""
    config = MatchingConfig(**hparams)
    return gradient_matching(
        task,
        config,
        structure=PGE(task.graph.x.shape[1], config.pge_hidden),
        alternate=True,
        inner=True,
    )


@register(
    "gcondx",
    family="gradient",
    structure="none",
    defaults={**COMMON_DEFAULTS, **GCONDX_PRESETS["cora"]},
)
def gcondx(task: CondenseTask, **hparams) -> Condensed:
    """GCondX: GCond's gradient matching on features only (A' = I)."""
    return gradient_matching(
        task, MatchingConfig(**hparams), structure=None, alternate=False, inner=True
    )


@register(
    "doscond",
    family="gradient",
    structure="learned",
    defaults={**COMMON_DEFAULTS, **DOSCOND_PRESETS["cora"]},
)
def doscond(task: CondenseTask, **hparams) -> Condensed:
    """DosCond: one-step gradient matching (at initialisation) of features and a PGE adjacency."""
    config = MatchingConfig(**hparams)
    return gradient_matching(
        task,
        config,
        structure=PGE(task.graph.x.shape[1], config.pge_hidden),
        alternate=False,
        inner=False,
    )


@register(
    "doscondx",
    family="gradient",
    structure="none",
    defaults={**COMMON_DEFAULTS, **DOSCONDX_PRESETS["cora"]},
)
def doscondx(task: CondenseTask, **hparams) -> Condensed:
    """DosCondX: one-step gradient matching of features only (A' = I)."""
    return gradient_matching(
        task, MatchingConfig(**hparams), structure=None, alternate=False, inner=False
    )
