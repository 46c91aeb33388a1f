"""Compute budgets and the inner training loop that spends exactly one.

A :class:`ComputeBudget` is ``C`` optimizer steps or ``C`` floating-point operations. Training on a
subset always spends the whole budget, whatever the subset's size: batches are cut from a stream
of shuffled passes over the subset (a small subset is seen many times, a large one partly), every
batch has ``batch_size`` examples, so every step costs the same and the same budget means the same
cost. A FLOP budget is spent in whole steps: ``⌊C / flops_per_step⌋`` of them, the step's FLOPs
counted once by :class:`torch.utils.flop_counter.FlopCounterMode` (forward and backward, on a
copy of the model and the first batch; not charged to the budget); what a step would overrun is
left unspent and logged. A step budget logs its FLOPs when the caller passes ``flops_per_step``
(:func:`cads.evaluate_selection` does, for the run it reports).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = [
    "ComputeBudget",
    "InnerConfig",
    "InnerLog",
    "as_budget",
    "count_step_flops",
    "train_under_budget",
]

UNITS = ("steps", "flops")
OPTIMIZERS = ("adam", "sgd")
SCHEDULES = ("cosine", "constant")

# per-example losses (B,) from a model's outputs on a batch: cross-entropy, token-mean LM loss...
LossFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ComputeBudget:
    """``amount`` of ``unit`` (``"steps"`` or ``"flops"``) for one inner training run.

    Example:
        >>> ComputeBudget(500).steps()
        500
        >>> ComputeBudget(1e9, "flops").steps(flops_per_step=3e6)
        333
    """

    amount: float
    unit: str = "steps"

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"budget unit must be one of {UNITS}, got {self.unit!r}")
        if (
            isinstance(self.amount, bool)
            or not isinstance(self.amount, int | float)
            or not math.isfinite(self.amount)
            or self.amount <= 0
        ):
            raise ValueError(f"a compute budget must be a positive number, got {self.amount!r}")
        if self.unit == "steps" and self.amount != int(self.amount):
            raise ValueError(f"a step budget must be a whole number, got {self.amount!r}")

    def steps(self, flops_per_step: float | None = None) -> int:
        """The optimizer steps this budget buys (``flops_per_step`` needed for FLOPs)."""
        if self.unit == "steps":
            return int(self.amount)
        if flops_per_step is None or not flops_per_step > 0:
            raise ValueError("a FLOP budget needs the positive FLOPs of one training step")
        steps = int(self.amount // flops_per_step)
        if steps < 1:
            raise ValueError(
                f"a budget of {self.amount:.3g} FLOPs buys no step of {flops_per_step:.3g} FLOPs"
            )
        return steps

    def __str__(self) -> str:
        return f"{int(self.amount)} steps" if self.unit == "steps" else f"{self.amount:.3g} FLOPs"


def as_budget(budget: ComputeBudget | int) -> ComputeBudget:
    """A :class:`ComputeBudget` as is; a whole number as that many steps."""
    if isinstance(budget, ComputeBudget):
        return budget
    if isinstance(budget, bool) or not isinstance(budget, int):
        raise TypeError(f"a budget is a ComputeBudget or a whole number of steps, got {budget!r}")
    return ComputeBudget(budget)


@dataclass(frozen=True)
class InnerConfig:
    """How the inner model trains: minibatch size, optimizer and learning-rate schedule (the
    cosine schedule decays to zero over the budget's steps, so each budget gets a full schedule).
    """

    batch_size: int = 64
    lr: float = 3e-3
    optimizer: str = "adam"
    schedule: str = "cosine"
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if (
            isinstance(self.batch_size, bool)
            or not isinstance(self.batch_size, int)
            or (self.batch_size < 1)
        ):
            raise ValueError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr!r}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be finite and >= 0, got {self.weight_decay!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")


@dataclass(frozen=True)
class InnerLog:
    """What one inner run spent: ``steps`` optimizer steps of ``batch_size`` examples,
    ``flops`` (``steps × flops_per_step`` when known: a FLOP budget, or ``flops_per_step``
    passed in; ``None`` otherwise), ``budget_left`` (FLOPs a whole step
    would overrun; 0 for a step budget), ``passes`` over the subset, the last batch's loss."""

    steps: int
    batch_size: int
    subset_size: int
    flops: float | None
    budget_left: float
    passes: float
    final_loss: float


def count_step_flops(
    model: torch.nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor
) -> float:
    """FLOPs of one training step's forward and backward on this batch (counted, not timed),
    on a copy of the model and with the random state restored: the model, its gradients and
    buffers (BatchNorm statistics) and the random streams (dropout) are left as they were."""
    from torch.utils.flop_counter import FlopCounterMode

    copy_ = copy.deepcopy(model)
    copy_.train(model.training)
    counter = FlopCounterMode(display=False)
    with torch.random.fork_rng(devices=[]), counter:
        loss_fn(copy_, inputs, targets).mean().backward()
    return float(counter.get_total_flops())


def first_batch_flops(model, loss_fn, inputs, targets, subset, batch_size: int) -> float:
    """:func:`count_step_flops` on the first ``batch_size`` examples of ``subset`` (cycled)."""
    device = next(model.parameters()).device
    first = subset[torch.arange(batch_size) % subset.numel()]
    return count_step_flops(model, loss_fn, inputs[first].to(device), targets[first].to(device))


def make_optimizer(model: torch.nn.Module, config: InnerConfig, steps: int):
    """The optimizer and learning-rate schedule (``None`` for constant) of a ``steps``-long run."""
    optimizer = _optimizer(model, config)
    if config.schedule == "constant":
        return optimizer, None
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / steps))
    )
    return optimizer, schedule


