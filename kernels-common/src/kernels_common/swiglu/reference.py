"""PyTorch reference of SwiGLU's gate: ``silu(a) * b``, computed in float32."""

from __future__ import annotations

import torch


def swiglu_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b`` with float32 arithmetic, returned in the inputs' dtype.

    Args:
        a: gate pre-activation, any shape, floating dtype.
        b: value, same shape and dtype as ``a``.
    """
    out = torch.nn.functional.silu(a.float()) * b.float()
    return out.to(a.dtype)
