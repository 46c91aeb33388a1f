"""Recurrent form: one step of the stabilized mLSTM / mLSTMsig update, and a loop over a sequence.

mLSTM step: ``m_t = max(logσ(f_t) + m_{t-1}, i_t)``, ``f' = exp(logσ(f_t) + m_{t-1} - m_t)``,
``i' = exp(i_t - m_t)``, ``C_t = f' C_{t-1} + i' k_t v_t^T``, ``n_t = f' n_{t-1} + i' k_t``,
``h_t = q̂_t^T C_t / (max(|q̂_t · n_t|, exp(-m_t)) + eps)`` with ``q̂ = q / sqrt(DQK)``.
mLSTMsig step: ``m = 0``, ``f' = σ(f_t)``, ``i' = σ(i_t)``, normalizer lower bound 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tfla_mlstm.reference import upcast
from tfla_mlstm.variant import Variant


def recurrent_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    variant: Variant,
    eps: float,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """One step, float32.

    Args:
        q, k: ``(B, NH, DQK)``; v: ``(B, NH, DV)``; i, f: ``(B, NH, 1)`` pre-activations.
        state: ``(C (B, NH, DQK, DV), n (B, NH, DQK), m (B, NH, 1))`` before the step.

    Returns:
        ``h (B, NH, DV)`` and the state after the step.
    """
    q, k, v, i, f = (upcast(x) for x in (q, k, v, i, f))
    C, n, m = (upcast(x) for x in state)
    log_f = F.logsigmoid(f)
    log_i = variant.log_input_gate(i)
    m_new = torch.maximum(log_f + m, log_i) if variant.stabilized else torch.zeros_like(m)
    decay = torch.exp(log_f + m - m_new)  # (B, NH, 1)
    gain = torch.exp(log_i - m_new)
    C = decay[..., None] * C + gain[..., None] * (k[..., :, None] * v[..., None, :])
    n = decay * n + gain * k
    q_scaled = q * q.shape[-1] ** -0.5
    numerator = (q_scaled[..., None, :] @ C).squeeze(-2)
    z = (q_scaled * n).sum(-1)
    h = variant.output(numerator, z, m_new.squeeze(-1), eps)
    return h, (C, n, m_new)


def recurrent_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    variant: Variant,
    eps: float,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """:func:`recurrent_step` over ``S`` steps: ``h (B, NH, S, DV)`` and the last state."""
    outputs = []
    for t in range(q.shape[-2]):
        h, state = recurrent_step(
            q[..., t, :], k[..., t, :], v[..., t, :], i[..., t, None], f[..., t, None],
            state, variant, eps,
        )  # fmt: skip
        outputs.append(h)
    return torch.stack(outputs, dim=-2), state
