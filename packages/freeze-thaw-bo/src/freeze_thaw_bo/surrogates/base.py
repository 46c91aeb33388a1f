"""What every learning-curve surrogate takes and returns.

A freeze-thaw optimizer asks one question of its surrogate: given the configurations (encoded in
the unit cube) and the prefix of each one's learning curve observed so far, what could each whole
curve look like? The answer is `num_samples` sampled curves per configuration over every epoch
1..horizon. Observed epochs are returned too (the optimizer masks them), so a surrogate never has
to special-case them.

Values are performances to be maximised and lie in [0, 1] (accuracies; benchmarks normalise other
metrics into that range before the optimizer sees them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch


@dataclass(frozen=True)
class CurveObservations:
    """The configurations and their observed learning-curve prefixes.

    Attributes:
        x: (N, D) float64, each configuration encoded in [0, 1]^D.
        curves: N one-dimensional float64 arrays; `curves[n][e]` is configuration n's value after
            epoch e + 1. An empty array means configuration n was never trained.
        horizon: T, the most epochs any configuration can be trained for.
    """

    x: np.ndarray
    curves: tuple[np.ndarray, ...]
    horizon: int

    def __post_init__(self) -> None:
        x = np.asarray(self.x, dtype=np.float64)
        if x.ndim != 2:
            raise ValueError(f"x must be (N, D), got shape {x.shape}")
        if len(self.curves) != x.shape[0]:
            raise ValueError(f"{x.shape[0]} configurations but {len(self.curves)} curves")
        if self.horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {self.horizon}")
        curves = tuple(np.asarray(c, dtype=np.float64).reshape(-1) for c in self.curves)
        for n, curve in enumerate(curves):
            if curve.size > self.horizon:
                raise ValueError(
                    f"curve {n} has {curve.size} epochs, more than the horizon {self.horizon}"
                )
            if not np.all(np.isfinite(curve)):
                raise ValueError(f"curve {n} holds a non-finite value")
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "curves", curves)

    @property
    def num_configs(self) -> int:
        return self.x.shape[0]

    @property
    def lengths(self) -> np.ndarray:
        """(N,) int64: epochs observed per configuration."""
        return np.array([c.size for c in self.curves], dtype=np.int64)

    def context(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every observation as flat arrays: (config index (M,), epoch 1..T (M,), value (M,))."""
        ids = [np.full(c.size, n, dtype=np.int64) for n, c in enumerate(self.curves)]
        epochs = [np.arange(1, c.size + 1, dtype=np.int64) for c in self.curves]
        if not ids:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, np.zeros(0)
        return np.concatenate(ids), np.concatenate(epochs), np.concatenate(self.curves)


@runtime_checkable
class CurveSurrogate(Protocol):
    """A model of learning curves that samples whole curves given observed prefixes."""

    def sample_curves(
        self, observations: CurveObservations, num_samples: int, generator: torch.Generator
    ) -> torch.Tensor:
        """(N, num_samples, T) float32 sampled values for epochs 1..T of every configuration.

        Samples along the last axis are joint (one plausible curve each) unless the surrogate's
        documentation says they are per-epoch marginals.
        """
        ...
