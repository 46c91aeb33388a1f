"""Trajectory matching: SFGC and GEOM learn structure-free synthetic features X' (n, F) on which a
few SGD steps of a GCN reproduce a long stretch of an expert GCN's training trajectory.

Both methods run in two stages, as GraphSlim's `sfgc.py` / `geom.py`:

1. Experts (`gc4nc.methods.experts`): an `ExpertBuffer` of `num_experts` newly initialised 2-layer
   GCNs trained on the condensation graph, snapshotted every 10 epochs (snapshot k: after 10k
   epochs); GEOM's experts follow its curriculum (easy training nodes first). Pass `buffer=` (a
   file or an `ExpertBuffer`) to reuse experts, `save_buffer=` to keep the ones trained here.
2. Student: X' starts from a coreset of real training nodes (`init`; "random", GraphSlim's
   effective default). Iteration `it` takes the next expert (a fresh random order per pass over
   the buffer) and a start epoch e (SFGC: uniform over 0, 10, ..., `start_epoch`; GEOM: uniform in
   [min_start_epoch, UB) with the expanding window UB = min(max_start_epoch_s + it,
   max_start_epoch)), starts a functional GCN at θ_s = snapshot e // 10, unrolls `syn_steps` SGD
   steps θ ← θ − η ∇ℓ(GCN_θ(X', Â'), y') with a learnable step η (initially `lr_student`; SGD
   lr 1e-6, momentum 0.5) and matches θ_t = snapshot e // 10 + expert_epochs // 10. SFGC's loss
   is ‖θ_final − θ_t‖² / ‖θ_s − θ_t‖², GEOM's the unsquared ratio ‖θ_final − θ_t‖ / ‖θ_s − θ_t‖;
   X' takes an Adam step at `lr_feat`. Â' is the identity (the output is structure-free), except
   at the first iteration with `first_iteration_adjacency` (SFGC by default, GEOM's reddit
   preset), where it is the initial coreset's induced adjacency, as GraphSlim. GEOM can learn
   soft labels (`soft_label`): logits initialised to the log-softmax of an expert's final GCN on
   (X', I), each misclassified node's true-class entry raised to its row maximum, trained with
   SGD (lr_y, momentum 0.9); ℓ is then KL(softmax(y') ‖ softmax(GCN_θ)) and the labels are
   returned as probabilities (n, C). GEOM's `beta` adds β · ℓ(GCN_θlast(X', Â'), y'), θ_last the
   current expert's final snapshot (knowledge distillation). Matching stops at the first
   non-finite loss, X' keeping its last finite value. `info` records the loss every 10
   iterations, the start snapshot of every iteration and the buffer's summary.

Deliberate differences from GraphSlim:
- Experts are each newly initialised, snapshotted after exactly 10k steps, and GEOM's curriculum
  reads training labels only (GraphSlim: bug B6, one continued SFGC run; a test-label leak from
  `labels_full`): see `gc4nc.methods.experts`.
- Snapshot indices are consistent (bug B7): a start epoch e is snapshot e // 10 for both
  optimisers and the target is start + expert_epochs // 10. GraphSlim divides by 10 for Adam only,
  so with SGD its start epochs index snapshots directly (SFGC: snapshots 0-30, about epochs
  0-300; on arxiv any start ≥ 10 is an IndexError), and GEOM's target is a fixed index
  expert_epochs // 10 that can precede the start. A trajectory too short for the latest start
  plus expert_epochs is a ValueError before any work. SFGC's start epochs are the multiples of 10
  up to `start_epoch` (GraphSlim's `linspace(0, start_epoch, start_epoch // 10 + 1)`: the same
  set when start_epoch is a multiple of 10).
- Soft labels are logits normalised by a softmax inside the loss; GraphSlim treats the learnable
  matrix itself as log-probabilities, whose rows stop normalising after the max fix and updates.
- GEOM's inductive temperature is left out: GraphSlim never steps it (bug B9), and its presets
  that set one (flickr, reddit) have soft labels off, where it is unused.
- The result is X' after the last iteration; GraphSlim saves the iteration with the best
  validation accuracy among 10 checkpoints (each evaluated by training 3 GCNs).

Example:
    >>> import gc4nc
    >>> from benchdata import csbm
    >>> from gc4nc.methods.trajectory import PRESETS, QUICK
    >>> data = csbm(300, num_classes=3, num_features=16)
    >>> graph = gc4nc.from_benchdata(data, per_class=10, num_val=60, num_test=120)
    >>> settings = {**PRESETS["geom"]["cora"], **QUICK["geom"], "hidden": 32, "epochs": 10}
    >>> condensed = gc4nc.condense(graph, "geom", 0.5, **settings)
    >>> condensed.x.shape, condensed.y.shape  # soft labels (cora's preset)
    (torch.Size([15, 16]), torch.Size([15, 3]))
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from gc4nc.graph import Structure
from gc4nc.methods.base import METHODS, Condensed, CondenseTask, register
from gc4nc.methods.experts import SCHEDULERS, SNAPSHOT_EVERY, ExpertBuffer, train_experts
from gc4nc.models import GCN

__all__ = [
    "PRESETS",
    "QUICK",
    "ExpertBuffer",
    "FlatGCN",
    "geom",
    "parameter_matching_loss",
    "sfgc",
    "snapshot_pair",
    "train_experts",
    "unroll",
    "window_upper_bound",
]

logger = logging.getLogger(__name__)

LOG_EVERY = 10  # iterations between entries of the recorded loss curve
OPTIMIZERS = ("sgd", "adam")
NON_NEGATIVE = {"wd_teacher", "mom_teacher", "start_epoch", "min_start_epoch", "lr_y", "beta"}


# ---------------------------------------------------------------- student


class FlatGCN:
    """A GCN evaluated at a flat parameter vector θ (P,) (`torch.func.functional_call` on a
    template module), the parameters in `named_parameters` order as the experts' snapshots."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int) -> None:
        self.module = GCN(in_dim, hidden, num_classes, dropout=0.0)
        named = list(self.module.named_parameters())
        self.names = [name for name, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]

    @property
    def num_parameters(self) -> int:
        return sum(self.numels)

    def __call__(self, theta: torch.Tensor, x: torch.Tensor, structure: Structure) -> torch.Tensor:
        pieces = theta.split(self.numels)
        params = {n: p.view(s) for n, p, s in zip(self.names, pieces, self.shapes, strict=True)}
        return torch.func.functional_call(self.module, params, (x, structure))


