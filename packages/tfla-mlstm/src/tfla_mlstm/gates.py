"""Gate preprocessing of the chunkwise form, shared by the PyTorch chunkwise path and TFLA.

The sequence is padded to ``NC`` chunks of ``L`` steps: padded steps get forget gate 1
(``logσ(f) = 0``) and input gate 0 (``ĩ = -inf``), so they change neither the outputs nor the
last state. Inside chunk ``k``: ``b = cumsum(logσ(f))`` (chunk-local), ``g = b_L`` (the forget
decay across the chunk) and ``a = g - b + ĩ`` (the weight of step ``j`` in the state ``C_k``);
the intra-chunk log-weights are ``logD_tj = b_t - b_j + ĩ_j = b_t - g + a_j``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from kernels_common.triton_utils import cdiv
from tfla_mlstm.reference import upcast
from tfla_mlstm.variant import Variant


class ChunkGates(NamedTuple):
    """Float32 gate terms, ``(B, NH, NC, L)`` except ``g`` and ``a_max`` ``(B, NH, NC)``."""

    log_i: torch.Tensor  # ĩ, -inf on padded steps
    b: torch.Tensor  # chunk-local cumsum of logσ(f)
    a: torch.Tensor  # g - b + ĩ
    g: torch.Tensor  # b at the chunk's last step
    a_max: torch.Tensor  # max over the chunk of a


def pad_sequence(x: torch.Tensor, length: int, value: float = 0.0) -> torch.Tensor:
    """Pad dim 2 (the sequence) of ``(B, NH, S, ...)`` or ``(B, NH, S)`` to ``length``."""
    missing = length - x.shape[2]
    if missing == 0:
        return x
    pad = [0, 0] * (x.ndim - 3) + [0, missing]
    return F.pad(x, pad, value=value)


def padded_length(S: int, chunk_size: int) -> int:
    return cdiv(S, chunk_size) * chunk_size


def chunk_gates(i: torch.Tensor, f: torch.Tensor, variant: Variant, chunk_size: int) -> ChunkGates:
    """Chunk-local gate terms from the pre-activations ``i, f (B, NH, S)``."""
    B, NH, S = i.shape
    length = padded_length(S, chunk_size)
    log_i = pad_sequence(variant.log_input_gate(upcast(i)), length, -math.inf)
    log_f = pad_sequence(F.logsigmoid(upcast(f)), length, 0.0)
    log_i = log_i.view(B, NH, -1, chunk_size)
    b = log_f.view(B, NH, -1, chunk_size).cumsum(-1)
    g = b[..., -1]
    a = g[..., None] - b + log_i
    return ChunkGates(log_i, b, a, g, a.amax(-1))


def intra_chunk_max(gates: ChunkGates) -> torch.Tensor:
    """``max_{j <= t, same chunk} logD_tj = b_t + cummax_j(ĩ_j - b_j)``, ``(B, NH, NC, L)``."""
    return gates.b + torch.cummax(gates.log_i - gates.b, dim=-1).values


def step_stabilizer(gates: ChunkGates, chunk_m: torch.Tensor, variant: Variant) -> torch.Tensor:
    """``m_t = max(b_t + m_{k-1}, max_j logD_tj)`` (0 for the mLSTMsig), ``(B, NH, NC, L)``.

    ``chunk_m (B, NH, NC)`` is the stabilizer of the state entering each chunk. ``m_t`` equals the
    parallel form's row maximum ``max_j logD_tj``, so the chunkwise output is the parallel one.
    """
    if not variant.stabilized:
        return torch.zeros_like(gates.b)
    return torch.maximum(gates.b + chunk_m[..., None], intra_chunk_max(gates))
