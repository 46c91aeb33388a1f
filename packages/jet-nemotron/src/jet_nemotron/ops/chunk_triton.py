"""Autograd of the chunked gated delta rule's Triton kernels (imported only when a Triton backend
runs). Stage for stage the computation of :mod:`jet_nemotron.ops.chunk`: the forward pass keeps the
inputs, the in-chunk cumulative decay ``gc`` and ``Ai = (I + A)⁻¹``; the backward pass recomputes
``w, u, h, v_new`` from them and runs the backward kernels."""

from __future__ import annotations

from typing import Any

import torch

from jet_nemotron.kernels.chunk_backward import (
    chunk_bwd_dhu,
    chunk_bwd_dqkwg,
    chunk_bwd_dv_local,
    prepare_wy_repr_bwd,
)
from jet_nemotron.kernels.chunk_forward import (
    chunk_fwd_h,
    chunk_fwd_o,
    chunk_local_cumsum,
    chunk_scaled_dot_kkt,
    recompute_w_u,
    solve_tril,
)

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class ChunkGatedDeltaRuleTritonFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size):
        q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
        state = None if initial_state is None else initial_state.float().contiguous()
        gc = chunk_local_cumsum(g, chunk_size)
        Ai = solve_tril(chunk_scaled_dot_kkt(k, beta, gc, chunk_size))
        w, u = recompute_w_u(k, v, beta, gc, Ai)
        h, v_new, final_state = chunk_fwd_h(k, w, u, gc, state, output_final_state, chunk_size)
        o = chunk_fwd_o(q, k, v_new, h, gc, scale, chunk_size)
        ctx.save_for_backward(q, k, v, beta, gc, Ai, state)
        ctx.scale, ctx.chunk_size, ctx.g_dtype = scale, chunk_size, g.dtype
        ctx.state_dtype = None if initial_state is None else initial_state.dtype
        return o, final_state

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor, dht: torch.Tensor | None):
        q, k, v, beta, gc, Ai, state = ctx.saved_tensors
        scale, chunk_size = ctx.scale, ctx.chunk_size
        do = do.to(q.dtype).contiguous()
        dht = None if dht is None else dht.float().contiguous()
        w, u = recompute_w_u(k, v, beta, gc, Ai)
        h, v_new, _ = chunk_fwd_h(k, w, u, gc, state, False, chunk_size)
        dv = chunk_bwd_dv_local(q, k, gc, do, scale, chunk_size)
        dh, dh0, dv = chunk_bwd_dhu(
            q, k, w, gc, dht, do, dv, scale, chunk_size, initial_state_grad=state is not None
        )
        dq, dk, dw, dgc = chunk_bwd_dqkwg(q, k, v_new, gc, h, dv, do, dh, scale, chunk_size)
        dk, dv, dbeta, dgc = prepare_wy_repr_bwd(k, v, beta, gc, Ai, dw, dv, dk, dgc)
        dg = chunk_local_cumsum(dgc, chunk_size, reverse=True)
        dh0 = None if dh0 is None else dh0.to(ctx.state_dtype)
        return (
            dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(ctx.g_dtype),
            dbeta.to(beta.dtype), None, dh0, None, None,
        )  # fmt: skip


def chunk_gated_delta_rule_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunked gated delta rule on the Triton kernels; same arguments and result as
    :func:`jet_nemotron.ops.chunk.chunk_gated_delta_rule_torch` (inputs float32, float16 or
    bfloat16; the final state float32).

    Raises:
        TypeError: q is not float32, float16 or bfloat16.
    """
    if q.dtype not in KERNEL_DTYPES:
        raise TypeError(
            f"the Triton kernels take float32, float16 or bfloat16 inputs, got {q.dtype}; "
            "use the reference backend for float64"
        )
    return ChunkGatedDeltaRuleTritonFunction.apply(
        q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size
    )
