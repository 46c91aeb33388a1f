"""Small helpers the solvers share."""

from __future__ import annotations

from dataclasses import asdict

import torch


def random_batch(count: int, size: int | None, generator: torch.Generator) -> torch.Tensor:
    """``size`` distinct random indices in ``0..count-1`` (all of them when ``size`` is None or
    not smaller than ``count``)."""
    if size is None or size >= count:
        return torch.arange(count)
    return torch.randperm(count, generator=generator)[:size]


def progress_disabled(progress: bool | None) -> bool | None:
    """tqdm's ``disable``: ``None`` shows a bar only on a terminal."""
    return None if progress is None else not progress


def plain(config) -> dict:
    """A frozen dataclass as a JSON-ready dict (tuples as lists)."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()}
