"""PyTorch implementations of a logic layer's relaxed forward pass.

* :func:`logic_layer_reference16` -- the plain 16-term mixture ``sum_i w_i · op_i(a, b)``, written
  for clarity: the oracle of the tests.
* :func:`logic_layer_affine` -- the CPU fast path: the mixture as ``c0 + c1·a + c2·b + c3·ab``
  with 4 coefficients per neuron and a hand-written backward that recomputes the gathered inputs
  instead of storing them.

Both take activations **feature-major**, ``x: (in_dim, B)`` -> ``y: (N, B)``: gathering a
neuron's inputs then copies whole contiguous rows (4x faster on a CPU than gathering columns of
a batch-major matrix), and the input gradient is a row-wise ``index_add``.
"""

from __future__ import annotations

from typing import Any

import torch

from dlgn_gumbel.gates import relaxed_gate

__all__ = ["logic_layer_affine", "logic_layer_reference16"]


def logic_layer_reference16(
    x: torch.Tensor, idx_a: torch.Tensor, idx_b: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """``y[n] = sum_i weights[n, i] · op_i(x[idx_a[n]], x[idx_b[n]])``.

    Args:
        x: ``(in_dim, B)`` float inputs in ``[0, 1]`` (feature-major).
        idx_a: ``(N,)`` int64 index of each neuron's first input.
        idx_b: ``(N,)`` int64 index of each neuron's second input.
        weights: ``(N, 16)`` gate weights (softmax probabilities or one-hot rows), or
            ``(N, B, 16)``: each example its own.

    Returns:
        ``(N, B)`` outputs, differentiable in ``x`` and ``weights``.
    """
    a, b = x[idx_a], x[idx_b]
    if weights.dim() == 2:
        weights = weights[:, None, :]
    return sum(weights[..., i] * relaxed_gate(i, a, b) for i in range(16))


class _AffineLogic(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, idx_a: torch.Tensor, idx_b: torch.Tensor, coeffs: torch.Tensor
    ) -> torch.Tensor:
        a, b = x.index_select(0, idx_a), x.index_select(0, idx_b)
        c0, c1, c2, c3 = _columns(coeffs)
        ctx.save_for_backward(x, idx_a, idx_b, coeffs)
        # three fused passes: (c0 + c2·b) + a·(c1 + c3·b)
        return torch.addcmul(torch.addcmul(c0, c2, b), a, torch.addcmul(c1, c3, b))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, idx_a, idx_b, coeffs = ctx.saved_tensors
        a, b = x.index_select(0, idx_a), x.index_select(0, idx_b)
        _, c1, c2, c3 = _columns(coeffs)
        grad_x = grad_coeffs = None
        if ctx.needs_input_grad[0]:
            grad_a = torch.addcmul(c1, c3, b).mul_(grad)
            grad_b = torch.addcmul(c2, c3, a).mul_(grad)
            grad_x = torch.zeros_like(x)
            grad_x.index_add_(0, idx_a, grad_a).index_add_(0, idx_b, grad_b)
        if ctx.needs_input_grad[3]:
            ga, gb = grad * a, grad * b
            if coeffs.dim() == 3:  # per-example coefficients: nothing is summed over the batch
                grad_coeffs = torch.stack((grad, ga, gb, ga * b), dim=1)
            else:
                grad_coeffs = torch.stack(
                    (grad.sum(1), ga.sum(1), gb.sum(1), ga.mul_(b).sum(1)), dim=1
                )
        return grad_x, None, None, grad_coeffs


def _columns(coeffs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(c0, c1, c2, c3)``, each ``(N, 1)`` (shared by the batch) or ``(N, B)`` (per example)."""
    return (coeffs[:, :, None] if coeffs.dim() == 2 else coeffs).unbind(1)


def logic_layer_affine(
    x: torch.Tensor, idx_a: torch.Tensor, idx_b: torch.Tensor, coeffs: torch.Tensor
) -> torch.Tensor:
    """``y[n] = c0 + c1·a + c2·b + c3·a·b`` with ``a = x[idx_a[n]]``, ``b = x[idx_b[n]]``.

    Args:
        x: ``(in_dim, B)`` float inputs (feature-major).
        idx_a: ``(N,)`` int64 index of each neuron's first input.
        idx_b: ``(N,)`` int64 index of each neuron's second input.
        coeffs: ``(N, 4)`` per-neuron coefficients ``(c0, c1, c2, c3)``, dtype of ``x``, or
            ``(N, 4, B)`` per neuron and example.

    Returns:
        ``(N, B)`` outputs, differentiable in ``x`` and ``coeffs``.
    """
    return _AffineLogic.apply(x, idx_a, idx_b, coeffs)
