"""Replica functions for tests that need a model ``jobs.train_job`` does not build; imported by
the launched processes (multiprocessing hands them the test's ``sys.path``)."""

from __future__ import annotations

import torch
from torch import nn

from scaling_laws.diloco import DiLoCoConfig, DiLoCoTrainer
from scaling_laws.diloco.jobs import parameter_digest


class ScaledMLP(nn.Module):
    """Linear -> norm -> tanh -> Linear; ``norm`` is BatchNorm (running statistics) or nothing,
    and a constant ``scale`` buffer multiplies the input. With ``carry``, the forward replaces
    a ``last`` buffer by a new tensor (the batch's mean input) instead of updating it in place."""

    def __init__(self, batchnorm: bool, carry: bool = False) -> None:
        super().__init__()
        self.first = nn.Linear(4, 16)
        self.norm = nn.BatchNorm1d(16) if batchnorm else nn.Identity()
        self.second = nn.Linear(16, 1)
        self.register_buffer("scale", torch.full((4,), 0.5))
        self.carry = carry
        self.register_buffer("last", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.carry:
            self.last = x.mean(0).detach()
        return self.second(torch.tanh(self.norm(self.first(x * self.scale))))


def buffer_job(
    rank: int, world_size: int, batchnorm: bool, carry: bool = False
) -> list[tuple[int, str]]:
    """Four DiLoCo steps (H = 2) on rank-dependent data; the parameter digests at each sync."""
    torch.manual_seed(0)
    model = ScaledMLP(batchnorm, carry)
    trainer = DiLoCoTrainer(
        model,
        lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
        DiLoCoConfig(total_steps=4, inner_steps=2, inner_lr=1e-2),
    )
    digests = []
    for _ in range(4):
        x = torch.randn(8, 4, generator=trainer.generator)
        trainer.train_step((x, x.sum(1, keepdim=True)))
        if trainer.step % 2 == 0:
            digests.append((trainer.step, parameter_digest(model)))
    return digests