def student_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy to hard labels (n,), or KL(softmax(targets) ‖ softmax(logits)) averaged over
    nodes when `targets` are (n, C) label logits."""
    if targets.ndim == 1:
        return F.cross_entropy(logits, targets)
    return F.kl_div(
        F.log_softmax(logits, -1),
        F.log_softmax(targets, -1),
        reduction="batchmean",
        log_target=True,
    )


def unroll(
    net: FlatGCN,
    theta: torch.Tensor,
    x: torch.Tensor,
    structure: Structure,
    targets: torch.Tensor,
    lr: torch.Tensor,
    steps: int,
) -> torch.Tensor:
    """θ (P,) after `steps` SGD steps θ ← θ − lr·∇θ student_loss(net(θ, x, structure), targets)
    from `theta` (P,), on features x (n, F) with hard (n,) or soft-logit (n, C) targets and a
    scalar tensor lr; differentiable in x, targets and lr (the unrolled graph is kept)."""
    theta = theta.detach().clone().requires_grad_(True)
    for _ in range(steps):
        loss = student_loss(net(theta, x, structure), targets)
        (grad,) = torch.autograd.grad(loss, theta, create_graph=True)
        theta = theta - lr * grad
    return theta


def parameter_matching_loss(
    final: torch.Tensor, start: torch.Tensor, target: torch.Tensor, *, squared: bool
) -> torch.Tensor:
    """‖final − target‖² / ‖start − target‖² (squared, SFGC) or the ratio of the norms (GEOM),
    for flat parameter vectors (P,)."""
    num = torch.linalg.vector_norm(final - target)
    den = torch.linalg.vector_norm(start - target)
    return (num / den) ** 2 if squared else num / den


def snapshot_pair(start_epoch: int, expert_epochs: int, num_snapshots: int) -> tuple[int, int]:
    """(start, target) snapshot indices for a match starting at `start_epoch` and spanning
    `expert_epochs`; ValueError when the target is past a trajectory of `num_snapshots`."""
    if expert_epochs < SNAPSHOT_EVERY:
        raise ValueError(
            f"expert_epochs must be >= {SNAPSHOT_EVERY} (one snapshot apart), got {expert_epochs}"
        )
    start = start_epoch // SNAPSHOT_EVERY
    target = start + expert_epochs // SNAPSHOT_EVERY
    if start_epoch < 0 or target >= num_snapshots:
        raise ValueError(
            f"expert trajectories have {num_snapshots} snapshots ({SNAPSHOT_EVERY} epochs apart, "
            f"{SNAPSHOT_EVERY * (num_snapshots - 1)} epochs), but a start at epoch {start_epoch} "
            f"(snapshot {start}) plus expert_epochs={expert_epochs} needs snapshot {target}: "
            f"raise teacher_epochs to >= {SNAPSHOT_EVERY * target} or lower the start / "
            f"expert_epochs"
        )
    return start, target


def window_upper_bound(it: int, max_start_epoch_s: int, max_start_epoch: int) -> int:
    """GEOM's expanding window: start epochs at iteration `it` are drawn below this bound."""
    return min(max_start_epoch_s + it, max_start_epoch)


