"""Autograd for the Triton logic-layer kernels (imported only when a Triton backend runs)."""

from __future__ import annotations

from typing import Any

import torch

from dlgn_gumbel.kernels.logic import logic_bwd, logic_fwd


class LogicLayerFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, idx_a: torch.Tensor, idx_b: torch.Tensor, coeffs: torch.Tensor
    ) -> torch.Tensor:
        x, coeffs = x.contiguous(), coeffs.contiguous()
        idx_a, idx_b = idx_a.contiguous(), idx_b.contiguous()
        ctx.save_for_backward(x, idx_a, idx_b, coeffs)
        return logic_fwd(x, idx_a, idx_b, coeffs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, idx_a, idx_b, coeffs = ctx.saved_tensors
        grad_x, grad_c = logic_bwd(x, idx_a, idx_b, coeffs, grad.contiguous())
        return grad_x, None, None, grad_c


def logic_layer_triton(
    x: torch.Tensor, idx_a: torch.Tensor, idx_b: torch.Tensor, coeffs: torch.Tensor
) -> torch.Tensor:
    """Triton ``c0 + c1·a + c2·b + c3·ab`` with gradients for ``x`` and ``coeffs``."""
    return LogicLayerFunction.apply(x, idx_a, idx_b, coeffs)
