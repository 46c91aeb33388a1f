"""TFLA forward: the chunk-state kernel (level 1) and the tiled intra-chunk output kernel (level 2).

Tensors are flattened over batch and heads (``BH``), all contiguous: q, k ``(BH, S, DQK)``, v and
h ``(BH, S, DV)`` unpadded (rows past ``S`` load as zeros and are never stored), per-step gate
terms ``(BH, S_PAD)`` float32 padded to ``S_PAD = NC * L`` steps, per-chunk terms ``(BH, NC)``,
states ``(BH, NC + 1, ...)`` float32 where state ``s`` is the one after ``s`` chunks (state 0 the
initial one). Arithmetic in float32; ``tl.dot`` takes the inputs' dtype and accumulates in
float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels_common.triton_utils import cdiv, device_guard
from tfla_mlstm.kernels.tiles import Tiles


@triton.jit
def query_block(pid_t, bh, S, NC, L: tl.constexpr, BLOCK_L: tl.constexpr):
    """The query block of program ``pid_t`` of batch-head ``bh``: its chunk ``kc``, its block
    ``qb`` in the chunk, its ``steps``, which of them are in the sequence (``live``), their rows
    in the unpadded ``(B·NH·S, D)`` tensors and their offsets in the per-step ``(B·NH, NC·L)``
    ones."""
    kc = pid_t // (L // BLOCK_L)
    qb = pid_t % (L // BLOCK_L)
    steps = kc * L + qb * BLOCK_L + tl.arange(0, BLOCK_L)
    return kc, qb, steps, steps < S, bh * S + steps, bh * NC * L + steps


@triton.jit
def load_rows(ptr, rows, live, cols, n_cols):
    """Tile ``ptr[rows, cols]`` of a row-major matrix with ``n_cols`` columns: 0 on the rows that
    are not ``live`` (steps past the sequence's end) and past the last column."""
    return tl.load(
        ptr + rows[:, None] * n_cols + cols[None, :],
        mask=live[:, None] & (cols < n_cols)[None, :],
        other=0.0,
    )


@triton.jit
def scores(q_ptr, k_ptr, q_rows, q_live, k_rows, k_live, DQK, BLOCK_L: tl.constexpr,
           BLOCK_QK: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """``q kᵀ`` of a block of query rows and a block of key rows, float32, over DQK in blocks
    (the backward pass's ``dh vᵀ`` too, over DV)."""
    s = tl.zeros((BLOCK_L, BLOCK_L), dtype=tl.float32)
    for d0 in range(0, DQK, BLOCK_QK):
        offs_qk = d0 + tl.arange(0, BLOCK_QK)
        q = load_rows(q_ptr, q_rows, q_live, offs_qk, DQK)
        k = load_rows(k_ptr, k_rows, k_live, offs_qk, DQK)
        s += tl.dot(q, tl.trans(k), input_precision=PRECISION)
    return s


@triton.jit
def store_rows(ptr, rows, live, cols, n_cols, x):
    """Store the float32 tile ``x`` into ``ptr[rows, cols]`` in ``ptr``'s dtype, live rows only."""
    tl.store(
        ptr + rows[:, None] * n_cols + cols[None, :],
        x.to(ptr.dtype.element_ty),
        mask=live[:, None] & (cols < n_cols)[None, :],
    )


@triton.jit
def _chunk_states_kernel(
    k_ptr, v_ptr, a_ptr, g_ptr, a_max_ptr, c0_ptr, n0_ptr, m0_ptr, c_ptr, n_ptr, m_ptr,
    S, NC, DQK, DV,
    L: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_QK: tl.constexpr, BLOCK_V: tl.constexpr,
    STABILIZED: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Level 1, one program per (DQK block, DV block, batch-head), a loop over the chunks:
    ``m_k = max(g_k + m_{k-1}, max a)``, ``C_k = exp(g_k + m_{k-1} - m_k) C_{k-1} +
    (K ⊙ exp(a - m_k))^T V`` and the same for ``n`` (DV block 0 stores it)."""
    pid_qk = tl.program_id(0)
    pid_v = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    offs_qk = pid_qk * BLOCK_QK + tl.arange(0, BLOCK_QK)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_qk = offs_qk < DQK
    mask_v = offs_v < DV
    mask_c = mask_qk[:, None] & mask_v[None, :]
    tile_c = offs_qk[:, None] * DV + offs_v[None, :]
    C = tl.load(c0_ptr + bh * DQK * DV + tile_c, mask=mask_c, other=0.0)
    n = tl.load(n0_ptr + bh * DQK + offs_qk, mask=mask_qk, other=0.0)
    m = tl.load(m0_ptr + bh)
    for kc in range(NC):
        state = bh * (NC + 1) + kc
        tl.store(c_ptr + state * DQK * DV + tile_c, C, mask=mask_c)
        tl.store(n_ptr + state * DQK + offs_qk, n, mask=mask_qk & (pid_v == 0))
        tl.store(m_ptr + state, m, mask=(pid_v == 0) & (pid_qk == 0))
        g = tl.load(g_ptr + bh * NC + kc)
        m_next = m
        if STABILIZED:
            m_next = tl.maximum(g + m, tl.load(a_max_ptr + bh * NC + kc))
        decay = tl.exp(g + m - m_next)
        C = C * decay
        n = n * decay
        for l0 in range(0, L, BLOCK_L):
            steps = kc * L + l0 + tl.arange(0, BLOCK_L)
            live = steps < S
            w = tl.exp(tl.load(a_ptr + bh * NC * L + steps) - m_next)
            k = load_rows(k_ptr, bh * S + steps, live, offs_qk, DQK)
            v = load_rows(v_ptr, bh * S + steps, live, offs_v, DV)
            k_weighted = k.to(tl.float32) * w[:, None]
            C += tl.dot(tl.trans(k_weighted.to(v.dtype)), v, input_precision=PRECISION)
            n += tl.sum(k_weighted, axis=0)
        m = m_next
    state = bh * (NC + 1) + NC
    tl.store(c_ptr + state * DQK * DV + tile_c, C, mask=mask_c)
    tl.store(n_ptr + state * DQK + offs_qk, n, mask=mask_qk & (pid_v == 0))
    tl.store(m_ptr + state, m, mask=(pid_v == 0) & (pid_qk == 0))


@triton.jit
def _chunk_output_kernel(
    q_ptr, k_ptr, v_ptr, b_ptr, a_ptr, g_ptr, m_step_ptr, m_chunk_ptr, c_ptr, n_ptr,
    h_ptr, den_ptr, z_ptr,
    scale, eps, S, NC, DQK, DV,
    L: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_QK: tl.constexpr, BLOCK_V: tl.constexpr,
    STABILIZED: tl.constexpr, NORMALIZE: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Level 2, one program per (query block of a chunk, DV block, batch-head): the inter-chunk
    term ``exp(b_t + m_{k-1} - m_t) q̂_t^T C_{k-1}`` plus a loop over the causal key blocks of the
    chunk, each a loop over DQK blocks for ``q̂ k^T``; then ``h = N / den``, stored in h's dtype."""
    pid_t = tl.program_id(0)
    pid_v = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    kc, qb, _, live, rows, offs_t = query_block(pid_t, bh, S, NC, L, BLOCK_L)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_v = offs_v < DV
    state = bh * (NC + 1) + kc
    b_t = tl.load(b_ptr + offs_t)
    m_t = tl.load(m_step_ptr + offs_t)
    g = tl.load(g_ptr + bh * NC + kc)
    inter = tl.exp(b_t + tl.load(m_chunk_ptr + state) - m_t) * scale
    acc = tl.zeros((BLOCK_L, BLOCK_V), dtype=tl.float32)
    z = tl.zeros((BLOCK_L,), dtype=tl.float32)
    for d0 in range(0, DQK, BLOCK_QK):
        offs_qk = d0 + tl.arange(0, BLOCK_QK)
        mask_qk = offs_qk < DQK
        q = load_rows(q_ptr, rows, live, offs_qk, DQK)
        C = tl.load(
            c_ptr + state * DQK * DV + offs_qk[:, None] * DV + offs_v[None, :],
            mask=mask_qk[:, None] & mask_v[None, :],
            other=0.0,
        )
        n = tl.load(n_ptr + state * DQK + offs_qk, mask=mask_qk, other=0.0)
        acc += tl.dot(q, C.to(q.dtype), input_precision=PRECISION)
        z += tl.sum(q.to(tl.float32) * n[None, :], axis=1)
    acc = acc * inter[:, None]
    z = z * inter
    for kb in range(qb + 1):
        keys = kc * L + kb * BLOCK_L + tl.arange(0, BLOCK_L)
        key_live = keys < S
        offs_j = bh * NC * L + keys
        s = scores(
            q_ptr, k_ptr, rows, live, bh * S + keys, key_live, DQK, BLOCK_L, BLOCK_QK, PRECISION
        )
        log_d = b_t[:, None] - g + tl.load(a_ptr + offs_j)[None, :] - m_t[:, None]
        # masked before exp: above the diagonal log_d is large and positive (b falls with j)
        log_d = tl.where(offs_t[:, None] >= offs_j[None, :], log_d, float("-inf"))
        w = tl.exp(log_d) * s * scale
        z += tl.sum(w, axis=1)
        v = load_rows(v_ptr, bh * S + keys, key_live, offs_v, DV)
        acc += tl.dot(w.to(v.dtype), v, input_precision=PRECISION)
    if STABILIZED:
        den = tl.maximum(tl.abs(z), tl.exp(-m_t)) + eps
    elif NORMALIZE:
        den = tl.maximum(tl.abs(z), 1.0) + eps
    else:
        den = tl.full((BLOCK_L,), 1.0, dtype=tl.float32)
    store_rows(h_ptr, rows, live, offs_v, DV, acc / den[:, None])
    tl.store(den_ptr + offs_t, den, mask=pid_v == 0)
    tl.store(z_ptr + offs_t, z, mask=pid_v == 0)


def chunk_states(
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    g: torch.Tensor,
    a_max: torch.Tensor,
    initial: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    *,
    chunk_size: int,
    stabilized: bool,
    tiles: Tiles,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """States entering every chunk and the last one: ``C (BH, NC + 1, DQK, DV)``,
    ``n (BH, NC + 1, DQK)``, ``m (BH, NC + 1)``, float32."""
    BH, S, DQK = k.shape
    DV = v.shape[-1]
    NC = g.shape[-1]
    C = torch.empty(BH, NC + 1, DQK, DV, device=k.device, dtype=torch.float32)
    n = torch.empty(BH, NC + 1, DQK, device=k.device, dtype=torch.float32)
    m = torch.empty(BH, NC + 1, device=k.device, dtype=torch.float32)
    grid = (cdiv(DQK, tiles.qk), cdiv(DV, tiles.v), BH)
    with device_guard(k):
        _chunk_states_kernel[grid](
            k, v, a, g, a_max, *initial, C, n, m, S, NC, DQK, DV,
            L=chunk_size, BLOCK_L=tiles.seq, BLOCK_QK=tiles.qk, BLOCK_V=tiles.v,
            STABILIZED=stabilized, PRECISION=tiles.precision, **tiles.launch,
        )  # fmt: skip
    return C, n, m


def chunk_output(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    states: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    h: torch.Tensor,
    *,
    eps: float,
    chunk_size: int,
    stabilized: bool,
    normalize: bool,
    tiles: Tiles,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write ``h (BH, S, DV)`` in h's own dtype (no float32 copy of the output exists); return
    the denominator and the normalizer ``z``, ``(BH, S_PAD)`` float32, which the backward pass
    reads (its normalizer gradient needs no ``h``, see ``backward.py``).

    Args:
        gates: ``b, a (BH, S_PAD)``, ``g (BH, NC)``, ``m_step (BH, S_PAD)``.
        states: ``C, n, m`` entering every chunk, from :func:`chunk_states`.
        h: the output buffer, ``(BH, S, DV)`` contiguous.
    """
    BH, S, DQK = q.shape
    DV = v.shape[-1]
    b, a, g, m_step = gates
    NC = g.shape[-1]
    C, n, m_chunk = states
    den = torch.empty(BH, NC * chunk_size, device=q.device, dtype=torch.float32)
    z = torch.empty_like(den)
    grid = (NC * (chunk_size // tiles.seq), cdiv(DV, tiles.v), BH)
    with device_guard(q):
        _chunk_output_kernel[grid](
            q, k, v, b, a, g, m_step, m_chunk, C, n, h, den, z,
            DQK**-0.5, eps, S, NC, DQK, DV,
            L=chunk_size, BLOCK_L=tiles.seq, BLOCK_QK=tiles.qk, BLOCK_V=tiles.v,
            STABILIZED=stabilized, NORMALIZE=normalize, PRECISION=tiles.precision,
            **tiles.launch,
        )  # fmt: skip
    return den, z
