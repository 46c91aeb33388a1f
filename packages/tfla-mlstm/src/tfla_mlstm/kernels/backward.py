"""TFLA backward: the normalizer's gradient and the parallel ``dQ`` kernel (the only readers of
the recomputed forward states, which can then be freed), a reverse chunk-state kernel for ``dC``
(level 1), then tiled parallel kernels for ``dK`` and ``dV`` (level 2).

Layouts as in ``forward.py``. With ``G_t = dh_t / den_t`` and ``dz_t`` the gradient of the
normalizer, every intra-chunk weight ``W_tj = E_tj q_t·k_j``, ``E_tj = exp(logD_tj - m_t) /
sqrt(DQK)``, receives ``dW_tj = G_t·v_j + dz_t`` (the normalizer is the numerator of an all-ones
value column), and the state entering chunk ``k`` receives ``dC_{k-1} = decay_k dC_k +
Σ_t coef_t q_t G_t^T`` with ``coef_t = exp(b_t + m_{k-1} - m_t) / sqrt(DQK)`` and
``decay_k = exp(g_k + m_{k-1} - m_k)``, both formed inside the kernels.

``dz_t = sign(z_t) dden_t`` where ``|z_t|`` beats its floor, ``dden_t = -dh_t·h_t / den_t``. No
``h`` is saved: ``dh_t·h_t = G_t·N_t`` is summed by its own kernel in float32 (for float32
inputs in the forward pass's order; 16-bit inputs have other step blocks in the two passes), so
``dW_tj = G_t·v_j + dz_t`` cancels in float32 before it is rounded for a 16-bit dot, as with a
float32 ``h`` (``dq`` accumulated as ``A_t + dz_t Z_t`` from two separate dots would round
``G_t·v_j`` alone and lose that cancellation).

For 16-bit inputs every dot takes 16-bit operands, the state tiles (``C``, ``dC``) rounded as the
forward pass rounds them; ``dh`` enters the dots unrounded, ``1 / den`` applied in float32 to the
other operand or to the result. Gradients are stored in the inputs' dtype; the gate gradients'
row sums ``Σ_d q·dq`` and ``Σ_d k·dk`` are stored in float32 from the float32 accumulators, one
part per DQK block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels_common.triton_utils import cdiv, device_guard
from tfla_mlstm.kernels.forward import load_rows, query_block, scores, store_rows
from tfla_mlstm.kernels.tiles import Tiles

StepGates = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@triton.jit
def _dot_state(rows, state, PRECISION: tl.constexpr):
    """``rows @ state`` for 16-bit or fp32 ``rows`` and an fp32 state (or state gradient) tile.
    bf16 rounds the state to bf16 (fp32's range, tensor cores); fp16 keeps it in fp32, since a
    state gradient carries 1/den summed over chunks and may pass fp16's largest value."""
    if rows.dtype == tl.float16:
        return tl.dot(rows.to(tl.float32), state, input_precision=PRECISION)
    return tl.dot(rows, state.to(rows.dtype), input_precision=PRECISION)


@triton.jit
def _chunk_states_bwd_kernel(
    q_ptr, dh_ptr, b_ptr, g_ptr, m_step_ptr, m_chunk_ptr, den_ptr, dz_ptr,
    dc_last_ptr, dn_last_ptr, dc_ptr, dn_ptr,
    scale, S, NC, DQK, DV,
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
        m_prev = tl.load(m_chunk_ptr + state - 1)
        decay = tl.exp(tl.load(g_ptr + bh * NC + kc) + m_prev - tl.load(m_chunk_ptr + state))
        dC = dC * decay
        dn = dn * decay
        for l0 in range(0, L, BLOCK_L):
            steps = kc * L + l0 + tl.arange(0, BLOCK_L)
            live = steps < S
            offs_l = bh * NC * L + steps
            coef = tl.exp(tl.load(b_ptr + offs_l) + m_prev - tl.load(m_step_ptr + offs_l)) * scale
            q = load_rows(q_ptr, bh * S + steps, live, offs_qk, DQK)
            dh = load_rows(dh_ptr, bh * S + steps, live, offs_v, DV)
            q_weighted = q.to(tl.float32) * coef[:, None]
            # 1 / den folded into q's weights: dh enters the dot unrounded
            q_scaled = q_weighted * (1.0 / tl.load(den_ptr + offs_l))[:, None]
            dC += tl.dot(tl.trans(q_scaled.to(dh.dtype)), dh, input_precision=PRECISION)
            dn += tl.sum(q_weighted * tl.load(dz_ptr + offs_l)[:, None], axis=0)
    tl.store(dc_ptr + bh * (NC + 1) * DQK * DV + tile_c, dC, mask=mask_c)
    tl.store(dn_ptr + bh * (NC + 1) * DQK + offs_qk, dn, mask=mask_qk & (pid_v == 0))


@triton.jit
def _intra_weights(b_ptr, a_ptr, m_step_ptr, g, offs_t, offs_j, scale):
    """``E_tj = exp(logD_tj - m_t) / sqrt(DQK)`` for a (query block, key block) pair, 0 above the
    diagonal."""
    b_t = tl.load(b_ptr + offs_t)
    m_t = tl.load(m_step_ptr + offs_t)
    log_d = b_t[:, None] - g + tl.load(a_ptr + offs_j)[None, :] - m_t[:, None]
    return tl.exp(tl.where(offs_t[:, None] >= offs_j[None, :], log_d, float("-inf"))) * scale


@triton.jit
def _dh_dot_v(
    dh_ptr, v_ptr, rows, live, key_rows, key_live, inv_den, DV,
    BLOCK_L: tl.constexpr, BLOCK_V: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """``G_t·v_j = (dh_t·v_j) / den_t`` for a (query block, key block) pair, over DV in blocks
    (``dh·v`` from the inputs' dtype, exact products summed in float32; ``G`` is never rounded)."""
    dw = scores(dh_ptr, v_ptr, rows, live, key_rows, key_live, DV, BLOCK_L, BLOCK_V, PRECISION)
    return dw * inv_den[:, None]


@triton.jit
def _normalizer_grad_kernel(
    q_ptr, k_ptr, v_ptr, dh_ptr, b_ptr, a_ptr, g_ptr, m_step_ptr, m_chunk_ptr, den_ptr, z_ptr,
    c_ptr, dz_ptr, dden_ptr,
    scale, S, NC, DQK, DV,
    L: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_QK: tl.constexpr, BLOCK_V: tl.constexpr,
    STABILIZED: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (query block, batch-head): ``G_t·N_t = dh_t·h_t`` summed as the forward
    pass sums ``N_t`` (inter-chunk term, then ``Σ_j W_tj G_t·v_j`` over the causal key blocks),
    then ``dden_t = -G_t·N_t / den_t`` and ``dz_t``."""
    pid_t = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    kc, qb, _, live, rows, offs_t = query_block(pid_t, bh, S, NC, L, BLOCK_L)
    state = bh * (NC + 1) + kc
    m_t = tl.load(m_step_ptr + offs_t)
    coef = tl.exp(tl.load(b_ptr + offs_t) + tl.load(m_chunk_ptr + state) - m_t) * scale
    inv_den = 1.0 / tl.load(den_ptr + offs_t)
    grad_dot_num = tl.zeros((BLOCK_L,), dtype=tl.float32)
    for v0 in range(0, DV, BLOCK_V):
        offs_v = v0 + tl.arange(0, BLOCK_V)
        mask_v = offs_v < DV
        inter = tl.zeros((BLOCK_L, BLOCK_V), dtype=tl.float32)
        for d0 in range(0, DQK, BLOCK_QK):
            offs_qk = d0 + tl.arange(0, BLOCK_QK)
            q = load_rows(q_ptr, rows, live, offs_qk, DQK)
            C = tl.load(
                c_ptr + state * DQK * DV + offs_qk[:, None] * DV + offs_v[None, :],
                mask=(offs_qk < DQK)[:, None] & mask_v[None, :],
                other=0.0,
            )
            inter += tl.dot(q, C.to(q.dtype), input_precision=PRECISION)
        dh = load_rows(dh_ptr, rows, live, offs_v, DV)
        grad_dot_num += tl.sum(inter * dh.to(tl.float32), axis=1)
    grad_dot_num = grad_dot_num * coef * inv_den
    g = tl.load(g_ptr + bh * NC + kc)
    for kb in range(qb + 1):
        keys = kc * L + kb * BLOCK_L + tl.arange(0, BLOCK_L)
        key_live = keys < S
        s = scores(
            q_ptr, k_ptr, rows, live, bh * S + keys, key_live, DQK, BLOCK_L, BLOCK_QK, PRECISION
        )
        w = s * _intra_weights(b_ptr, a_ptr, m_step_ptr, g, offs_t, bh * NC * L + keys, scale)
        dw = _dh_dot_v(
            dh_ptr, v_ptr, rows, live, bh * S + keys, key_live, inv_den, DV,
            BLOCK_L, BLOCK_V, PRECISION,
        )  # fmt: skip
        grad_dot_num += tl.sum(w * dw, axis=1)
    dden = -grad_dot_num * inv_den
    z = tl.load(z_ptr + offs_t)
    floor = tl.exp(-m_t) if STABILIZED else tl.full((BLOCK_L,), 1.0, dtype=tl.float32)
    tl.store(dz_ptr + offs_t, tl.where(tl.abs(z) > floor, tl.where(z > 0, dden, -dden), 0.0))
    tl.store(dden_ptr + offs_t, dden)


@triton.jit
def _dq_kernel(
    q_ptr, k_ptr, v_ptr, dh_ptr, b_ptr, a_ptr, g_ptr, m_step_ptr, m_chunk_ptr, den_ptr, dz_ptr,
    c_ptr, n_ptr, dq_ptr, q_dq_ptr,
    scale, S, NC, DQK, DV,
    L: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_QK: tl.constexpr, BLOCK_V: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (query block, DQK block, batch-head): ``dq_t = coef_t (C_{k-1} G_t +
    n_{k-1} dz_t) + Σ_{j <= t} dS_tj k_j`` over the causal key blocks, DV in blocks; stores ``dq``
    and the DQK block's part of ``Σ_d q_t dq_t`` at ``q_dq[bh, DQK block, t]``."""
    pid_t = tl.program_id(0)
    pid_qk = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    kc, qb, steps, live, rows, offs_t = query_block(pid_t, bh, S, NC, L, BLOCK_L)
    offs_qk = pid_qk * BLOCK_QK + tl.arange(0, BLOCK_QK)
    mask_qk = offs_qk < DQK
    state = bh * (NC + 1) + kc
    g = tl.load(g_ptr + bh * NC + kc)
    m_prev = tl.load(m_chunk_ptr + state)
    coef = tl.exp(tl.load(b_ptr + offs_t) + m_prev - tl.load(m_step_ptr + offs_t)) * scale
    inv_den = 1.0 / tl.load(den_ptr + offs_t)
    dz = tl.load(dz_ptr + offs_t)
    dq = tl.zeros((BLOCK_L, BLOCK_QK), dtype=tl.float32)
    for v0 in range(0, DV, BLOCK_V):
        offs_v = v0 + tl.arange(0, BLOCK_V)
        mask_v = offs_v < DV
        dh = load_rows(dh_ptr, rows, live, offs_v, DV)
        C = tl.load(
            c_ptr + state * DQK * DV + offs_qk[:, None] * DV + offs_v[None, :],
            mask=mask_qk[:, None] & mask_v[None, :],
            other=0.0,
        )
        dq += _dot_state(dh, tl.trans(C), PRECISION)
    n = tl.load(n_ptr + state * DQK + offs_qk, mask=mask_qk, other=0.0)
    dq = (dq * inv_den[:, None] + dz[:, None] * n[None, :]) * coef[:, None]
    for kb in range(qb + 1):
        keys = kc * L + kb * BLOCK_L + tl.arange(0, BLOCK_L)
        key_live = keys < S
        dw = _dh_dot_v(
            dh_ptr, v_ptr, rows, live, bh * S + keys, key_live, inv_den, DV,
            BLOCK_L, BLOCK_V, PRECISION,
        )  # fmt: skip
        dw += dz[:, None]
        ds = dw * _intra_weights(b_ptr, a_ptr, m_step_ptr, g, offs_t, bh * NC * L + keys, scale)
        k = load_rows(k_ptr, bh * S + keys, key_live, offs_qk, DQK)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    store_rows(dq_ptr, rows, live, offs_qk, DQK, dq)
    q = load_rows(q_ptr, rows, live, offs_qk, DQK).to(tl.float32)
    tl.store(q_dq_ptr + (bh * tl.num_programs(1) + pid_qk) * NC * L + steps, tl.sum(q * dq, 1))


@triton.jit
def _dk_kernel(
    q_ptr, k_ptr, v_ptr, dh_ptr, b_ptr, a_ptr, g_ptr, m_step_ptr, m_chunk_ptr, den_ptr, dz_ptr,
    dc_ptr, dn_ptr, dk_ptr, k_dk_ptr,
    scale, S, NC, DQK, DV,
    L: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_QK: tl.constexpr, BLOCK_V: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """One program per (key block, DQK block, batch-head): ``dk_j = exp(a_j - m_k) (dC_k v_j +
    dn_k) + Σ_{t >= j} dS_tj q_t`` over the causal query blocks, DV in blocks; stores ``dk`` and
    the DQK block's part of ``Σ_d k_j dk_j`` at ``k_dk[bh, DQK block, j]``."""
    pid_j = tl.program_id(0)
    pid_qk = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    kc = pid_j // (L // BLOCK_L)
    kb = pid_j % (L // BLOCK_L)
    keys = kc * L + kb * BLOCK_L + tl.arange(0, BLOCK_L)
    key_live = keys < S
    key_rows = bh * S + keys
    offs_j = bh * NC * L + keys
    offs_qk = pid_qk * BLOCK_QK + tl.arange(0, BLOCK_QK)
    mask_qk = offs_qk < DQK
    state = bh * (NC + 1) + kc + 1
    g = tl.load(g_ptr + bh * NC + kc)
    dk = tl.zeros((BLOCK_L, BLOCK_QK), dtype=tl.float32)
    for v0 in range(0, DV, BLOCK_V):
        offs_v = v0 + tl.arange(0, BLOCK_V)
        mask_v = offs_v < DV
        v = load_rows(v_ptr, key_rows, key_live, offs_v, DV)
        dC = tl.load(
            dc_ptr + state * DQK * DV + offs_qk[:, None] * DV + offs_v[None, :],
            mask=mask_qk[:, None] & mask_v[None, :],
            other=0.0,
        )
        dk += _dot_state(v, tl.trans(dC), PRECISION)
    dn = tl.load(dn_ptr + state * DQK + offs_qk, mask=mask_qk, other=0.0)
    w = tl.exp(tl.load(a_ptr + offs_j) - tl.load(m_chunk_ptr + state))
    dk = (dk + dn[None, :]) * w[:, None]
    for qb in range(kb, L // BLOCK_L):
        steps = kc * L + qb * BLOCK_L + tl.arange(0, BLOCK_L)
        live = steps < S
        offs_t = bh * NC * L + steps
        inv_den = 1.0 / tl.load(den_ptr + offs_t)
        dw = _dh_dot_v(
            dh_ptr, v_ptr, bh * S + steps, live, key_rows, key_live, inv_den, DV,
            BLOCK_L, BLOCK_V, PRECISION,
        )  # fmt: skip
        dw += tl.load(dz_ptr + offs_t)[:, None]
        ds = dw * _intra_weights(b_ptr, a_ptr, m_step_ptr, g, offs_t, offs_j, scale)
        q = load_rows(q_ptr, bh * S + steps, live, offs_qk, DQK)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    store_rows(dk_ptr, key_rows, key_live, offs_qk, DQK, dk)
    k = load_rows(k_ptr, key_rows, key_live, offs_qk, DQK).to(tl.float32)
    k_dk = tl.sum(k * dk, axis=1)
    tl.store(k_dk_ptr + (bh * tl.num_programs(1) + pid_qk) * NC * L + keys, k_dk)


@triton.jit
def _dv_kernel(
    q_ptr, k_ptr, dh_ptr, b_ptr, a_ptr, g_ptr, m_step_ptr, m_chunk_ptr, den_ptr,
    dc_ptr, dv_ptr,
    scale, S, NC, DQK, DV,
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
    keys = kc * L + kb * BLOCK_L + tl.arange(0, BLOCK_L)
    key_live = keys < S
    key_rows = bh * S + keys
    offs_j = bh * NC * L + keys
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_v = offs_v < DV
    state = bh * (NC + 1) + kc + 1
    g = tl.load(g_ptr + bh * NC + kc)
    dv = tl.zeros((BLOCK_L, BLOCK_V), dtype=tl.float32)
    for d0 in range(0, DQK, BLOCK_QK):
        offs_qk = d0 + tl.arange(0, BLOCK_QK)
        mask_qk = offs_qk < DQK
        k = load_rows(k_ptr, key_rows, key_live, offs_qk, DQK)
        dC = tl.load(
            dc_ptr + state * DQK * DV + offs_qk[:, None] * DV + offs_v[None, :],
            mask=mask_qk[:, None] & mask_v[None, :],
            other=0.0,
        )
        dv += _dot_state(k, dC, PRECISION)
    dv = dv * tl.exp(tl.load(a_ptr + offs_j) - tl.load(m_chunk_ptr + state))[:, None]
    for qb in range(kb, L // BLOCK_L):
        steps = kc * L + qb * BLOCK_L + tl.arange(0, BLOCK_L)
        live = steps < S
        offs_t = bh * NC * L + steps
        s = scores(
            q_ptr,
            k_ptr,
            bh * S + steps,
            live,
            key_rows,
            key_live,
            DQK,
            BLOCK_L,
            BLOCK_QK,
            PRECISION,
        )
        w = s * _intra_weights(b_ptr, a_ptr, m_step_ptr, g, offs_t, offs_j, scale)
        w = w * (1.0 / tl.load(den_ptr + offs_t))[:, None]  # W_tj / den_t: G_t = dh_t / den_t
        dh = load_rows(dh_ptr, bh * S + steps, live, offs_v, DV)
        dv += tl.dot(tl.trans(w.to(dh.dtype)), dh, input_precision=PRECISION)
    store_rows(dv_ptr, key_rows, key_live, offs_v, DV, dv)


def _meta(chunk_size: int, tiles: Tiles) -> dict:
    """Launch arguments shared by the level-2 kernels."""
    return {
        "L": chunk_size,
        "BLOCK_L": tiles.seq,
        "BLOCK_QK": tiles.qk,
        "BLOCK_V": tiles.v,
        "PRECISION": tiles.precision,
        **tiles.launch,
    }


def normalizer_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dh: torch.Tensor,
    gates: StepGates,
    normalizer: tuple[torch.Tensor, torch.Tensor],
    C: torch.Tensor,
    *,
    chunk_size: int,
    stabilized: bool,
    tiles: Tiles,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalizer's gradient ``dz`` and ``dden = -dh·h / den``, ``(BH, S_PAD)`` float32.

    Args:
        q: ``(BH, S, DQK)``; k likewise, v and dh ``(BH, S, DV)``.
        gates: ``b, a (BH, S_PAD)``, ``g (BH, NC)``, ``m_step (BH, S_PAD)``,
            ``m_chunk (BH, NC + 1)``.
        normalizer: the forward pass's ``den, z (BH, S_PAD)``.
        C: the recomputed states entering every chunk.
    """
    BH, S, DQK = q.shape
    b, a, g, m_step, m_chunk = gates
    NC = g.shape[-1]
    dz, dden = torch.empty_like(b), torch.empty_like(b)
    with device_guard(q):
        _normalizer_grad_kernel[(NC * (chunk_size // tiles.seq), BH)](
            q, k, v, dh, b, a, g, m_step, m_chunk, *normalizer, C, dz, dden,
            DQK**-0.5, S, NC, DQK, v.shape[-1], STABILIZED=stabilized, **_meta(chunk_size, tiles),
        )  # fmt: skip
    return dz, dden


def q_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dh: torch.Tensor,
    gates: StepGates,
    den: torch.Tensor,
    dz: torch.Tensor,
    states: tuple[torch.Tensor, torch.Tensor],
    dq: torch.Tensor,
    *,
    chunk_size: int,
    tiles: Tiles,
) -> torch.Tensor:
    """Write ``dq (BH, S, DQK)`` (the buffer ``dq``) in its dtype; return ``Σ_d q·dq
    (BH, S_PAD)`` float32.

    Args:
        q: ``(BH, S, DQK)``; k likewise, v and dh ``(BH, S, DV)``.
        gates: as in :func:`normalizer_backward`.
        den: the forward pass's denominator ``(BH, S_PAD)``.
        dz: the normalizer's gradient from :func:`normalizer_backward` (zeros without one).
        states: the recomputed ``C, n`` entering every chunk (read by this kernel last).
        dq: the output buffer.
    """
    BH, S, DQK = q.shape
    b, a, g, m_step, m_chunk = gates
    NC = g.shape[-1]
    qk_blocks = cdiv(DQK, tiles.qk)
    q_dq = torch.empty(BH, qk_blocks, NC * chunk_size, device=q.device, dtype=torch.float32)
    with device_guard(q):
        _dq_kernel[(NC * (chunk_size // tiles.seq), qk_blocks, BH)](
            q, k, v, dh, b, a, g, m_step, m_chunk, den, dz, *states, dq, q_dq,
            DQK**-0.5, S, NC, DQK, v.shape[-1], **_meta(chunk_size, tiles),
        )  # fmt: skip
    return q_dq.sum(1)


def chunk_states_backward(
    q: torch.Tensor,
    dh: torch.Tensor,
    gates: StepGates,
    den: torch.Tensor,
    dz: torch.Tensor,
    d_last: tuple[torch.Tensor, torch.Tensor],
    *,
    chunk_size: int,
    tiles: Tiles,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of every state: ``dC (BH, NC + 1, DQK, DV)``, ``dn (BH, NC + 1, DQK)``."""
    BH, S, DQK = q.shape
    DV = dh.shape[-1]
    b, _, g, m_step, m_chunk = gates
    NC = g.shape[-1]
    dC = torch.empty(BH, NC + 1, DQK, DV, device=q.device, dtype=torch.float32)
    dn = torch.empty(BH, NC + 1, DQK, device=q.device, dtype=torch.float32)
    grid = (cdiv(DQK, tiles.qk), cdiv(DV, tiles.v), BH)
    with device_guard(q):
        _chunk_states_bwd_kernel[grid](
            q, dh, b, g, m_step, m_chunk, den, dz, *d_last, dC, dn, DQK**-0.5, S, NC, DQK, DV,
            L=chunk_size, BLOCK_L=tiles.seq, BLOCK_QK=tiles.qk, BLOCK_V=tiles.v,
            PRECISION=tiles.precision, **tiles.launch,
        )  # fmt: skip
    return dC, dn


def kv_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dh: torch.Tensor,
    gates: StepGates,
    den: torch.Tensor,
    dz: torch.Tensor,
    d_states: tuple[torch.Tensor, torch.Tensor],
    grads: tuple[torch.Tensor, torch.Tensor],
    *,
    chunk_size: int,
    tiles: Tiles,
) -> torch.Tensor:
    """Write ``dk (BH, S, DQK)`` and ``dv (BH, S, DV)`` (the buffers ``grads``) in their dtype;
    return ``Σ_d k·dk (BH, S_PAD)`` float32.

    Args:
        q: ``(BH, S, DQK)``; k likewise, v and dh ``(BH, S, DV)``.
        gates: as in :func:`normalizer_backward`.
        den: the forward pass's denominator ``(BH, S_PAD)``.
        dz: the normalizer's gradient.
        d_states: ``dC, dn`` from :func:`chunk_states_backward`.
        grads: the output buffers ``dk, dv``.
    """
    BH, S, DQK = q.shape
    DV = v.shape[-1]
    b, a, g, m_step, m_chunk = gates
    NC = g.shape[-1]
    qk_blocks = cdiv(DQK, tiles.qk)
    k_dk = torch.empty(BH, qk_blocks, NC * chunk_size, device=q.device, dtype=torch.float32)
    blocks = NC * (chunk_size // tiles.seq)
    sizes = (DQK**-0.5, S, NC, DQK, DV)
    meta = _meta(chunk_size, tiles)
    dk, dv = grads
    with device_guard(q):
        _dk_kernel[(blocks, qk_blocks, BH)](
            q, k, v, dh, b, a, g, m_step, m_chunk, den, dz, *d_states, dk, k_dk, *sizes, **meta
        )
        _dv_kernel[(blocks, cdiv(DV, tiles.v), BH)](
            q, k, dh, b, a, g, m_step, m_chunk, den, d_states[0], dv, *sizes, **meta
        )
    return k_dk.sum(1)
