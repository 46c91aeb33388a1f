"""Autograd of the dynamic causal convolution kernels (imported only when a Triton backend runs).

The convolution is linear in ``x`` and in the kernels separately, so its backward pass is one
more gather: ``dK_t = dy_t ⊗ window_t`` and ``dx_s = Σ_w dy_{s+W-1-w} ⊙ K_{s+W-1-w}[:, w]``,
with the state's columns treated as positions ``-W .. -1``. The decode step is the convolution
of one token from a state, followed by the shift that builds the new state; its backward pass
runs the same kernel with ``T = 1`` and adds the new state's gradient shifted back.
"""

from __future__ import annotations

from typing import Any

import torch

from jet_nemotron.kernels.dynamic_conv import (
    dynamic_conv_backward,
    dynamic_conv_forward,
    dynamic_conv_step,
)


class DynamicCausalConvFunction(torch.autograd.Function):
    """``y = conv(x, kernels, conv_state)`` with gradients for all three (``None`` state: none)."""

    @staticmethod
    def forward(ctx: Any, x, kernels, conv_state):
        ctx.save_for_backward(x, kernels, conv_state)
        return dynamic_conv_forward(x, kernels, conv_state)

    @staticmethod
    def backward(ctx: Any, dy):
        x, kernels, conv_state = ctx.saved_tensors
        return dynamic_conv_backward(dy.contiguous(), x, kernels, conv_state)


class DynamicCausalConvStepFunction(torch.autograd.Function):
    """``(y, new_state) = step(x, kernels, conv_state)`` with gradients for all three."""

    @staticmethod
    def forward(ctx: Any, x, kernels, conv_state):
        ctx.save_for_backward(x, kernels, conv_state)
        return dynamic_conv_step(x, kernels, conv_state)

    @staticmethod
    def backward(ctx: Any, dy, dnew_state):
        x, kernels, conv_state = ctx.saved_tensors
        dx, dk, dstate = dynamic_conv_backward(
            dy.contiguous()[:, None], x[:, None], kernels[:, None], conv_state
        )
        # new_state[..., w] is conv_state[..., w + 1] for w < W - 1 and x for w = W - 1
        dstate[..., 1:] += dnew_state[..., :-1]
        return dx[:, 0] + dnew_state[..., -1], dk[:, 0], dstate


def dynamic_causal_conv_triton(
    x: torch.Tensor, kernels: torch.Tensor, conv_state: torch.Tensor | None
) -> torch.Tensor:
    """The Triton path of :func:`jet_nemotron.ops.dynamic_conv.dynamic_causal_conv_reference`:
    ``y (B, T, D)`` in ``x``'s dtype, with gradients for ``x``, ``kernels`` and ``conv_state``."""
    state = None if conv_state is None else conv_state.contiguous()
    return DynamicCausalConvFunction.apply(x.contiguous(), kernels.contiguous(), state)


def dynamic_causal_conv_step_triton(
    x: torch.Tensor, kernels: torch.Tensor, conv_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused Triton decode step of
    :func:`jet_nemotron.ops.dynamic_conv.dynamic_causal_conv_step_reference`: ``y (B, D)`` and
    the new state ``(B, D, W)``, with gradients for ``x``, ``kernels`` and ``conv_state``."""
    return DynamicCausalConvStepFunction.apply(
        x.contiguous(), kernels.contiguous(), conv_state.contiguous()
    )
