"""Fused recurrent gated delta rule: forward and backward kernels, one program per (V tile, b·h).

Layout: q, k ``(B, T, H, K)``, v and the output ``(B, T, H, V)``, g, beta ``(B, T, H)``, all
contiguous (grouped heads already expanded); states ``(B·H, K, V)`` float32. The state tile
``(BK, BV)`` stays in registers for the whole sequence; arithmetic is float32.

The backward pass walks the sequence in reverse, which needs every ``S_{t-1}``. The forward pass
checkpoints the state every ``SEGMENT`` steps; the backward kernel replays one segment forward
from its checkpoint into a scratch buffer of ``SEGMENT`` states, then runs that segment in reverse.
Memory: ``cdiv(T, SEGMENT)`` checkpoints plus ``SEGMENT`` scratch states per program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jet_nemotron.kernels.chunk_forward import state_tile, state_tiles
from kernels_common.triton_utils import cdiv, device_guard

SEGMENT = 16


@triton.jit
def _step_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, row, offs_k, offs_v, K, V):
    """Token ``row`` (an index into the flattened ``(B, T, H)``) as float32 vectors."""
    mask_k = offs_k < K
    mask_v = offs_v < V
    q = tl.load(q_ptr + row * K + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + row * K + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + row * V + offs_v, mask=mask_v, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row).to(tl.float32)
    beta = tl.load(beta_ptr + row).to(tl.float32)
    return q, k, v, g, beta


@triton.jit
def _recurrent_forward_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, s0_ptr, sT_ptr, ckpt_ptr,
    T, H, K, V, N_SEGMENTS, scale,
    BK: tl.constexpr, BV: tl.constexpr, SEGMENT: tl.constexpr,
    HAS_INITIAL: tl.constexpr, STORE_FINAL: tl.constexpr, CHECKPOINT: tl.constexpr,
):  # fmt: skip
    """``S ← e^g S; u = β (v - Sᵀk); S ← S + k uᵀ; o = scale · Sᵀq`` for every token."""
    _, bh, b, h, offs_k, offs_v, mask_s, tile = state_tile(H, K, V, BK, BV)
    S = tl.zeros((BK, BV), dtype=tl.float32)
    if HAS_INITIAL:
        S = tl.load(s0_ptr + bh * K * V + tile, mask=mask_s, other=0.0)
    for t in range(T):
        if CHECKPOINT and t % SEGMENT == 0:
            segment = bh * N_SEGMENTS + t // SEGMENT
            tl.store(ckpt_ptr + segment * K * V + tile, S, mask=mask_s)
        row = (b * T + t) * H + h
        q, k, v, g, beta = _step_inputs(
            q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, row, offs_k, offs_v, K, V
        )
        S = S * tl.exp(g)
        u = beta * (v - tl.sum(S * k[:, None], axis=0))
        S = S + k[:, None] * u[None, :]
        o = scale * tl.sum(S * q[:, None], axis=0)
        tl.store(o_ptr + row * V + offs_v, o.to(o_ptr.dtype.element_ty), mask=offs_v < V)
    if STORE_FINAL:
        tl.store(sT_ptr + bh * K * V + tile, S, mask=mask_s)


@triton.jit
def _recurrent_backward_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, do_ptr, dsT_ptr, ckpt_ptr, scratch_ptr,
    dq_ptr, dk_ptr, dv_ptr, dg_ptr, dbeta_ptr, ds0_ptr,
    T, H, K, V, N_SEGMENTS, N_VT, N_ROWS, scale,
    BK: tl.constexpr, BV: tl.constexpr, SEGMENT: tl.constexpr, HAS_FINAL_GRAD: tl.constexpr,
):  # fmt: skip
    """Reverse pass. ``dq``, ``dk``, ``dg``, ``dbeta`` are partial sums over this program's V
    tile, written to ``(N_VT, ...)`` buffers that the caller sums; ``dv`` and ``ds0`` are whole.

    Per step, with ``a = e^g``, ``S_d = a S_{t-1}``, ``p = S_dᵀ k``, ``u = β (v - p)``:
    ``dS += scale q doᵀ``, ``dq = scale S_t do``, ``du = dSᵀ k``, ``dk = dS u + S_d dp`` with
    ``dp = -β du``, ``dv = β du``, ``dβ = du·(v - p)``, ``dS_d = dS + k dpᵀ``,
    ``dg = a <dS_d, S_{t-1}>`` and ``dS_{t-1} = a dS_d``.
    """
    pid_v, bh, b, h, offs_k, offs_v, mask_s, tile = state_tile(H, K, V, BK, BV)
    mask_k = offs_k < K
    mask_v = offs_v < V
    scratch = scratch_ptr + (bh * N_VT + pid_v) * SEGMENT * BK * BV
    scratch_tile = offs_k[:, None] * BV + tl.arange(0, BV)[None, :]
    dS = tl.zeros((BK, BV), dtype=tl.float32)
    if HAS_FINAL_GRAD:
        dS = tl.load(dsT_ptr + bh * K * V + tile, mask=mask_s, other=0.0)
    for segment_back in range(N_SEGMENTS):
        segment = N_SEGMENTS - 1 - segment_back
        start = segment * SEGMENT
        S = tl.load(ckpt_ptr + (bh * N_SEGMENTS + segment) * K * V + tile, mask=mask_s, other=0.0)
        # replay the segment forward, keeping S_{t-1} of each step
        for j in range(SEGMENT):
            t = start + j
            if t < T:
                tl.store(scratch + j * BK * BV + scratch_tile, S)
                row = (b * T + t) * H + h
                q, k, v, g, beta = _step_inputs(
                    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, row, offs_k, offs_v, K, V
                )
                S = S * tl.exp(g)
                S = S + k[:, None] * (beta * (v - tl.sum(S * k[:, None], axis=0)))[None, :]
        tl.debug_barrier()
        for j_back in range(SEGMENT):
            t = start + SEGMENT - 1 - j_back
            if t < T:
                S_prev = tl.load(scratch + (t - start) * BK * BV + scratch_tile)
                row = (b * T + t) * H + h
                q, k, v, g, beta = _step_inputs(
                    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, row, offs_k, offs_v, K, V
                )
                do = tl.load(do_ptr + row * V + offs_v, mask=mask_v, other=0.0).to(tl.float32)
                a = tl.exp(g)
                S_d = a * S_prev
                residual = v - tl.sum(S_d * k[:, None], axis=0)
                u = beta * residual
                S_t = S_d + k[:, None] * u[None, :]
                dS = dS + scale * q[:, None] * do[None, :]
                dq = scale * tl.sum(S_t * do[None, :], axis=1)
                du = tl.sum(dS * k[:, None], axis=0)
                dp = -beta * du
                dk = tl.sum(dS * u[None, :], axis=1) + tl.sum(S_d * dp[None, :], axis=1)
                dbeta = tl.sum(du * residual, axis=0)
                dS_d = dS + k[:, None] * dp[None, :]
                dg = a * tl.sum(tl.sum(dS_d * S_prev, axis=1), axis=0)
                dS = a * dS_d
                partial = pid_v * N_ROWS + row
                tl.store(dq_ptr + partial * K + offs_k, dq, mask=mask_k)
                tl.store(dk_ptr + partial * K + offs_k, dk, mask=mask_k)
                tl.store(dv_ptr + row * V + offs_v, beta * du, mask=mask_v)
                tl.store(dg_ptr + partial, dg)
                tl.store(dbeta_ptr + partial, dbeta)
        tl.debug_barrier()
    tl.store(ds0_ptr + bh * K * V + tile, dS, mask=mask_s)


def recurrent_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    checkpoint: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Launch the forward kernel on contiguous inputs.

    Returns ``o (B, T, H, V)`` in q's dtype, the final state ``(B, H, K, V)`` float32 or
    ``None``, and the checkpoints ``(B·H, cdiv(T, SEGMENT), K, V)`` float32 or ``None``.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    BK, BV = state_tiles(K, V)
    n_segments = cdiv(T, SEGMENT)
    o = torch.empty(B, T, H, V, device=q.device, dtype=q.dtype)
    final = torch.empty(B, H, K, V, device=q.device, dtype=torch.float32)
    ckpt = torch.empty(B * H, n_segments if checkpoint else 1, K, V, device=q.device)
    s0 = initial_state.contiguous() if initial_state is not None else final
    with device_guard(q):
        _recurrent_forward_kernel[(cdiv(V, BV), B * H)](
            q, k, v, g, beta, o, s0, final, ckpt, T, H, K, V, n_segments, scale,
            BK=BK, BV=BV, SEGMENT=SEGMENT, HAS_INITIAL=initial_state is not None,
            STORE_FINAL=output_final_state, CHECKPOINT=checkpoint,
        )  # fmt: skip
    return o, (final if output_final_state else None), (ckpt if checkpoint else None)


def recurrent_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    checkpoints: torch.Tensor,
    do: torch.Tensor,
    d_final: torch.Tensor | None,
) -> tuple[torch.Tensor, ...]:
    """Launch the backward kernel; returns ``dq, dk, dv, dg, dbeta, d_initial_state`` (float32,
    the inputs' shapes; the state gradient ``(B, H, K, V)``)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    BK, BV = state_tiles(K, V)
    n_vt = cdiv(V, BV)
    device = q.device
    dq = torch.empty(n_vt, B, T, H, K, device=device)
    dk = torch.empty(n_vt, B, T, H, K, device=device)
    dg = torch.empty(n_vt, B, T, H, device=device)
    dbeta = torch.empty(n_vt, B, T, H, device=device)
    dv = torch.empty(B, T, H, V, device=device)
    ds0 = torch.empty(B, H, K, V, device=device)
    scratch = torch.empty(B * H * n_vt * SEGMENT * BK * BV, device=device)
    dsT = d_final.contiguous().float() if d_final is not None else ds0
    with device_guard(q):
        _recurrent_backward_kernel[(n_vt, B * H)](
            q, k, v, g, beta, do.contiguous(), dsT, checkpoints, scratch,
            dq, dk, dv, dg, dbeta, ds0, T, H, K, V, checkpoints.shape[1], n_vt, B * T * H,
            scale,
            BK=BK, BV=BV, SEGMENT=SEGMENT, HAS_FINAL_GRAD=d_final is not None,
        )  # fmt: skip
    return dq.sum(0), dk.sum(0), dv, dg.sum(0), dbeta.sum(0), ds0
