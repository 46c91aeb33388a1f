"""Inputs for the quantizer tests: DoReFa weights whose codes sit away from rounding boundaries."""

from __future__ import annotations

import torch


def dorefa_weight_away_from_boundaries(
    rows: int, cols: int, bits: int, generator: torch.Generator, margin: float = 0.3
) -> torch.Tensor:
    """A ``(rows, cols)`` weight whose DoReFa code arguments ``(u + 1)/2·n`` lie at least
    ``margin`` of a level from every rounding boundary, with one element per row at the peak.

    A kernel's ``tanh`` may differ from torch's by an ulp; away from the boundaries that changes
    no code, so the two sides must agree to float32 precision.
    """
    levels = 2**bits - 1
    codes = torch.randint(0, levels + 1, (rows, cols), generator=generator).float()
    offsets = (torch.rand(rows, cols, generator=generator) * 2 - 1) * (0.5 - margin)
    position = (codes + offsets).clamp(0.5 - (0.5 - margin), levels - (0.5 - margin))
    u = position / levels * 2 - 1  # strictly inside (-1, 1)
    u[:, 0] = torch.where(torch.rand(rows, generator=generator) < 0.5, -1.0, 1.0)
    peak = 0.3 + 0.6 * torch.rand(rows, 1, generator=generator)
    return torch.atanh(u * peak)
