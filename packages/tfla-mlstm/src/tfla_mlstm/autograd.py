"""Autograd of the TFLA kernels (imported only when a Triton backend runs).

Forward: gate terms in PyTorch (``gates.py``), the chunk states (level 1), the per-step
stabilizer, then the tiled outputs (level 2), written in the inputs' dtype. It saves the inputs,
the per-step denominator and normalizer ``(B·NH, S)`` and the returned last state, which is a copy:
the states of all chunks are freed when the forward pass returns.

Backward: the states are recomputed and read by the normalizer-gradient and ``dQ`` kernels only,
then freed before the reverse ``dC`` kernel and the ``dK``/``dV`` kernels run
(``kernels/backward.py``). The gate gradients follow from the row sums those kernels store: for
every log-weight ``F_t - F_j + ĩ_j`` the row ``t`` is linear in ``q_t`` and the column ``j`` in
``k_j``, so ``dĩ_j = Σ_d k_j dk_j`` and ``dF_t = Σ_d (q_t dq_t - k_t dk_t)``; ``dlogσ(f)`` is the
reverse cumulative sum of ``dF``, all ``(B, NH, S)``-sized PyTorch ops. The stabilizer ``m`` enters
the mLSTM output only through ``eps`` (``∂h_t/∂m_t = -eps h_t / den_t``); that path is added
through ``m_t = F_t + max(m0, cummax_j(ĩ_j - F_j))`` so the gradient is the one of the exact
function.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from tfla_mlstm.gates import chunk_gates, step_stabilizer
from tfla_mlstm.kernels.backward import (
    chunk_states_backward,
    kv_backward,
    normalizer_backward,
    q_backward,
)
from tfla_mlstm.kernels.forward import chunk_output, chunk_states
from tfla_mlstm.kernels.tiles import Tiles
from tfla_mlstm.variant import Variant

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _flat(x: torch.Tensor) -> torch.Tensor:
    """``(B, NH, S, D)`` -> contiguous ``(B * NH, S, D)`` (a view of a contiguous input)."""
    B, NH, S, D = x.shape
    return x.reshape(B * NH, S, D).contiguous()


def _per_head(x: torch.Tensor) -> torch.Tensor:
    """``(B, NH, ...)`` -> contiguous ``(B * NH, -1)``."""
    return x.reshape(x.shape[0] * x.shape[1], -1).contiguous()


def _forward_states(kf, vf, i, f, initial, variant: Variant, chunk_size: int, tiles: Tiles):
    """Step gate terms ``b, a, g, m_step, m_chunk`` flattened per head, and the chunk states
    ``C, n`` (run again by the backward pass)."""
    B, NH = i.shape[:2]
    gates = chunk_gates(i, f, variant, chunk_size)
    b, a, g = (_per_head(x) for x in (gates.b, gates.a, gates.g))
    C, n, m_chunk = chunk_states(
        kf, vf, a, g, _per_head(gates.a_max), tuple(_per_head(x) for x in initial),
        chunk_size=chunk_size, stabilized=variant.stabilized, tiles=tiles,
    )  # fmt: skip
    m_step = step_stabilizer(gates, m_chunk.view(B, NH, -1)[..., :-1], variant)
    return (b, a, g, _per_head(m_step), m_chunk), (C, n)


class TFLAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q, k, v, i, f, C0, n0, m0, variant: Variant, eps: float, chunk_size):
        B, NH, S, DQK = q.shape
        DV = v.shape[-1]
        layout = functools.partial(Tiles.choose, chunk_size, DQK, DV, q.dtype)
        state_tiles = layout(kernel="states")
        qf, kf, vf = (_flat(x) for x in (q, k, v))
        step_gates, states = _forward_states(
            kf, vf, i, f, (C0, n0, m0), variant, chunk_size, state_tiles
        )
        m_chunk = step_gates[-1]
        h = torch.empty(B, NH, S, DV, device=q.device, dtype=q.dtype)
        den, z = chunk_output(
            qf, kf, vf, step_gates[:-1], (*states, m_chunk), h.view(B * NH, S, DV),
            eps=eps, chunk_size=chunk_size, stabilized=variant.stabilized,
            normalize=variant.normalize, tiles=layout(kernel="output"),
        )  # fmt: skip
        # copies: a view would keep the states of every chunk alive as long as the last one
        C, n = states
        last = (
            C[:, -1].reshape(B, NH, DQK, DV).clone(),
            n[:, -1].reshape(B, NH, DQK).clone(),
            m_chunk[:, -1].reshape(B, NH, 1).clone(),
        )
        ctx.save_for_backward(q, k, v, i, f, C0, n0, m0, den, z, *last[:2])
        ctx.options = (variant, eps, chunk_size, state_tiles, layout(kernel="gradients"))
        return h, *last

    @staticmethod
    def backward(ctx: Any, dh, dC_last, dn_last, dm_last):
        q, k, v, i, f, C0, n0, m0, den, z, C_last, n_last = ctx.saved_tensors
        variant, eps, chunk_size, state_tiles, tiles = ctx.options
        B, NH, S, DQK = q.shape
        DV = v.shape[-1]
        qf, kf, vf = (_flat(x) for x in (q, k, v))
        # the forward pass's states exactly: the same kernel with the same layout
        step_gates, states = _forward_states(
            kf, vf, i, f, (C0, n0, m0), variant, chunk_size, state_tiles
        )
        dhf = _flat(dh)
        grads = [torch.empty(x.shape, device=x.device, dtype=x.dtype) for x in (q, k, v)]
        options = {"chunk_size": chunk_size, "tiles": tiles}
        if variant.normalize:
            dz, dden = normalizer_backward(
                qf, kf, vf, dhf, step_gates, (den, z), states[0],
                stabilized=variant.stabilized, **options,
            )  # fmt: skip
        else:
            dz, dden = torch.zeros_like(den), None
        q_dq = q_backward(
            qf, kf, vf, dhf, step_gates, den, dz, states, grads[0].view(B * NH, S, DQK), **options
        )
        del states  # freed before the dC kernel allocates the states' gradients
        d_last = (_per_head(dC_last), _per_head(dn_last))
        dC, dn = chunk_states_backward(
            qf, dhf, step_gates, den, dz, d_last, chunk_size=chunk_size, tiles=state_tiles
        )
        k_dk = kv_backward(
            qf, kf, vf, dhf, step_gates, den, dz, (dC, dn),
            (grads[1].view(B * NH, S, DQK), grads[2].view(B * NH, S, DV)), **options,
        )  # fmt: skip

        def per_step(x: torch.Tensor) -> torch.Tensor:
            return x.view(B, NH, -1)[..., :S]

        last_term = (C_last * dC_last).sum((-2, -1)) + (n_last * dn_last).sum(-1)
        dm_eps = eps * per_step(dden) if variant.stabilized else None
        di, df, dm0_gates = _gate_gradients(
            per_step(q_dq), per_step(k_dk), i, f, m0, variant, last_term, dm_eps, dm_last
        )
        dC0 = dn0 = dm0 = None
        if any(ctx.needs_input_grad[5:8]):
            dC0 = dC[:, 0].reshape(C0.shape).clone()
            dn0 = dn[:, 0].reshape(n0.shape).clone()
            if dm0_gates is not None:
                dm0 = dm0_gates + ((C0 * dC0).sum((-2, -1)) + (n0 * dn0).sum(-1))[..., None]
        return (*grads, di.to(i.dtype), df.to(f.dtype), dC0, dn0, dm0, None, None, None)


def _gate_gradients(q_dq, k_dk, i, f, m0, variant: Variant, last_term, dm_eps, dm_last):
    """``di, df`` (and ``dm0``'s stabilizer path for the mLSTM) from the row sums
    ``q_dq = Σ_d q·dq`` and ``k_dk = Σ_d k·dk``, all ``(B, NH, S)`` float32.

    ``last_term (B, NH)`` is ``<C_S, dC_S> + <n_S, dn_S>`` of the returned last state, whose
    log-weights are those of a row ``S`` without a query; ``dm_eps (B, NH, S)`` is
    ``∂L/∂m_t = eps dden_t`` (``None`` for the mLSTMsig, which has no stabilizer).
    """
    dF = q_dq - k_dk
    dF[..., -1] += last_term
    with torch.enable_grad():
        i_ = i.detach().float().requires_grad_()
        f_ = f.detach().float().requires_grad_()
        cum_log_f = F.logsigmoid(f_).cumsum(-1)
        log_i = variant.log_input_gate(i_)
        surrogate = (dF * cum_log_f).sum() + (k_dk * log_i).sum()
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
