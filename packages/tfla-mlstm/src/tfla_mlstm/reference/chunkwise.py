"""Chunkwise form in PyTorch: linear memory in ``S``, differentiable by autograd.

Level 1: the states ``C_k, n_k, m_k`` at every chunk boundary, by a scan over chunks
(``C_k = exp(g_k + m_{k-1} - m_k) C_{k-1} + (K_k ⊙ exp(a - m_k))^T V_k``, the per-chunk products
computed for all chunks in one batched matmul). Level 2: each chunk's outputs from the state
entering it plus the causal intra-chunk term, with the shared stabilizer ``m_t``. This is the CPU
training path; TFLA computes the same quantities with tiled Triton kernels.
"""

from __future__ import annotations

import torch

from tfla_mlstm.gates import chunk_gates, pad_sequence, padded_length, step_stabilizer
from tfla_mlstm.reference import upcast
from tfla_mlstm.variant import Variant


def chunkwise_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    variant: Variant,
    eps: float,
    chunk_size: int,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Outputs and last state, float32; same arguments as the parallel reference plus the chunk
    size (any ``S >= 1``: the sequence is padded to a multiple of ``chunk_size``).

    Returns:
        ``h (B, NH, S, DV)`` and ``(C (B, NH, DQK, DV), n (B, NH, DQK), m (B, NH, 1))``.
    """
    B, NH, S, DQK = q.shape
    DV = v.shape[-1]
    L = chunk_size
    length = padded_length(S, L)
    q, k, v = (pad_sequence(upcast(x), length).view(B, NH, -1, L, x.shape[-1]) for x in (q, k, v))
    gates = chunk_gates(i, f, variant, L)
    C, n, m = (upcast(x) for x in state)
    m = m.squeeze(-1)

    # level 1: states entering every chunk
    chunk_m = []
    for k_idx in range(gates.g.shape[-1]):
        chunk_m.append(m)
        if variant.stabilized:
            m = torch.maximum(gates.g[..., k_idx] + m, gates.a_max[..., k_idx])
    chunk_m.append(m)
    chunk_m = torch.stack(chunk_m, dim=-1)  # (B, NH, NC + 1)
    decay = torch.exp(gates.g + chunk_m[..., :-1] - chunk_m[..., 1:])  # (B, NH, NC)
    k_weighted = k * torch.exp(gates.a - chunk_m[..., 1:, None])[..., None]
    updates_C = k_weighted.transpose(-2, -1) @ v  # (B, NH, NC, DQK, DV)
    updates_n = k_weighted.sum(-2)  # (B, NH, NC, DQK)
    states_C, states_n = [], []
    for k_idx in range(decay.shape[-1]):
        states_C.append(C)
        states_n.append(n)
        C = decay[..., k_idx, None, None] * C + updates_C[..., k_idx, :, :]
        n = decay[..., k_idx, None] * n + updates_n[..., k_idx, :]
    states_C = torch.stack(states_C, dim=2)  # (B, NH, NC, DQK, DV)
    states_n = torch.stack(states_n, dim=2)

    # level 2: outputs of every chunk
    m_t = step_stabilizer(gates, chunk_m[..., :-1], variant)  # (B, NH, NC, L)
    causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    log_d = gates.b[..., :, None] - gates.g[..., None, None] + gates.a[..., None, :]
    weights = torch.exp(torch.where(causal, log_d, -torch.inf) - m_t[..., None])
    q_scaled = q * DQK**-0.5
    scores = (q_scaled @ k.transpose(-2, -1)) * weights  # (B, NH, NC, L, L)
    q_inter = q_scaled * torch.exp(gates.b + chunk_m[..., :-1, None] - m_t)[..., None]
    numerator = q_inter @ states_C + scores @ v
    z = (q_inter * states_n[..., None, :]).sum(-1) + scores.sum(-1)
    h = variant.output(numerator, z, m_t, eps).reshape(B, NH, length, DV)[:, :, :S]
    return h, (C, n, m[..., None])
