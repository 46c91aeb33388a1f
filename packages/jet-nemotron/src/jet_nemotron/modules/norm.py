"""The JetBlock's gated output norm: ``RMSNorm(o) · weight · SiLU(gate)`` per head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GatedRMSNorm(nn.Module):
    """RMS-normalise ``o`` over its last dim, scale by a learned weight, then gate with
    ``SiLU(gate)``; computed in float32 (or float64) and returned in ``o``'s dtype (FLA's
    ``FusedRMSNormGated`` with its default swish gate, normalisation before the gate).

    Example:
        >>> import torch
        >>> norm = GatedRMSNorm(8)
        >>> norm(torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8)).shape
        torch.Size([2, 3, 4, 8])
    """

    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(o.dtype, torch.float32)
        o32 = o.to(dtype)
        normed = o32 * torch.rsqrt(o32.square().mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.to(dtype) * F.silu(gate.to(dtype))).to(o.dtype)
