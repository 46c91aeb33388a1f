"""What ``s`` ranges over: the pool's examples (CADS-E) or its sources (CADS-S), the distribution
drawn from it, and how a draw becomes an example mask."""

from __future__ import annotations

import torch

from cads.config import SelectConfig
from cads.distributions import BernoulliMasks, TruncatedGaussianRatios, ratios_to_mask
from cads.outer import OuterVariable
from cads.task import SelectionTask

__all__ = ["Units"]


class Units:
    """The selection units of ``task`` at ``level`` (``"example"`` or ``"source"``)."""

    def __init__(self, task: SelectionTask, level: str, config: SelectConfig) -> None:
        if level not in ("example", "source"):
            raise ValueError(f"level must be 'example' or 'source', got {level!r}")
        self.task, self.level = task, level
        if level == "example":
            self.count = len(task)
            self.weights = torch.ones(self.count, dtype=torch.float64)
            self.distribution = BernoulliMasks()
            self.bounds = (config.eps, 1 - config.eps)
        else:
            self.count = len(task.source_names)
            self.weights = task.source_sizes().double()
            self.distribution = TruncatedGaussianRatios(config.sigma)
            self.bounds = (0.0, 1.0)
        if config.size is not None and config.size > float(self.weights.sum()):
            raise ValueError(f"size {config.size:g} exceeds the pool's {len(task)} examples")

    def variable(self, config: SelectConfig) -> OuterVariable:
        init = torch.full((self.count,), config.init, dtype=torch.float64)
        return OuterVariable(
            init, config.lr, config.clip_norm, self.bounds, config.size, self.weights
        )

    def anneal(self, config: SelectConfig) -> None:
        if self.level == "source":
            self.distribution.sigma *= config.sigma_decay

    def expected_draw_size(self, s: torch.Tensor) -> float:
        """The expected number of examples a draw at ``s`` holds: ``Σ_i s_i`` (CADS-E), or
        ``Σ_j n_j E[r_j]`` (CADS-S, at the current ``σ``, before rounding each source's count),
        which differs from ``Σ_j n_j s_j`` because the truncated Gaussian's mean is not ``s_j``.
        """
        return float((self.weights * self.distribution.mean(s)).sum())

    def example_masks(self, draws: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """``(K, N)`` bool example masks of ``K`` draws."""
        if self.level == "example":
            return draws.bool()
        return torch.stack([ratios_to_mask(r, self.task.sources, generator) for r in draws])

    def example_weights(self, s: torch.Tensor) -> torch.Tensor:
        """``(N,)`` each example's inclusion probability (its source's ratio at source level)."""
        return s if self.level == "example" else s[self.task.sources]