def _check(**values: float) -> None:
    """ValueError unless every value is a finite number, > 0 (>= 0 for `NON_NEGATIVE` names)."""
    for name, value in values.items():
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok = ok and math.isfinite(value) and (value >= 0 if name in NON_NEGATIVE else value > 0)
        if not ok:
            bound = ">= 0" if name in NON_NEGATIVE else "> 0"
            raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


def _initial(task: CondenseTask, init: str) -> Condensed:
    spec = METHODS.get(init)
    if spec is None or spec.family != "coreset":
        choices = sorted(m for m, s in METHODS.items() if s.family == "coreset")
        raise ValueError(f"init must be a coreset method {choices}, got {init!r}")
    return spec.function(task, **spec.defaults)


def _match(
    task: CondenseTask,
    experts: dict,
    *,
    init: str,
    buffer: str | Path | ExpertBuffer | None,
    save_buffer: str | Path | None,
    last_start_epoch: int,
    **distill,
) -> Condensed:
    """Validate, get the experts (load, or train and maybe save), then `_distill`."""
    _check(**{k: v for k, v in experts.items() if k not in ("optim", "curriculum")})
    _check(**{k: v for k, v in distill.items() if not callable(v) and not isinstance(v, bool)})
    if experts["optim"].lower() not in OPTIMIZERS:
        raise ValueError(f"optim must be 'SGD' or 'Adam', got {experts['optim']!r}")
    expert_epochs = distill["expert_epochs"]
    snapshot_pair(last_start_epoch, expert_epochs, 1 + experts["teacher_epochs"] // SNAPSHOT_EVERY)
    net = FlatGCN(task.graph.x.shape[1], experts["hidden"], task.num_classes)
    if buffer is None:
        buffer = train_experts(task, **experts)
        if save_buffer is not None:
            buffer.save(save_buffer)
    elif not isinstance(buffer, ExpertBuffer):
        buffer = ExpertBuffer.load(buffer)
    if buffer.num_parameters != net.num_parameters:
        raise ValueError(
            f"the expert buffer's GCNs have {buffer.num_parameters} parameters, but a GCN with "
            f"hidden={experts['hidden']} on this graph has {net.num_parameters}: the buffer was "
            f"trained on another graph or width"
        )
    snapshot_pair(last_start_epoch, expert_epochs, buffer.num_snapshots)
    return _distill(task, net, buffer, _initial(task, init), **distill)


def _distill(
    task: CondenseTask,
    net: FlatGCN,
    buffer: ExpertBuffer,
    start: Condensed,
    *,
    epochs: int,
    syn_steps: int,
    lr_student: float,
    lr_feat: float,
    expert_epochs: int,
    start_epoch: Callable[[int], int],
    squared: bool,
    first_iteration_adjacency: bool,
    soft_label: bool = False,
    lr_y: float = 0.0,
    beta: float = 0.0,
) -> Condensed:
    device, g = task.device, task.generator
    feat = start.x.detach().clone().float().to(device).requires_grad_(True)
    hard = start.y.to(device)
    syn_lr = torch.tensor(float(lr_student), device=device, requires_grad=True)
    optimizers = [
        torch.optim.Adam([feat], lr=lr_feat),
        torch.optim.SGD([syn_lr], lr=1e-6, momentum=0.5),
    ]
    order = torch.randperm(len(buffer), generator=g).tolist()
    targets = hard
    if soft_label:
        with torch.no_grad():
            theta_last = buffer[order[0]][-1].to(device)
            logits = F.log_softmax(net(theta_last, feat, Structure.identity(feat.shape[0])), -1)
            top, pred = logits.max(1)
            wrong = (pred != hard).nonzero().flatten()
            logits[wrong, hard[wrong]] = top[wrong]
        targets = logits.clone().requires_grad_(True)
        optimizers.append(torch.optim.SGD([targets], lr=lr_y, momentum=0.9))
    identity = Structure.identity(feat.shape[0])
    first = identity
    if first_iteration_adjacency and start.adjacency is not None:
        first = Structure.dense(start.adjacency.float().to(device))
    curve, starts, stopped = [], [], None
    for it in tqdm(range(epochs), desc="matching", disable=None, mininterval=5.0):
        if it and it % len(buffer) == 0:
            order = torch.randperm(len(buffer), generator=g).tolist()
        trajectory = buffer[order[it % len(buffer)]]
        s, t = snapshot_pair(start_epoch(it), expert_epochs, trajectory.shape[0])
        starts.append(s)
        theta_s, theta_t = trajectory[s].to(device), trajectory[t].to(device)
        structure = first if it == 0 else identity
        final = unroll(net, theta_s, feat, structure, targets, syn_lr, syn_steps)
        loss = parameter_matching_loss(final, theta_s, theta_t, squared=squared)
        if beta:
            expert_out = net(trajectory[-1].to(device), feat, structure)
            loss = loss + beta * student_loss(expert_out, targets)
        value = loss.item()
        if not math.isfinite(value):
            stopped = it
            logger.warning("trajectory matching stopped at iteration %d: loss %s", it, value)
            break
        for opt in optimizers:
            opt.zero_grad()
        loss.backward()
        for opt in optimizers:
            opt.step()
        if it % LOG_EVERY == 0 or it == epochs - 1:
            curve.append([it, value])
    y = F.softmax(targets.detach(), -1) if soft_label else hard
    info = {
        "loss_curve": curve,
        "loss_every": LOG_EVERY,
        "syn_lr": syn_lr.item(),
        "start_snapshots": starts,
        "target_offset": expert_epochs // SNAPSHOT_EVERY,
        "stopped_at_nonfinite": stopped,
        "experts": buffer.summary(),
    }
    return Condensed(feat.detach(), None, y.detach(), info)


# ---------------------------------------------------------------- the methods

_SFGC_KEYS = ("lr_teacher", "wd_teacher", "optim", "teacher_epochs", "expert_epochs",
              "syn_steps", "start_epoch", "lr_student", "lr_feat")  # fmt: skip
# GraphSlim's configs/sfgc/<dataset>.json; epochs is its default 1000 everywhere
# fmt: off
_SFGC_TABLE = {
    "cora":     (0.4,  0.0,  "SGD",  2500, 1500, 500,  30, 0.5, 1e-3),
    "citeseer": (1e-3, 5e-4, "Adam", 800,  500,  200,  30, 1.0, 1e-3),
    "pubmed":   (1e-3, 5e-4, "Adam", 800,  500,  200,  30, 1.0, 1e-3),
    "arxiv":    (1.0,  0.0,  "SGD",  2000, 1900, 1000, 30, 0.1, 0.1),
    "flickr":   (1e-3, 0.0,  "Adam", 1000, 900,  900,  30, 0.2, 0.01),
    "reddit":   (1e-3, 0.0,  "Adam", 1000, 900,  900,  30, 0.5, 0.05),
}
# fmt: on
SFGC_PRESETS = {
    ds: {**dict(zip(_SFGC_KEYS, row, strict=True)), "epochs": 1000}
    for ds, row in _SFGC_TABLE.items()
}

_GEOM_KEYS = ("lr_teacher", "wd_teacher", "optim", "teacher_epochs", "scheduler", "lam", "T",
              "expert_epochs", "max_start_epoch_s", "max_start_epoch", "syn_steps", "lr_student",
              "soft_label", "lr_y", "beta", "lr_feat", "epochs")  # fmt: skip
# GraphSlim's configs/geom/<dataset>.json (cora's lr_feat is the default 1e-4); every config has
# mom_teacher 0 and min_start_epoch 0
# fmt: off
_GEOM_TABLE = {
    "cora":     (0.4,  0.0,  "SGD",  3000, "geom",   0.75, 1500, 1400, 50,  200, 2500, 0.5,
                 True,  5e-5, 0.01, 1e-4, 1000),
    "citeseer": (1e-3, 5e-4, "Adam", 1000, "root",   0.8,  250,  350,  10,  80,  200,  1.0,
                 False, 0.0,  0.05, 7e-4, 1000),
    "pubmed":   (1e-3, 5e-4, "Adam", 1000, "root",   0.8,  250,  350,  10,  80,  200,  1.0,
                 False, 0.0,  0.05, 7e-4, 1000),
    "arxiv":    (1.0,  0.0,  "SGD",  2400, "root",   0.85, 1200, 1900, 200, 350, 2100, 0.1,
                 True,  1e-3, 0.0,  0.03, 400),
    "flickr":   (1e-3, 5e-4, "Adam", 1100, "root",   0.95, 100,  70,   10,  70,  300,  0.2,
                 False, 0.0,  0.3,  0.07, 400),
    "reddit":   (1e-3, 5e-4, "Adam", 1000, "linear", 0.9,  800,  900,  1,   20,  800,  0.2,
                 False, 1e-4, 0.25, 0.2,  3000),
}
# fmt: on
# reddit matches on the coreset's adjacency at iteration 0 (GraphSlim: reddit at rates < 0.075,
# which covers all its benchmark rates)
GEOM_PRESETS = {
    ds: {
        **dict(zip(_GEOM_KEYS, row, strict=True)),
        "mom_teacher": 0.0,
        "min_start_epoch": 0,
        "first_iteration_adjacency": ds == "reddit",
    }
    for ds, row in _GEOM_TABLE.items()
}
PRESETS = {"sfgc": SFGC_PRESETS, "geom": GEOM_PRESETS}

# CPU-sized schedules (apply over a dataset preset; learning rates stay the dataset's): 2 experts
# of 100 epochs (11 snapshots), matches of 50 epochs starting within the first 30, 20 unrolled
# steps, 100 iterations. Not the anchor's numbers: for smoke runs and `reproduce --quick`.
QUICK = {
    "sfgc": {
        "num_experts": 2,
        "teacher_epochs": 100,
        "expert_epochs": 50,
        "start_epoch": 20,
        "syn_steps": 20,
        "epochs": 100,
    },
    "geom": {
        "num_experts": 2,
        "teacher_epochs": 100,
        "T": 50,
        "expert_epochs": 50,
        "max_start_epoch_s": 10,
        "max_start_epoch": 30,
        "syn_steps": 20,
        "epochs": 100,
    },
}

_COMMON = {"num_experts": 20, "hidden": 256, "init": "random", "buffer": None, "save_buffer": None}


@register(
    "sfgc",
    family="trajectory",
    structure="none",
    defaults={**SFGC_PRESETS["cora"], **_COMMON, "first_iteration_adjacency": True},
)
def sfgc(
    task: CondenseTask,
    *,
    lr_teacher: float,
    wd_teacher: float,
    optim: str,
    teacher_epochs: int,
    expert_epochs: int,
    syn_steps: int,
    start_epoch: int,
    lr_student: float,
    lr_feat: float,
    epochs: int,
    num_experts: int,
    hidden: int,
    init: str,
    buffer: str | Path | ExpertBuffer | None,
    save_buffer: str | Path | None,
    first_iteration_adjacency: bool,
) -> Condensed:
    """SFGC: structure-free features matching expert GCN trajectories (squared distance ratio).

    Args:
        task: the condensation task.
        lr_teacher: the experts' learning rate.
        wd_teacher: the experts' weight decay.
        optim: the experts' optimiser, "SGD" or "Adam".
        teacher_epochs: epochs per expert (1 + teacher_epochs // 10 snapshots).
        expert_epochs: epochs between the matched start and target snapshots.
        syn_steps: unrolled student steps per iteration.
        start_epoch: the latest start epoch (starts: 0, 10, ..., start_epoch).
        lr_student: the initial learnable student step size.
        lr_feat: Adam's learning rate on X'.
        epochs: matching iterations.
        num_experts: experts to train when `buffer` is None (GraphSlim's effective 20).
        hidden: the GCN's hidden width (experts and student).
        init: the coreset method X' starts from ("random", "kcenter", "herding", ...).
        buffer: experts to reuse: an `ExpertBuffer` or a file written by `ExpertBuffer.save`
            (all its experts are used; None trains `num_experts`).
        save_buffer: where to save the experts trained here (None: not saved).
        first_iteration_adjacency: match on the coreset's induced adjacency at iteration 0.

    Returns:
        `Condensed` with x (n, F), no adjacency, labels, and info (loss every 10 iterations,
        start snapshots, buffer summary).
    """
    experts = {"num_experts": num_experts, "teacher_epochs": teacher_epochs, "hidden": hidden,
               "lr_teacher": lr_teacher, "wd_teacher": wd_teacher, "optim": optim}  # fmt: skip
    _check(start_epoch=start_epoch)
    candidates = start_epoch // SNAPSHOT_EVERY + 1  # start epochs 0, 10, ..., <= start_epoch

    def draw(_: int) -> int:
        return SNAPSHOT_EVERY * int(torch.randint(candidates, (1,), generator=task.generator))

    return _match(task, experts, init=init, buffer=buffer, save_buffer=save_buffer,
                  last_start_epoch=start_epoch, start_epoch=draw, squared=True, epochs=epochs,
                  syn_steps=syn_steps, lr_student=lr_student, lr_feat=lr_feat,
                  expert_epochs=expert_epochs,
                  first_iteration_adjacency=bool(first_iteration_adjacency))  # fmt: skip


@register(
    "geom", family="trajectory", structure="none", defaults={**GEOM_PRESETS["cora"], **_COMMON}
)
def geom(
    task: CondenseTask,
    *,
    lr_teacher: float,
    wd_teacher: float,
    mom_teacher: float,
    optim: str,
    teacher_epochs: int,
    scheduler: str,
    lam: float,
    T: float,
    expert_epochs: int,
    max_start_epoch_s: int,
    max_start_epoch: int,
    min_start_epoch: int,
    syn_steps: int,
    lr_student: float,
    soft_label: bool,
    lr_y: float,
    beta: float,
    lr_feat: float,
    epochs: int,
    num_experts: int,
    hidden: int,
    init: str,
    buffer: str | Path | ExpertBuffer | None,
    save_buffer: str | Path | None,
    first_iteration_adjacency: bool,
) -> Condensed:
    """GEOM: expanding-window trajectory matching on curriculum experts, soft labels optional.

    Args:
        task: the condensation task.
        lr_teacher: the experts' learning rate.
        wd_teacher: the experts' weight decay.
        mom_teacher: the experts' SGD momentum.
        optim: the experts' optimiser, "SGD" or "Adam".
        teacher_epochs: epochs per expert (1 + teacher_epochs // 10 snapshots).
        scheduler: the curriculum, "linear", "root" or "geom".
        lam: the curriculum's starting fraction of training nodes, in (0, 1].
        T: the epoch from which the curriculum uses every training node.
        expert_epochs: epochs between the matched start and target snapshots.
        max_start_epoch_s: the expanding window's initial upper bound on start epochs.
        max_start_epoch: the window's final upper bound (start epochs < it).
        min_start_epoch: the lowest start epoch.
        syn_steps: unrolled student steps per iteration.
        lr_student: the initial learnable student step size.
        soft_label: learn soft labels (returned as (n, C) probabilities).
        lr_y: SGD's learning rate on the soft-label logits.
        beta: weight of the distillation term from each expert's final GCN.
        lr_feat: Adam's learning rate on X'.
        epochs: matching iterations.
        num_experts: experts to train when `buffer` is None (GraphSlim's effective 20).
        hidden: the GCN's hidden width (experts and student).
        init: the coreset method X' starts from ("random", "kcenter", "herding", ...).
        buffer: experts to reuse: an `ExpertBuffer` or a file written by `ExpertBuffer.save`
            (all its experts are used; None trains `num_experts`).
        save_buffer: where to save the experts trained here (None: not saved).
        first_iteration_adjacency: match on the coreset's induced adjacency at iteration 0.

    Returns:
        `Condensed` with x (n, F), no adjacency, labels, and info (loss every 10 iterations,
        start snapshots, buffer summary).
    """
    experts = {"num_experts": num_experts, "teacher_epochs": teacher_epochs, "hidden": hidden,
               "lr_teacher": lr_teacher, "wd_teacher": wd_teacher, "mom_teacher": mom_teacher,
               "optim": optim, "curriculum": (scheduler, lam, T)}  # fmt: skip
    _check(T=T, max_start_epoch_s=max_start_epoch_s, max_start_epoch=max_start_epoch,
           min_start_epoch=min_start_epoch, lr_y=lr_y, beta=beta)  # fmt: skip
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
    if not 0 < lam <= 1:
        raise ValueError(f"lam (the curriculum's starting fraction) must be in (0, 1], got {lam}")
    if min_start_epoch >= min(max_start_epoch_s, max_start_epoch):
        raise ValueError(
            f"need min_start_epoch < min(max_start_epoch_s, max_start_epoch), got "
            f"{min_start_epoch}, {max_start_epoch_s}, {max_start_epoch}"
        )

    def draw(it: int) -> int:
        upper = window_upper_bound(it, max_start_epoch_s, max_start_epoch)
        return int(torch.randint(min_start_epoch, upper, (1,), generator=task.generator))

    return _match(task, experts, init=init, buffer=buffer, save_buffer=save_buffer,
                  last_start_epoch=max_start_epoch - 1, start_epoch=draw, squared=False,
                  epochs=epochs, syn_steps=syn_steps, lr_student=lr_student, lr_feat=lr_feat,
                  expert_epochs=expert_epochs, soft_label=bool(soft_label), lr_y=lr_y, beta=beta,
                  first_iteration_adjacency=bool(first_iteration_adjacency))  # fmt: skip
