"""Shared helpers of the PFN tests: a tiny model configuration, seeded generators, KS bounds."""

from __future__ import annotations

import functools
import math

import torch

from freeze_thaw_bo.pfn.model import LearningCurvePFN, PFNConfig
from freeze_thaw_bo.pfn.train import TrainConfig, train_pfn

TINY = PFNConfig(
    max_dim_x=4,
    d_model=32,
    num_layers=2,
    num_heads=4,
    dim_feedforward=64,
    num_bars=64,
    max_context=60,
    max_horizon=32,
)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def dkw(n: int, alpha: float) -> float:
    """ε with P(sup |ECDF − F| > ε) ≤ alpha for n iid draws (Dvoretzky–Kiefer–Wolfowitz)."""
    return math.sqrt(math.log(2.0 / alpha) / (2.0 * n))


def ks_to_cdf(samples: torch.Tensor, cdf_at_sorted: torch.Tensor) -> torch.Tensor:
    """sup |ECDF − F| along the last axis, given sorted samples' CDF values."""
    n = samples.shape[-1]
    i = torch.arange(1, n + 1, dtype=cdf_at_sorted.dtype)
    return torch.maximum(i / n - cdf_at_sorted, cdf_at_sorted - (i - 1) / n).amax(-1)


@functools.cache
def tiny_model() -> LearningCurvePFN:
    """TINY trained for 120 prior steps (a few seconds), shared by the test modules.

    Callers must not modify it (fine-tuning returns a copy).
    """
    settings = TrainConfig(steps=120, batch_size=8, num_queries=32, lr=3e-3)
    return train_pfn(TINY, settings, progress=False)


def one_thread():
    """Generator for a module fixture: 1 torch thread (small ops thrash on a shared runner)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
