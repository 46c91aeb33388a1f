"""Autograd of the fused recurrent Triton kernels (imported only when a Triton backend runs)."""

from __future__ import annotations

from typing import Any

import torch

from jet_nemotron.kernels.recurrent import recurrent_backward, recurrent_forward


class FusedRecurrentFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q, k, v, g, beta, initial_state, scale: float, output_final_state: bool):
        q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
        checkpoint = any(ctx.needs_input_grad[:6])
        o, final, ckpt = recurrent_forward(
            q, k, v, g, beta, scale, initial_state, output_final_state, checkpoint
        )
        if checkpoint:
            ctx.save_for_backward(q, k, v, g, beta, ckpt)
        ctx.scale = scale
        ctx.has_initial = initial_state is not None
        return o, final

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor, d_final: torch.Tensor | None):
        q, k, v, g, beta, ckpt = ctx.saved_tensors
        dq, dk, dv, dg, dbeta, ds0 = recurrent_backward(
            q, k, v, g, beta, ctx.scale, ckpt, do, d_final
        )
        grads = [dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(g.dtype)]
        return (*grads, dbeta.to(beta.dtype), ds0 if ctx.has_initial else None, None, None)


def fused_recurrent_gated_delta_rule_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The Triton fused recurrent form; same arguments and result as the reference recurrence
    (:func:`jet_nemotron.ops.naive.naive_recurrent_gated_delta_rule` with a float32 state)."""
    return FusedRecurrentFunction.apply(q, k, v, g, beta, initial_state, scale, output_final_state)
