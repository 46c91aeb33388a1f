"""Autograd for the Triton SwiGLU kernels (imported only when a Triton backend runs)."""

from __future__ import annotations

from typing import Any

import torch

from kernels_common.swiglu.kernels import swiglu_bwd, swiglu_fwd


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = a.contiguous(), b.contiguous()
        ctx.save_for_backward(a, b)
        return swiglu_fwd(a, b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        return swiglu_bwd(a, b, grad.contiguous())


def swiglu_triton(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Triton ``silu(a) * b`` with gradients for both inputs."""
    return SwiGLUFunction.apply(a, b)
