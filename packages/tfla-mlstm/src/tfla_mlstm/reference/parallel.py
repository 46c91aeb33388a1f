"""Quadratic (parallel) form of the mLSTM / mLSTMsig: the whole ``S x S`` gate matrix at once.

For a causal row ``t`` and column ``j <= t``: ``logD_tj = Σ_{l=j+1..t} logσ(f_l) + ĩ_j`` with
``ĩ = i`` (mLSTM) or ``logσ(i)`` (mLSTMsig); an initial state ``(C0, n0, m0)`` is one more column
with log-weight ``F_t + m0``. The forget sums are formed as a masked cumulative sum (no
``F_t - F_j`` cancellation). ``O(S^2)`` memory: a reference, not a training path.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tfla_mlstm.reference import upcast
from tfla_mlstm.variant import Variant


def parallel_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i: torch.Tensor,
    f: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    variant: Variant,
    eps: float,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Outputs and last state, all float32.

    Args:
        q, k: ``(B, NH, S, DQK)``; v: ``(B, NH, S, DV)``; i, f: ``(B, NH, S)`` pre-activations.
        state: ``(C0 (B, NH, DQK, DV), n0 (B, NH, DQK), m0 (B, NH, 1))``; ``m0 = -inf`` means
            no initial state; for the mLSTMsig ``m0`` is 0.
        variant: which cell.
        eps: added to the denominator.

    Returns:
        ``h (B, NH, S, DV)`` and the state after the last step ``(C, n, m)``.
    """
    q, k, v, i, f = (upcast(x) for x in (q, k, v, i, f))
    C0, n0, m0 = (upcast(x) for x in state)
    S, DQK = q.shape[-2], q.shape[-1]
    log_f = F.logsigmoid(f)
    log_i = variant.log_input_gate(i)
    causal = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
    # forget_sum[t, j] = Σ_{j < l <= t} logσ(f_l): cumsum over t of a strictly lower triangle
    forget_sum = (log_f[..., :, None].expand(*log_f.shape, S) * causal.tril(-1)).cumsum(-2)
    log_d = torch.where(causal, forget_sum + log_i[..., None, :], -math.inf)  # (B, NH, S, S)
    log_d0 = log_f.cumsum(-1) + m0  # (B, NH, S): weight of the initial state
    stabilized = variant.stabilized
    m = torch.maximum(log_d.amax(-1), log_d0) if stabilized else torch.zeros_like(log_d0)
    weights = torch.exp(log_d - m[..., None])
    weights0 = torch.exp(log_d0 - m)
    q_scaled = q * DQK**-0.5
    scores = (q_scaled @ k.transpose(-2, -1)) * weights
    numerator = scores @ v + weights0[..., None] * (q_scaled @ C0)
    z = scores.sum(-1) + weights0 * (q_scaled @ n0[..., None]).squeeze(-1)
    h = variant.output(numerator, z, m, eps)
    # the last state: the row of the last step, applied to k v^T instead of q
    last = weights[..., -1, :]  # (B, NH, S)
    C = (k * last[..., None]).transpose(-2, -1) @ v + weights0[..., -1, None, None] * C0
    n = (k * last[..., None]).sum(-2) + weights0[..., -1, None] * n0
    return h, (C, n, m[..., -1:])
