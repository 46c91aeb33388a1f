"""Autograd of the TFLA kernels (imported only when a Triton backend runs).

Forward: gate terms in PyTorch (``gates.py``), the chunk states (level 1), the per-step
stabilizer, then the tiled outputs (level 2). Backward: the states are recomputed, ``dC`` runs in
reverse over chunks, then the parallel ``dQ``/``dK``/``dV`` kernels. The gate gradients follow from
those in PyTorch: for every log-weight ``F_t - F_j + ĩ_j`` the row ``t`` is linear in ``q_t`` and
the column ``j`` in ``k_j``, so ``dĩ_j = Σ_d k_j dk_j`` and ``dF_t = Σ_d (q_t dq_t - k_t dk_t)``,
``dlogσ(f)`` is the reverse cumulative sum of ``dF``. The stabilizer ``m`` enters the mLSTM output
only through ``eps`` (``∂h_t/∂m_t = -eps h_t / den_t``); that path is added through
``m_t = F_t + max(m0, cummax_j(ĩ_j - F_j))`` so the gradient is the one of the exact function.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from tfla_mlstm.gates import chunk_gates, pad_sequence, padded_length, step_stabilizer
from tfla_mlstm.kernels.backward import chunk_states_backward, qkv_backward
from tfla_mlstm.kernels.forward import chunk_output, chunk_states
from tfla_mlstm.kernels.tiles import Tiles
from tfla_mlstm.variant import Variant

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _flat(x: torch.Tensor, length: int) -> torch.Tensor:
    """``(B, NH, S, D)`` -> contiguous ``(B * NH, length, D)``, zero-padded."""
    B, NH, _, D = x.shape
    return pad_sequence(x, length).reshape(B * NH, length, D).contiguous()


def _per_head(x: torch.Tensor) -> torch.Tensor:
    """``(B, NH, ...)`` -> contiguous ``(B * NH, -1)``."""
    return x.reshape(x.shape[0] * x.shape[1], -1).contiguous()


def _forward_states(kf, vf, i, f, initial, variant: Variant, chunk_size: int, tiles: Tiles):
    """Gate terms, chunk states and the per-step stabilizer (run again by the backward pass)."""
    B, NH = i.shape[:2]
    gates = chunk_gates(i, f, variant, chunk_size)
    flat_gates = [_per_head(x) for x in (gates.b, gates.a, gates.g)]
    C, n, m_chunk = chunk_states(
        kf, vf, flat_gates[1], flat_gates[2], _per_head(gates.a_max),
        tuple(_per_head(x) for x in initial),
        chunk_size=chunk_size, stabilized=variant.stabilized, tiles=tiles,
    )  # fmt: skip
    m_step = step_stabilizer(gates, m_chunk.view(B, NH, -1)[..., :-1], variant)
    return gates, flat_gates, (C, n, m_chunk), m_step


class TFLAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q, k, v, i, f, C0, n0, m0, variant: Variant, eps: float, chunk_size):
        B, NH, S, DQK = q.shape
        DV = v.shape[-1]
        length = padded_length(S, chunk_size)
        tiles = Tiles.choose(chunk_size, DQK, DV, q.dtype)
        qf, kf, vf = (_flat(x, length) for x in (q, k, v))
        _, (b, a, g), states, m_step = _forward_states(
            kf, vf, i, f, (C0, n0, m0), variant, chunk_size, tiles
        )
        h, den, z = chunk_output(
            qf, kf, vf, b, a, g, _per_head(m_step), states,
            eps=eps, chunk_size=chunk_size, stabilized=variant.stabilized,
            normalize=variant.normalize, tiles=tiles,
        )  # fmt: skip
        C, n, m_chunk = states
        last = (C[:, -1].reshape(B, NH, DQK, DV), n[:, -1].reshape(B, NH, DQK))
        ctx.save_for_backward(qf, kf, vf, i, f, C0, n0, m0, h, den, z, *last)
        ctx.options = (
            variant,
            eps,
            chunk_size,
            Tiles.choose(chunk_size, DQK, DV, q.dtype, backward=True),
        )
        h = h.view(B, NH, length, DV)[:, :, :S].to(q.dtype, memory_format=torch.contiguous_format)
        return h, *last, m_chunk[:, -1].reshape(B, NH, 1)

    @staticmethod
    def backward(ctx: Any, dh, dC_last, dn_last, dm_last):
        qf, kf, vf, i, f, C0, n0, m0, h, den, z, C_last, n_last = ctx.saved_tensors
        variant, eps, chunk_size, tiles = ctx.options
        B, NH, S = i.shape
        _, length, DQK = qf.shape
        DV = vf.shape[-1]
        gates, (b, a, g), (C, n, m_chunk), m_step = _forward_states(
            kf, vf, i, f, (C0, n0, m0), variant, chunk_size, tiles
        )
        dhf = _flat(dh.to(vf.dtype), length)
        # per-step terms: G_t = dh_t / den_t, the normalizer's gradient dz_t, coef_t
        dden = -(dhf.float() * h.float()).sum(-1) / den
        lower = torch.exp(-_per_head(m_step)) if variant.stabilized else torch.ones_like(z)
        dz = torch.where(z.abs() > lower, dden * torch.sign(z), 0.0)
        if not variant.normalize:
            dz = torch.zeros_like(dz)
        m_prev = m_chunk.view(B, NH, -1)[..., :-1, None]
        coef = _per_head(torch.exp(gates.b + m_prev - m_step)) * DQK**-0.5
        decay = torch.exp(g + m_chunk[:, :-1] - m_chunk[:, 1:]).contiguous()
        d_last = (_per_head(dC_last.float()), _per_head(dn_last.float()))
        dC, dn = chunk_states_backward(
            qf, dhf, coef, 1.0 / den, dz, decay, d_last,
            dv=DV, chunk_size=chunk_size, tiles=tiles,
        )  # fmt: skip
        dq, dk, dv = qkv_backward(
            qf, kf, vf, dhf, (b, a, g, _per_head(m_step), m_chunk), (coef, 1.0 / den, dz),
            (C, n), (dC, dn), chunk_size=chunk_size, tiles=tiles,
        )  # fmt: skip

        def unflat(x: torch.Tensor) -> torch.Tensor:
            return x.view(B, NH, length, -1)[:, :, :S]

        dq, dk, dv = unflat(dq), unflat(dk), unflat(dv)
        dC0 = dC[:, 0].reshape(C0.shape)
        dn0 = dn[:, 0].reshape(n0.shape)
        last_term = (C_last * dC_last).sum((-2, -1)) + (n_last * dn_last).sum(-1)
        di, df, dm0 = _gate_gradients(
            (unflat(qf).float(), unflat(kf).float(), dq, dk), i, f, m0, variant,
            last_term, eps * unflat(dden[..., None])[..., 0], dm_last,
        )  # fmt: skip
        if dm0 is not None:
            dm0 = dm0 + ((C0 * dC0).sum((-2, -1)) + (n0 * dn0).sum(-1))[..., None]
        return (
            dq.to(qf.dtype), dk.to(kf.dtype), dv.to(vf.dtype), di.to(i.dtype), df.to(f.dtype),
            dC0, dn0, dm0, None, None, None,
        )  # fmt: skip


def _gate_gradients(qk_grads, i, f, m0, variant: Variant, last_term, dm_eps, dm_last):
    """``di, df`` (and ``dm0``'s stabilizer path for the mLSTM) from ``q, k, dq, dk``.

    ``last_term (B, NH)`` is ``<C_S, dC_S> + <n_S, dn_S>`` of the returned last state, whose
    log-weights are those of a row ``S`` without a query; ``dm_eps (B, NH, S)`` is
    ``∂L/∂m_t = eps dden_t``.
    """
    q, k, dq, dk = qk_grads
    dlog_i = (k * dk).sum(-1)
    dF = (q * dq).sum(-1) - dlog_i
    dF[..., -1] += last_term
    with torch.enable_grad():
        i_ = i.detach().float().requires_grad_()
        f_ = f.detach().float().requires_grad_()
        cum_log_f = F.logsigmoid(f_).cumsum(-1)
        log_i = variant.log_input_gate(i_)
        surrogate = (dF * cum_log_f).sum() + (dlog_i * log_i).sum()
        if not variant.stabilized:
            di, df = torch.autograd.grad(surrogate, [i_, f_])
            return di, df, None
        m0_ = m0.detach().float().requires_grad_()
        m = cum_log_f + torch.maximum(m0_, torch.cummax(log_i - cum_log_f, dim=-1).values)
        dm = dm_eps.clone()
        dm[..., -1] += dm_last[..., 0] - last_term
        surrogate = surrogate + (dm * m).sum()
        return torch.autograd.grad(surrogate, [i_, f_, m0_])


def tfla_chunkwise(q, k, v, i, f, state, variant: Variant, eps: float, chunk_size: int):
    """TFLA: ``h (B, NH, S, DV)`` in the inputs' dtype and the last state ``(C, n, m)``, with
    gradients for q, k, v, i, f and the initial state (see :func:`tfla_mlstm.mlstm_chunkwise`)."""
    if q.dtype not in KERNEL_DTYPES:
        raise TypeError(f"the Triton kernels take float32, float16 or bfloat16, got {q.dtype}")
    C0, n0, m0 = (x.float().contiguous() for x in state)
    h, C, n, m = TFLAFunction.apply(q, k, v, i, f, C0, n0, m0, variant, eps, chunk_size)
    return h, (C, n, m)
