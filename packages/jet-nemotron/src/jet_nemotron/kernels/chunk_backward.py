"""Chunked gated delta rule, backward stages: one kernel per backward stage of
``jet_nemotron.ops.chunk`` (the forward stages are recomputed with ``chunk_forward``).

Layout and arithmetic as in :mod:`jet_nemotron.kernels.chunk_forward`; the state gradients
``dh (B, NT, H, K, V)`` (``dh[n]`` belongs to the state leaving chunk ``n``) are kept in the inputs'
dtype, the gate gradients in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from jet_nemotron.kernels.chunk_forward import (
    LAUNCH_CONFIGS,
    causal_decay,
    chunk_rows,
    dot_precision,
    head_tile,
    load_chunk_gates,
    load_tile,
    state_tile,
    state_tiles,
    store_tile,
)
from kernels_common.triton_utils import autotune, cdiv, device_guard


@autotune(LAUNCH_CONFIGS, key=["K", "V", "BT"])
@triton.jit
def _chunk_bwd_dv_local_kernel(
    q_ptr, k_ptr, gc_ptr, do_ptr, dv_ptr, scale, T, H, K, V,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (V tile, chunk, b·h): ``dv = scale · tril(q kᵀ ⊙ e^{gc_i - gc_j})ᵀ do``,
    built as ``(k qᵀ) ⊙ e^{gc_j - gc_i}`` on and above the diagonal."""
    i_v = tl.program_id(0)
    i_t = tl.program_id(1)
    i_bh = tl.program_id(2).to(tl.int64)
    _, m_t, rows = chunk_rows(i_t, i_bh, T, H, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    scores = tl.zeros((BT, BT), dtype=tl.float32)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        q = load_tile(q_ptr, rows, m_t, o_k, K)
        k = load_tile(k_ptr, rows, m_t, o_k, K)
        scores += tl.dot(k, tl.trans(q), input_precision=PRECISION)
    gc, _ = load_chunk_gates(gc_ptr, i_t, i_bh, T, H, BT)
    scores = scores * tl.trans(causal_decay(gc, BT, False)) * scale
    do = load_tile(do_ptr, rows, m_t, o_v, V)
    dv = tl.dot(scores.to(do.dtype), do, input_precision=PRECISION)
    store_tile(dv_ptr, dv, rows, m_t, o_v, V)


@autotune(LAUNCH_CONFIGS, key=["K", "V", "BT"])
@triton.jit
def _chunk_bwd_dhu_kernel(
    q_ptr, k_ptr, w_ptr, gc_ptr, dht_ptr, do_ptr, dv_ptr, dh_ptr, dh0_ptr, dv_new_ptr,
    scale, T, H, K, V, NT,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_FINAL_GRAD: tl.constexpr, STORE_INITIAL_GRAD: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (V tile, b·h), a loop over the chunks from the last with the ``(BK, BV)``
    state gradient in registers: store ``dh = dS``, ``dv_new = dv + (k ⊙ e^{gc_C - gc}) dS``,
    ``dS ← e^{gc_C} dS + scale (q ⊙ e^{gc})ᵀ do - wᵀ dv_new``."""
    _, i_bh, i_b, i_h, o_k, o_v, m_s, tile = state_tile(H, K, V, BK, BV)
    dS = tl.zeros((BK, BV), dtype=tl.float32)
    if HAS_FINAL_GRAD:
        dS = tl.load(dht_ptr + i_bh * K * V + tile, mask=m_s, other=0.0).to(tl.float32)
    for i in range(NT):
        i_t = NT - 1 - i
        _, m_t, rows = chunk_rows(i_t, i_bh, T, H, BT)
        state = (i_b * NT + i_t) * H + i_h
        tl.store(dh_ptr + state * K * V + tile, dS.to(dh_ptr.dtype.element_ty), mask=m_s)
        gc, g_last = load_chunk_gates(gc_ptr, i_t, i_bh, T, H, BT)
        k = load_tile(k_ptr, rows, m_t, o_k, K)
        k_decayed = (k.to(tl.float32) * tl.exp(g_last - gc)[:, None]).to(k.dtype)
        dv = load_tile(dv_ptr, rows, m_t, o_v, V).to(tl.float32)
        dv += tl.dot(k_decayed, dS.to(k.dtype), input_precision=PRECISION)
        store_tile(dv_new_ptr, dv, rows, m_t, o_v, V)
        q = load_tile(q_ptr, rows, m_t, o_k, K)
        q_decayed = (q.to(tl.float32) * (scale * tl.exp(gc))[:, None]).to(q.dtype)
        do = load_tile(do_ptr, rows, m_t, o_v, V)
        w = load_tile(w_ptr, rows, m_t, o_k, K)
        dS = dS * tl.exp(g_last)
        dS += tl.dot(tl.trans(q_decayed), do.to(q.dtype), input_precision=PRECISION)
        dS -= tl.dot(tl.trans(w), dv.to(w.dtype), input_precision=PRECISION)
    if STORE_INITIAL_GRAD:
        tl.store(dh0_ptr + i_bh * K * V + tile, dS, mask=m_s)


@autotune(LAUNCH_CONFIGS, key=["K", "V", "BT"])
@triton.jit
def _chunk_bwd_dqkwg_kernel(
    q_ptr, k_ptr, v_new_ptr, gc_ptr, h_ptr, do_ptr, dh_ptr, dv_ptr,
    dq_ptr, dk_ptr, dw_ptr, dg_ptr, scale, T, H, K, V, NT, N_ROWS,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (K tile, chunk, b·h), a loop over V tiles: ``dq, dk, dw`` of the K tile and
    its share of ``dgc`` into ``dg (NK, B, T, H)`` (row sums over the tile; the caller adds up
    the ``NK`` K tiles; ``N_ROWS = B·T·H``).

    ``dq = scale e^{gc} ⊙ (do hᵀ) + ds k``, ``dk = e^{gc_C - gc} ⊙ (v_new dhᵀ) + dsᵀ q`` with
    ``ds = scale (do v_newᵀ) ⊙ tril(e^{gc_i - gc_j})``, ``dw = -dv hᵀ``;
    ``dgc = Σ q ⊙ dq - Σ k ⊙ dk`` plus ``e^{gc_C} <h, dh> + Σ k ⊙ dk_state`` on the chunk's
    last valid row (rows past ``T`` have ``q = k = 0``; their share of the last-row terms is
    there)."""
    i_k = tl.program_id(0)
    i_t = tl.program_id(1)
    i_bh = tl.program_id(2).to(tl.int64)
    o_t, m_t, rows = chunk_rows(i_t, i_bh, T, H, BT)
    state = ((i_bh // H) * NT + i_t) * H + i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    dq = tl.zeros((BT, BK), dtype=tl.float32)
    dk = tl.zeros((BT, BK), dtype=tl.float32)
    dw = tl.zeros((BT, BK), dtype=tl.float32)
    ds = tl.zeros((BT, BT), dtype=tl.float32)
    h_dh = tl.zeros((BK,), dtype=tl.float32)
    for v0 in range(0, V, BV):
        o_v = v0 + tl.arange(0, BV)
        v_new = load_tile(v_new_ptr, rows, m_t, o_v, V)
        do = load_tile(do_ptr, rows, m_t, o_v, V)
        dv = load_tile(dv_ptr, rows, m_t, o_v, V)
        h = load_tile(h_ptr + state * K * V, o_k, m_k, o_v, V)
        dh = load_tile(dh_ptr + state * K * V, o_k, m_k, o_v, V)
        ds += tl.dot(do, tl.trans(v_new.to(do.dtype)), input_precision=PRECISION)
        dq += tl.dot(do, tl.trans(h.to(do.dtype)), input_precision=PRECISION)
        dk += tl.dot(v_new, tl.trans(dh.to(v_new.dtype)), input_precision=PRECISION)
        dw += tl.dot(dv, tl.trans(h.to(dv.dtype)), input_precision=PRECISION)
        h_dh += tl.sum(h.to(tl.float32) * dh.to(tl.float32), 1)
    gc, g_last = load_chunk_gates(gc_ptr, i_t, i_bh, T, H, BT)
    q = load_tile(q_ptr, rows, m_t, o_k, K)
    k = load_tile(k_ptr, rows, m_t, o_k, K)
    ds = ds * causal_decay(gc, BT, False) * scale
    dq = dq * (scale * tl.exp(gc))[:, None] + tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    dk_state = dk * tl.exp(g_last - gc)[:, None]
    dk = dk_state + tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
    q32 = q.to(tl.float32)
    k32 = k.to(tl.float32)
    dgc = tl.sum(q32 * dq, 1) - tl.sum(k32 * dk, 1)
    last = tl.exp(g_last) * tl.sum(h_dh, 0) + tl.sum(tl.sum(k32 * dk_state, 1), 0)
    dgc += tl.where(o_t == tl.minimum(T, i_t * BT + BT) - 1, last, 0.0)
    store_tile(dq_ptr, dq, rows, m_t, o_k, K)
    store_tile(dk_ptr, dk, rows, m_t, o_k, K)
    store_tile(dw_ptr, -dw, rows, m_t, o_k, K)
    tl.store(dg_ptr + i_k * N_ROWS + rows, dgc, mask=m_t)


@autotune(LAUNCH_CONFIGS, key=["K", "V", "BT"])
@triton.jit
def _prepare_wy_repr_bwd_kernel(
    k_ptr, v_ptr, beta_ptr, gc_ptr, Ai_ptr, dw_ptr, du_ptr, dk_in_ptr, dg_in_ptr,
    dk_ptr, dv_ptr, dbeta_ptr, dg_ptr, T, H, K, V,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (chunk, b·h): the backward of ``A -> Ai -> (w, u)``.

    With ``X = β e^{gc} ⊙ k``, ``Y = β ⊙ v``: ``dX = Aiᵀ dw``, ``dY = Aiᵀ du``,
    ``dAi = dw Xᵀ + du Yᵀ`` (first loops over K and V tiles), ``G = -(Aiᵀ dAi Aiᵀ) ⊙
    e^{gc_i - gc_j}`` below the diagonal, then a second loop over K tiles for
    ``dk = dk_in + β e^{gc} ⊙ dX + β ⊙ G k + Gᵀ (β ⊙ k)``. Also ``dv = β ⊙ dY``,
    ``dβ = e^{gc} Σ k ⊙ dX + Σ v ⊙ dY + Σ_j G_ij k_i·k_j`` and
    ``dg = dg_in + Σ X ⊙ dX + rowsum(P) - colsum(P)``, ``P = G ⊙ β_i k_i·k_j = dA ⊙ A``."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    _, m_t, rows = chunk_rows(i_t, i_bh, T, H, BT)
    beta = tl.load(beta_ptr + rows, mask=m_t, other=0.0).to(tl.float32)
    gc, _ = load_chunk_gates(gc_ptr, i_t, i_bh, T, H, BT)
    beta_gamma = beta * tl.exp(gc)
    Ai = load_tile(Ai_ptr, rows, m_t, tl.arange(0, BT), BT)
    dAi = tl.zeros((BT, BT), dtype=tl.float32)
    kk = tl.zeros((BT, BT), dtype=tl.float32)
    dbeta = tl.zeros((BT,), dtype=tl.float32)
    for v0 in range(0, V, BV):
        o_v = v0 + tl.arange(0, BV)
        v = load_tile(v_ptr, rows, m_t, o_v, V)
        du = load_tile(du_ptr, rows, m_t, o_v, V)
        Y = (v.to(tl.float32) * beta[:, None]).to(v.dtype)
        dAi += tl.dot(du.to(v.dtype), tl.trans(Y), input_precision=PRECISION)
        dY = tl.dot(tl.trans(Ai).to(v.dtype), du.to(v.dtype), input_precision=PRECISION)
        dbeta += tl.sum(v.to(tl.float32) * dY, 1)
        store_tile(dv_ptr, dY * beta[:, None], rows, m_t, o_v, V)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        k = load_tile(k_ptr, rows, m_t, o_k, K)
        dw = load_tile(dw_ptr, rows, m_t, o_k, K)
        X = (k.to(tl.float32) * beta_gamma[:, None]).to(k.dtype)
        dAi += tl.dot(dw.to(k.dtype), tl.trans(X), input_precision=PRECISION)
        kk += tl.dot(k, tl.trans(k), input_precision=PRECISION)
    Ait = tl.trans(Ai)
    dA = tl.dot(tl.dot(Ait, dAi, input_precision=PRECISION), Ait, input_precision=PRECISION)
    G = -dA * causal_decay(gc, BT, True)
    P = G * kk * beta[:, None]
    dbeta += tl.sum(G * kk, 1)
    dgc = tl.load(dg_in_ptr + rows, mask=m_t, other=0.0) + tl.sum(P, 1) - tl.sum(P, 0)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        k = load_tile(k_ptr, rows, m_t, o_k, K)
        dw = load_tile(dw_ptr, rows, m_t, o_k, K)
        dX = tl.dot(Ait.to(k.dtype), dw.to(k.dtype), input_precision=PRECISION)
        k32 = k.to(tl.float32)
        dbeta += tl.exp(gc) * tl.sum(k32 * dX, 1)
        dgc += beta_gamma * tl.sum(k32 * dX, 1)
        kb = (k32 * beta[:, None]).to(k.dtype)
        dk = load_tile(dk_in_ptr, rows, m_t, o_k, K).to(tl.float32) + dX * beta_gamma[:, None]
        dk += beta[:, None] * tl.dot(G.to(k.dtype), k, input_precision=PRECISION)
        dk += tl.dot(tl.trans(G).to(k.dtype), kb, input_precision=PRECISION)
        store_tile(dk_ptr, dk, rows, m_t, o_k, K)
    tl.store(dbeta_ptr + rows, dbeta, mask=m_t)
    tl.store(dg_ptr + rows, dgc, mask=m_t)


def chunk_bwd_dv_local(
    q: torch.Tensor, k: torch.Tensor, gc: torch.Tensor, do: torch.Tensor, scale: float,
    chunk_size: int,
) -> torch.Tensor:  # fmt: skip
    """The in-chunk part of ``dv_new``: ``(B, T, H, V)`` in do's dtype."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    dv = torch.empty_like(do)
    BV = head_tile(V)
    with device_guard(q):
        _chunk_bwd_dv_local_kernel[(cdiv(V, BV), cdiv(T, chunk_size), B * H)](
            q, k, gc, do, dv, scale, T, H, K, V,
            BT=chunk_size, BK=head_tile(K), BV=BV, PRECISION=dot_precision(q.dtype),
        )  # fmt: skip
    return dv


def chunk_bwd_dhu(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    gc: torch.Tensor,
    dht: torch.Tensor | None,
    do: torch.Tensor,
    dv: torch.Tensor,
    scale: float,
    chunk_size: int,
    initial_state_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``dh (B, NT, H, K, V)`` in q's dtype, ``dh0 (B, H, K, V)`` float32 (if
    ``initial_state_grad``, else ``None``) and the full ``dv_new (B, T, H, V)`` in do's dtype."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    NT = cdiv(T, chunk_size)
    dh = q.new_empty(B, NT, H, K, V)
    dh0 = q.new_empty(B, H, K, V, dtype=torch.float32) if initial_state_grad else None
    dv_new = torch.empty_like(dv)
    BK, BV = state_tiles(K, V)
    with device_guard(q):
        _chunk_bwd_dhu_kernel[(cdiv(V, BV), B * H)](
            q, k, w, gc, dht, do, dv, dh, dh0, dv_new, scale, T, H, K, V, NT,
            BT=chunk_size, BK=BK, BV=BV, HAS_FINAL_GRAD=dht is not None,
            STORE_INITIAL_GRAD=initial_state_grad, PRECISION=dot_precision(q.dtype),
        )  # fmt: skip
    return dh, dh0, dv_new


def chunk_bwd_dqkwg(
    q: torch.Tensor,
    k: torch.Tensor,
    v_new: torch.Tensor,
    gc: torch.Tensor,
    h: torch.Tensor,
    dv: torch.Tensor,
    do: torch.Tensor,
    dh: torch.Tensor,
    scale: float,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``dq, dk`` (float32) and ``dw`` (q's dtype) ``(B, T, H, K)``, ``dgc (B, T, H)`` float32."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    NT = cdiv(T, chunk_size)
    BK = head_tile(K)
    NK = cdiv(K, BK)
    dq = q.new_empty(q.shape, dtype=torch.float32)
    dk = torch.empty_like(dq)
    dw = torch.empty_like(q)
    dg = q.new_empty(NK, B, T, H, dtype=torch.float32)
    with device_guard(q):
        _chunk_bwd_dqkwg_kernel[(NK, NT, B * H)](
            q, k, v_new, gc, h, do, dh, dv, dq, dk, dw, dg, scale, T, H, K, V, NT, B * T * H,
            BT=chunk_size, BK=BK, BV=head_tile(V), PRECISION=dot_precision(q.dtype),
        )  # fmt: skip
    return dq, dk, dw, dg.sum(0)


def prepare_wy_repr_bwd(
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    gc: torch.Tensor,
    Ai: torch.Tensor,
    dw: torch.Tensor,
    du: torch.Tensor,
    dk: torch.Tensor,
    dgc: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The WY backward added to the output and state paths' ``dk (B, T, H, K)`` and
    ``dgc (B, T, H)``: returns the total ``dk`` (float32), ``dv (B, T, H, V)`` (float32), ``dbeta``
    and ``dgc`` ``(B, T, H)`` float32."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    BT = Ai.shape[-1]
    dk_total = torch.empty_like(dk)
    dv = v.new_empty(v.shape, dtype=torch.float32)
    dbeta = torch.empty_like(dgc)
    dgc_total = torch.empty_like(dgc)
    with device_guard(k):
        _prepare_wy_repr_bwd_kernel[(cdiv(T, BT), B * H)](
            k, v, beta, gc, Ai, dw, du, dk, dgc, dk_total, dv, dbeta, dgc_total, T, H, K, V,
            BT=BT, BK=head_tile(K), BV=head_tile(V), PRECISION=dot_precision(k.dtype),
        )  # fmt: skip
    return dk_total, dv, dbeta, dgc_total
