"""Autograd for the Triton fake quantizers (imported only when a Triton backend runs)."""

from __future__ import annotations

from typing import Any

import torch

from multibit_quant.kernels.fakequant import activation_bwd, activation_fwd, weight_bwd, weight_fwd
from multibit_quant.reference import lsq_grad_scale


class FakeQuantWeight(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, weight, step, bits, method, correction, grad_scale):
        weight = weight.contiguous()
        step = step.contiguous() if step is not None else None
        out, stats = weight_fwd(weight, bits, method, step, correction)
        ctx.save_for_backward(weight, step, stats)
        ctx.settings = (bits, method, correction, grad_scale)
        return out

    @staticmethod
    def backward(ctx: Any, grad):
        weight, step, stats = ctx.saved_tensors
        bits, method, correction, grad_scale = ctx.settings
        dw, dstep = weight_bwd(weight, bits, method, step, correction, stats, grad.contiguous())
        if dstep is not None:
            dstep = (dstep * grad_scale).to(step.dtype)
        return dw, dstep, None, None, None, None


class FakeQuantActivation(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x, step, bits, method, signed, grad_scale):
        x = x.contiguous()
        step = step.contiguous() if step is not None else None
        ctx.save_for_backward(x, step)
        ctx.settings = (bits, method, signed, grad_scale)
        return activation_fwd(x, bits, method, step, signed)

    @staticmethod
    def backward(ctx: Any, grad):
        x, step = ctx.saved_tensors
        bits, method, signed, grad_scale = ctx.settings
        dx, dstep = activation_bwd(x, bits, method, step, signed, grad.contiguous())
        if dstep is not None:
            dstep = (dstep * grad_scale).to(step.dtype).reshape(step.shape)
        return dx, dstep, None, None, None, None


def fake_quant_weight_triton(weight, bits, method="dorefa", step=None, correction="mean_var",
                             grad_scale=None):  # fmt: skip
    """Triton :func:`~multibit_quant.reference.fake_quant_weight_reference`."""
    if method == "lsq" and grad_scale is None:
        grad_scale = lsq_grad_scale(weight.shape[1], bits)
    return FakeQuantWeight.apply(weight, step, bits, method, correction, grad_scale)


def fake_quant_activation_triton(x, bits, method="clamp", step=None, signed=False,
                                 grad_scale=None):  # fmt: skip
    """Triton :func:`~multibit_quant.reference.fake_quant_activation_reference`."""
    if method == "lsq" and grad_scale is None:
        grad_scale = lsq_grad_scale(x.numel(), bits, signed)
    return FakeQuantActivation.apply(x, step, bits, method, signed, grad_scale)
