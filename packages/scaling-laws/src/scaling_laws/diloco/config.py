"""Configuration of the DiLoCo trainer (and its data-parallel baseline)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = ["ALGORITHMS", "DiLoCoConfig"]

ALGORITHMS = ("diloco", "data_parallel")


@dataclass(frozen=True)
class DiLoCoConfig:
    """Hyperparameters, defaults from the DiLoCo scaling-law paper where it states them.

    Attributes:
        algorithm: ``"diloco"`` (sync every ``inner_steps``) or ``"data_parallel"`` (gradients
            all-reduced every step, one AdamW on identical replicas).
        total_steps: inner optimizer steps of the whole run (length of the lr schedule).
        inner_steps: H, inner steps between outer synchronisations (ignored by data-parallel).
        inner_lr: peak AdamW learning rate.
        inner_betas: AdamW (β1, β2); the paper uses (0.9, 0.99).
        inner_weight_decay: AdamW decoupled weight decay.
        warmup_steps: linear warmup of the inner lr, then cosine decay to
            ``min_lr_ratio · inner_lr`` at ``total_steps``.
        max_grad_norm: gradient clipping of the (all-reduced, for data-parallel) gradient.
        outer_lr: outer SGD learning rate (paper: 0.2–1.0 tuned).
        outer_momentum: outer momentum (0.9); 0 turns it off.
        nesterov: Nesterov momentum for the outer step.
        seed: base seed of each replica's data generator (replica r uses ``seed + r``).
    """

    algorithm: str = "diloco"
    total_steps: int = 1000
    inner_steps: int = 50
    inner_lr: float = 1e-3
    inner_betas: tuple[float, float] = (0.9, 0.99)
    inner_weight_decay: float = 0.1
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    max_grad_norm: float | None = 1.0
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        for name in ("total_steps", "inner_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0 <= self.warmup_steps < self.total_steps:
            raise ValueError(
                f"warmup_steps must be in [0, total_steps={self.total_steps}), "
                f"got {self.warmup_steps}"
            )
        for name in ("inner_lr", "outer_lr"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be positive and finite, got {value!r}")
        betas = tuple(self.inner_betas)
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"inner_betas must be two numbers in [0, 1), got {self.inner_betas}")
        object.__setattr__(self, "inner_betas", (float(betas[0]), float(betas[1])))
        if self.inner_weight_decay < 0:
            raise ValueError(f"inner_weight_decay must be >= 0, got {self.inner_weight_decay}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        if not 0 <= self.outer_momentum < 1:
            raise ValueError(f"outer_momentum must be in [0, 1), got {self.outer_momentum}")
        if self.nesterov and self.outer_momentum == 0:
            raise ValueError("nesterov needs outer_momentum > 0 (set nesterov=False)")

    def inner_lr_at(self, step: int) -> float:
        """Inner lr of 0-based step ``step``: linear warmup, then cosine to the floor."""
        if step < self.warmup_steps:
            return self.inner_lr * (step + 1) / self.warmup_steps
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / span, 1.0)
        floor = self.min_lr_ratio * self.inner_lr
        return floor + (self.inner_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def to_dict(self) -> dict:
        out = asdict(self)
        out["inner_betas"] = list(self.inner_betas)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> DiLoCoConfig:
        data = dict(data)
        data["inner_betas"] = tuple(data["inner_betas"])
        return cls(**data)
