"""Training: Adam on the L1 loss over random LR/HR patches, as the anchor's ``train_4x.py``
(Adam, betas 0.9 / 0.999, learning rate 1e-4, batch 4, 64-pixel LR patches, halved halfway)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from spikesr.data import PatchSampler


@dataclass(frozen=True)
class TrainConfig:
    """One training run.

    Attributes:
        steps: optimizer steps.
        batch_size: patches per step.
        lr_patch: LR patch side in pixels (the DSA needs at least its patch size, 16).
        lr: Adam's learning rate.
        halve_at: fractions of ``steps`` after which the learning rate halves (anchor: half).
        seed: seeds the model's initialisation-independent randomness (Gumbel noise) and the
            patch sampler.
        threads: torch CPU threads while training (None: leave torch's setting).
    """

    steps: int = 1000
    batch_size: int = 4
    lr_patch: int = 64
    lr: float = 1e-4
    halve_at: tuple[float, ...] = (0.5,)
    seed: int = 0
    threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "lr_patch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr}")
        if any(not 0 < f < 1 for f in self.halve_at):
            raise ValueError(f"halve_at fractions must lie in (0, 1), got {self.halve_at}")

    def replace(self, **changes) -> TrainConfig:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrainLog:
    """Per-step L1 losses and the wall time of the run."""

    losses: list[float]
    seconds: float

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / max(len(self.losses), 1)


def train(
    model: nn.Module,
    sampler: PatchSampler,
    config: TrainConfig,
    *,
    device: str | torch.device = "cpu",
    progress: bool | str = False,
) -> TrainLog:
    """Train ``model`` in place on ``sampler``'s patches; returns the losses.

    ``progress`` (True or a label) shows a progress bar when stderr is a terminal.
    """
    from tqdm.auto import tqdm

    previous = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        torch.manual_seed(config.seed)
        model.to(device).train()
        optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, betas=(0.9, 0.999), eps=1e-8)
        milestones = sorted({max(1, round(f * config.steps)) for f in config.halve_at})
        schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones, gamma=0.5)
        losses = []
        label = progress if isinstance(progress, str) else "train"
        started = time.perf_counter()
        # a bar only on a terminal (disable=None): logs of runs are not flooded with it
        bar = tqdm(range(config.steps), desc=label, disable=None if progress else True, leave=False)
        for _ in bar:
            lr, hr = sampler.sample(config.batch_size)
            loss = F.l1_loss(model(lr.to(device)), hr.to(device))
            if not torch.isfinite(loss):
                raise FloatingPointError(f"the L1 loss became {loss.item()} at step {len(losses)}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
        model.eval()
        return TrainLog(losses, time.perf_counter() - started)
    finally:
        torch.set_num_threads(previous)
