"""PyTorch references: the CPU path and the oracles of every kernel test.

They compute in float32, or in float64 when given float64 inputs (the tests' strictest oracle).
"""

from __future__ import annotations

import torch


def upcast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, or unchanged if it is float64."""
    return x if x.dtype == torch.float64 else x.float()
