"""TFLA backward: a reverse chunk-state kernel for ``dC`` (level 1), then tiled parallel kernels
for ``dQ``, ``dK`` and ``dV`` (level 2). The forward states are recomputed, not stored.

Layouts as in ``forward.py``. With ``G_t = dh_t / den_t`` and ``dz_t`` the gradient of the
normalizer, every intra-chunk weight ``W_tj = exp(logD_tj - m_t) q̂_t·k_j`` receives
``dW_tj = G_t·v_j + dz_t`` (the normalizer is the numerator of an all-ones value column), and the
state entering chunk ``k`` receives ``dC_{k-1} = decay_k dC_k + Σ_t coef_t q_t G_t^T`` with
``coef_t = exp(b_t + m_{k-1} - m_t) / sqrt(DQK)``. Gradient outputs are float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels_common.triton_utils import cdiv, device_guard
from tfla_mlstm.kernels.forward import load_rows
from tfla_mlstm.kernels.tiles import Tiles


@triton.jit
def _chunk_states_bwd_kernel(
    q_ptr, dh_ptr, coef_ptr, inv_den_ptr, dz_ptr, decay_ptr, dc_last_ptr, dn_last_ptr,
    dc_ptr, dn_ptr,
    S_PAD, NC, DQK, DV,
    L: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_QK: tl.constexpr, BLOCK_V: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """Level 1 in reverse: one program per (DQK block, DV block, batch-head), a loop over chunks
    from the last; stores the gradient of every state ``dC (BH, NC + 1, DQK, DV)`` and ``dn``."""
    pid_qk = tl.program_id(0)
    pid_v = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    offs_qk = pid_qk * BLOCK_QK + tl.arange(0, BLOCK_QK)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_qk = offs_qk < DQK
    mask_v = offs_v < DV
    mask_c = mask_qk[:, None] & mask_v[None, :]
    tile_c = offs_qk[:, None] * DV + offs_v[None, :]
    dC = tl.load(dc_last_ptr + bh * DQK * DV + tile_c, mask=mask_c, other=0.0)
    dn = tl.load(dn_last_ptr + bh * DQK + offs_qk, mask=mask_qk, other=0.0)
    for r in range(NC):
        kc = NC - 1 - r
        state = bh * (NC + 1) + kc + 1
        tl.store(dc_ptr + state * DQK * DV + tile_c, dC, mask=mask_c)
        tl.store(dn_ptr + state * DQK + offs_qk, dn, mask=mask_qk & (pid_v == 0))
        decay = tl.load(decay_ptr + bh * NC + kc)
        dC = dC * decay
        dn = dn * decay
        for l0 in range(0, L, BLOCK_L):
            offs_l = bh * S_PAD + kc * L + l0 + tl.arange(0, BLOCK_L)
            q = load_rows(q_ptr, offs_l, offs_qk, DQK)
            dh = load_rows(dh_ptr, offs_l, offs_v, DV)
            q_weighted = q.to(tl.float32) * tl.load(coef_ptr + offs_l)[:, None]
            grad = dh.to(tl.float32) * tl.load(inv_den_ptr + offs_l)[:, None]
            dC += tl.dot(
                tl.trans(q_weighted.to(q.dtype)), grad.to(q.dtype), input_precision=PRECISION
            )
            dn += tl.sum(q_weighted * tl.load(dz_ptr + offs_l)[:, None], axis=0)
    tl.store(dc_ptr + bh * (NC + 1) * DQK * DV + tile_c, dC, mask=mask_c)
    tl.store(dn_ptr + bh * (NC + 1) * DQK + offs_qk, dn, mask=mask_qk & (pid_v == 0))


@triton.jit
def _intra_weights(b_ptr, a_ptr, m_step_ptr, g, offs_t, offs_j):
    """``exp(logD_tj - m_t)`` for a (query block, key block) pair, 0 above the diagonal."""
    b_t = tl.load(b_ptr + offs_t)
    m_t = tl.load(m_step_ptr + offs_t)
    log_d = b_t[:, None] - g + tl.load(a_ptr + offs_j)[None, :] - m_t[:, None]
    return tl.exp(tl.where(offs_t[:, None] >= offs_j[None, :], log_d, float("-inf")))


@triton.jit
def _dq_kernel(
    k_ptr, v_ptr, dh_ptr, b_ptr, a_ptr, g_ptr, m_step_ptr, coef_ptr, inv_den_ptr, dz_ptr,
    c_ptr, n_ptr, dq_ptr,
    scale, S_PAD, NC, DQK, DV,
    L: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_QK: tl.constexpr, BLOCK_V: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (query block, DQK block, batch-head): ``dq_t = coef_t (C_{k-1} G_t +
    n_{k-1} dz_t) + Σ_{j <= t} dS_tj k_j`` over the causal key blocks, DV in blocks."""
    pid_t = tl.program_id(0)
    pid_qk = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    kc = pid_t // (L // BLOCK_L)
    qb = pid_t % (L // BLOCK_L)
    offs_t = bh * S_PAD + kc * L + qb * BLOCK_L + tl.arange(0, BLOCK_L)
    offs_qk = pid_qk * BLOCK_QK + tl.arange(0, BLOCK_QK)
    mask_qk = offs_qk < DQK
    state = bh * (NC + 1) + kc
    g = tl.load(g_ptr + bh * NC + kc)
    inv_den = tl.load(inv_den_ptr + offs_t)
    dz = tl.load(dz_ptr + offs_t)
    dq = tl.zeros((BLOCK_L, BLOCK_QK), dtype=tl.float32)
    for v0 in range(0, DV, BLOCK_V):
        offs_v = v0 + tl.arange(0, BLOCK_V)
        mask_v = offs_v < DV
        dh = load_rows(dh_ptr, offs_t, offs_v, DV)
        C = tl.load(
            c_ptr + state * DQK * DV + offs_qk[:, None] * DV + offs_v[None, :],
            mask=mask_qk[:, None] & mask_v[None, :],
            other=0.0,
        )
        grad = dh.to(tl.float32) * inv_den[:, None]
        dq += tl.dot(grad, tl.trans(C), input_precision=PRECISION)
    n = tl.load(n_ptr + state * DQK + offs_qk, mask=mask_qk, other=0.0)
    dq = (dq + dz[:, None] * n[None, :]) * tl.load(coef_ptr + offs_t)[:, None]
    for kb in range(qb + 1):
        offs_j = bh * S_PAD + kc * L + kb * BLOCK_L + tl.arange(0, BLOCK_L)
        dw = tl.zeros((BLOCK_L, BLOCK_L), dtype=tl.float32) + dz[:, None]
        for v0 in range(0, DV, BLOCK_V):
            offs_v = v0 + tl.arange(0, BLOCK_V)
            mask_v = offs_v < DV
            dh = load_rows(dh_ptr, offs_t, offs_v, DV)
            v = load_rows(v_ptr, offs_j, offs_v, DV)
            grad = (dh.to(tl.float32) * inv_den[:, None]).to(v.dtype)
            dw += tl.dot(grad, tl.trans(v), input_precision=PRECISION)
        ds = dw * _intra_weights(b_ptr, a_ptr, m_step_ptr, g, offs_t, offs_j) * scale
        k = load_rows(k_ptr, offs_j, offs_qk, DQK)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(dq_ptr + offs_t[:, None] * DQK + offs_qk[None, :], dq, mask=mask_qk[None, :])


@triton.jit
def _dk_kernel(
    q_ptr, v_ptr, dh_ptr, b_ptr, a_ptr, g_ptr, m_step_ptr, m_chunk_ptr, inv_den_ptr, dz_ptr,
    dc_ptr, dn_ptr, dk_ptr,
    scale, S_PAD, NC, DQK, DV,
    L: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_QK: tl.constexpr, BLOCK_V: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (key block, DQK block, batch-head): ``dk_j = exp(a_j - m_k) (dC_k v_j +
    dn_k) + Σ_{t >= j} dS_tj q_t`` over the causal query blocks, DV in blocks."""
    pid_j = tl.program_id(0)
    pid_qk = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    kc = pid_j // (L // BLOCK_L)
    kb = pid_j % (L // BLOCK_L)
    offs_j = bh * S_PAD + kc * L + kb * BLOCK_L + tl.arange(0, BLOCK_L)
    offs_qk = pid_qk * BLOCK_QK + tl.arange(0, BLOCK_QK)
    mask_qk = offs_qk < DQK
    state = bh * (NC + 1) + kc + 1
    g = tl.load(g_ptr + bh * NC + kc)
    dk = tl.zeros((BLOCK_L, BLOCK_QK), dtype=tl.float32)
    for v0 in range(0, DV, BLOCK_V):
        offs_v = v0 + tl.arange(0, BLOCK_V)
        mask_v = offs_v < DV
        v = load_rows(v_ptr, offs_j, offs_v, DV)
        dC = tl.load(
            dc_ptr + state * DQK * DV + offs_qk[:, None] * DV + offs_v[None, :],
            mask=mask_qk[:, None] & mask_v[None, :],
            other=0.0,
        )
        dk += tl.dot(v.to(tl.float32), tl.trans(dC), input_precision=PRECISION)
    dn = tl.load(dn_ptr + state * DQK + offs_qk, mask=mask_qk, other=0.0)
    w = tl.exp(tl.load(a_ptr + offs_j) - tl.load(m_chunk_ptr + state))
    dk = (dk + dn[None, :]) * w[:, None]
    for qb in range(kb, L // BLOCK_L):
        offs_t = bh * S_PAD + kc * L + qb * BLOCK_L + tl.arange(0, BLOCK_L)
        inv_den = tl.load(inv_den_ptr + offs_t)
        dw = tl.zeros((BLOCK_L, BLOCK_L), dtype=tl.float32) + tl.load(dz_ptr + offs_t)[:, None]
        for v0 in range(0, DV, BLOCK_V):
            offs_v = v0 + tl.arange(0, BLOCK_V)
            mask_v = offs_v < DV
            dh = load_rows(dh_ptr, offs_t, offs_v, DV)
            v = load_rows(v_ptr, offs_j, offs_v, DV)
            grad = (dh.to(tl.float32) * inv_den[:, None]).to(v.dtype)
            dw += tl.dot(grad, tl.trans(v), input_precision=PRECISION)
        ds = dw * _intra_weights(b_ptr, a_ptr, m_step_ptr, g, offs_t, offs_j) * scale
        q = load_rows(q_ptr, offs_t, offs_qk, DQK)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    tl.store(dk_ptr + offs_j[:, None] * DQK + offs_qk[None, :], dk, mask=mask_qk[None, :])


@triton.jit
def _dv_kernel(
    q_ptr, k_ptr, dh_ptr, b_ptr, a_ptr, g_ptr, m_step_ptr, m_chunk_ptr, inv_den_ptr,
    dc_ptr, dv_ptr,
    scale, S_PAD, NC, DQK, DV,
    L: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_QK: tl.constexpr, BLOCK_V: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (key block, DV block, batch-head): ``dv_j = exp(a_j - m_k) dC_k^T k_j +
    Σ_{t >= j} W_tj G_t`` over the causal query blocks, DQK in blocks."""
    pid_j = tl.program_id(0)
    pid_v = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    kc = pid_j // (L // BLOCK_L)
    kb = pid_j % (L // BLOCK_L)
    offs_j = bh * S_PAD + kc * L + kb * BLOCK_L + tl.arange(0, BLOCK_L)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_v = offs_v < DV
    state = bh * (NC + 1) + kc + 1
    g = tl.load(g_ptr + bh * NC + kc)
    dv = tl.zeros((BLOCK_L, BLOCK_V), dtype=tl.float32)
    for d0 in range(0, DQK, BLOCK_QK):
        offs_qk = d0 + tl.arange(0, BLOCK_QK)
        mask_qk = offs_qk < DQK
        k = load_rows(k_ptr, offs_j, offs_qk, DQK)
        dC = tl.load(
            dc_ptr + state * DQK * DV + offs_qk[:, None] * DV + offs_v[None, :],
            mask=mask_qk[:, None] & mask_v[None, :],
            other=0.0,
        )
        dv += tl.dot(k.to(tl.float32), dC, input_precision=PRECISION)
    dv = dv * tl.exp(tl.load(a_ptr + offs_j) - tl.load(m_chunk_ptr + state))[:, None]
    for qb in range(kb, L // BLOCK_L):
        offs_t = bh * S_PAD + kc * L + qb * BLOCK_L + tl.arange(0, BLOCK_L)
        s = tl.zeros((BLOCK_L, BLOCK_L), dtype=tl.float32)
        for d0 in range(0, DQK, BLOCK_QK):
            offs_qk = d0 + tl.arange(0, BLOCK_QK)
            mask_qk = offs_qk < DQK
            q = load_rows(q_ptr, offs_t, offs_qk, DQK)
            k = load_rows(k_ptr, offs_j, offs_qk, DQK)
            s += tl.dot(q, tl.trans(k), input_precision=PRECISION)
        w = s * _intra_weights(b_ptr, a_ptr, m_step_ptr, g, offs_t, offs_j) * scale
        dh = load_rows(dh_ptr, offs_t, offs_v, DV)
        grad = dh.to(tl.float32) * tl.load(inv_den_ptr + offs_t)[:, None]
        dv += tl.dot(tl.trans(w.to(dh.dtype)), grad.to(dh.dtype), input_precision=PRECISION)
    tl.store(dv_ptr + offs_j[:, None] * DV + offs_v[None, :], dv, mask=mask_v[None, :])


def chunk_states_backward(
    q: torch.Tensor,
    dh: torch.Tensor,
    coef: torch.Tensor,
    inv_den: torch.Tensor,
    dz: torch.Tensor,
    decay: torch.Tensor,
    d_last: tuple[torch.Tensor, torch.Tensor],
    *,
    dv: int,
    chunk_size: int,
    tiles: Tiles,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of every state: ``dC (BH, NC + 1, DQK, DV)``, ``dn (BH, NC + 1, DQK)``."""
    BH, S_PAD, DQK = q.shape
    NC = S_PAD // chunk_size
    dC = torch.empty(BH, NC + 1, DQK, dv, device=q.device, dtype=torch.float32)
    dn = torch.empty(BH, NC + 1, DQK, device=q.device, dtype=torch.float32)
    grid = (cdiv(DQK, tiles.qk), cdiv(dv, tiles.v), BH)
    with device_guard(q):
        _chunk_states_bwd_kernel[grid](
            q, dh, coef, inv_den, dz, decay, *d_last, dC, dn, S_PAD, NC, DQK, dv,
            L=chunk_size, BLOCK_L=tiles.seq, BLOCK_QK=tiles.qk, BLOCK_V=tiles.v,
            PRECISION=tiles.precision, **tiles.launch,
        )  # fmt: skip
    return dC, dn


def qkv_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dh: torch.Tensor,
    gates: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    step_terms: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    states: tuple[torch.Tensor, torch.Tensor],
    d_states: tuple[torch.Tensor, torch.Tensor],
    *,
    chunk_size: int,
    tiles: Tiles,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``dq, dk (BH, S_PAD, DQK)`` and ``dv (BH, S_PAD, DV)``, float32.

    Args:
        gates: ``b, a (BH, S_PAD)``, ``g (BH, NC)``, ``m_step (BH, S_PAD)``,
            ``m_chunk (BH, NC + 1)``.
        step_terms: ``coef, inv_den, dz (BH, S_PAD)``.
        states: the recomputed ``C, n`` entering every chunk; d_states: their gradients.
    """
    BH, S_PAD, DQK = q.shape
    DV = v.shape[-1]
    NC = S_PAD // chunk_size
    b, a, g, m_step, m_chunk = gates
    coef, inv_den, dz = step_terms
    scale = DQK**-0.5
    dq = torch.empty(BH, S_PAD, DQK, device=q.device, dtype=torch.float32)
    dk = torch.empty_like(dq)
    dv = torch.empty(BH, S_PAD, DV, device=q.device, dtype=torch.float32)
    blocks = NC * (chunk_size // tiles.seq)
    meta = {
        "L": chunk_size,
        "BLOCK_L": tiles.seq,
        "BLOCK_QK": tiles.qk,
        "BLOCK_V": tiles.v,
        "PRECISION": tiles.precision,
        **tiles.launch,
    }
    sizes = (scale, S_PAD, NC, DQK, DV)
    with device_guard(q):
        _dq_kernel[(blocks, cdiv(DQK, tiles.qk), BH)](
            k, v, dh, b, a, g, m_step, coef, inv_den, dz, *states, dq, *sizes, **meta
        )
        _dk_kernel[(blocks, cdiv(DQK, tiles.qk), BH)](
            q, v, dh, b, a, g, m_step, m_chunk, inv_den, dz, *d_states, dk, *sizes, **meta
        )
        _dv_kernel[(blocks, cdiv(DV, tiles.v), BH)](
            q, k, dh, b, a, g, m_step, m_chunk, inv_den, d_states[0], dv, *sizes, **meta
        )
    return dq, dk, dv