def _optimizer(model: torch.nn.Module, config: InnerConfig) -> torch.optim.Optimizer:
    if config.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=0.9, weight_decay=config.weight_decay
    )


def batch_stream(
    subset: torch.Tensor, batch_size: int, steps: int, generator: torch.Generator
) -> torch.Tensor:
    """``(steps, batch_size)`` example indices: consecutive shuffled passes over ``subset``."""
    needed = steps * batch_size
    passes = -(-needed // subset.numel())
    order = torch.cat(
        [subset[torch.randperm(subset.numel(), generator=generator)] for _ in range(passes)]
    )
    return order[:needed].view(steps, batch_size)


def train_under_budget(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    subset: torch.Tensor,
    budget: ComputeBudget,
    loss_fn: LossFn,
    config: InnerConfig = InnerConfig(),
    *,
    generator: torch.Generator | None = None,
    flops_per_step: float | None = None,
    example_weights: torch.Tensor | None = None,
) -> InnerLog:
    """Train ``model`` in place on ``inputs[subset]`` for exactly the budget.

    Args:
        inputs: the whole training pool, ``(N, ...)``.
        targets: its targets, ``(N, ...)``.
        subset: ``(n_sel,)`` int64 indices into the pool; empty means no training at all (an
            empty sampled selection: the model stays at its initialisation, logged as 0 steps).
        budget: steps, or FLOPs (counted on the first batch unless ``flops_per_step`` is given).
        loss_fn: ``loss_fn(model, x, y) -> (B,)`` per-example losses.
        generator: the batch order's random source.
        example_weights: ``(N,)`` non-negative weights: each batch's loss is then the weighted
            mean ``Σ w_i ℓ_i / Σ w_i`` (the continuous relaxation of a mask).

    Returns:
        :class:`InnerLog` of what was spent.
    """
    budget = as_budget(budget)
    subset = torch.as_tensor(subset, dtype=torch.long)
    if subset.dim() != 1:
        raise ValueError(f"subset must be a vector of indices, got shape {tuple(subset.shape)}")
    if subset.numel() and (subset.min() < 0 or subset.max() >= len(inputs)):
        raise ValueError(f"subset indices must lie in [0, {len(inputs)})")
    if subset.numel() == 0:
        return InnerLog(
            0,
            config.batch_size,
            0,
            0.0 if budget.unit == "flops" else None,
            float(budget.amount) if budget.unit == "flops" else 0.0,
            0.0,
            math.nan,
        )
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    device = next(model.parameters()).device
    model.train()
    if budget.unit == "flops" and flops_per_step is None:  # counted on the first batch
        flops_per_step = first_batch_flops(model, loss_fn, inputs, targets, subset,
                                           config.batch_size)  # fmt: skip
    steps = budget.steps(flops_per_step)
    batches = batch_stream(subset, config.batch_size, steps, generator)
    optimizer, scheduler = make_optimizer(model, config, steps)
    loss = torch.tensor(math.nan)
    for batch in batches:
        x, y = inputs[batch].to(device), targets[batch].to(device)
        losses = loss_fn(model, x, y)
        if example_weights is None:
            loss = losses.mean()
        else:
            w = example_weights[batch].to(losses)
            loss = (w * losses).sum() / w.sum().clamp_min(1e-12)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    flops = None if flops_per_step is None else steps * flops_per_step
    left = budget.amount - flops if budget.unit == "flops" else 0.0
    return InnerLog(
        steps,
        config.batch_size,
        subset.numel(),
        flops,
        float(left),
        steps * config.batch_size / subset.numel(),
        float(loss.detach()),
    )
