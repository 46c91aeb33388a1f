"""xLSTM building blocks: the mLSTM layer (mLSTM or mLSTMsig cell) and a pre-norm residual block.

Layout follows the xLSTM (large) mLSTM layer: per-head projections to q, k (``qk_dim``),
v (``v_dim``), scalar input and forget gates per head (soft-capped pre-activations), a sigmoid
output gate, a per-head RMS norm of the cell output, and an output projection. The block is
``x + mLSTM(norm(x))`` followed by ``x + SwiGLU(norm(x))``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from tfla_mlstm.ops import mlstm_chunkwise, mlstm_step, mlstmsig_chunkwise, mlstmsig_step
from tfla_mlstm.validation import check_chunk_size

CELLS = ("mlstm", "mlstmsig")


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap * tanh(x / cap)`` (identity for ``cap=None``): keeps gate pre-activations bounded."""
    return x if cap is None else cap * torch.tanh(x / cap)


class mLSTMLayer(nn.Module):
    """Multi-head mLSTM layer on ``(B, S, d_model)`` sequences or ``(B, d_model)`` steps.

    Args:
        d_model: model width.
        num_heads: heads ``NH``; ``qk_dim`` and ``v_dim`` are the per-head sizes.
        cell: ``"mlstm"`` (exponential input gate) or ``"mlstmsig"`` (sigmoid input gate).
        chunk_size: chunk size of the chunkwise kernels (a power of two >= 16), or ``None`` for
            :func:`tfla_mlstm.default_chunk_size` of each call's length.
        gate_soft_cap: soft cap of the gate pre-activations (``None``: off).
        backend: kernel backend passed to the chunkwise op (``None``: automatic).

    Example:
        >>> layer = mLSTMLayer(32, num_heads=2, qk_dim=8, v_dim=16, backend="reference")
        >>> y, state = layer(torch.randn(2, 10, 32))
        >>> y.shape, state.C.shape
        (torch.Size([2, 10, 32]), torch.Size([2, 2, 8, 16]))
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        qk_dim: int,
        v_dim: int,
        *,
        cell: str = "mlstm",
        chunk_size: int | None = 64,
        gate_soft_cap: float | None = 15.0,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        if cell not in CELLS:
            raise ValueError(f"cell must be one of {CELLS}, got {cell!r}")
        if chunk_size is not None:
            check_chunk_size(chunk_size)
        self.num_heads, self.qk_dim, self.v_dim = num_heads, qk_dim, v_dim
        self.cell, self.chunk_size, self.backend = cell, chunk_size, backend
        self.gate_soft_cap = gate_soft_cap
        self.qkv = nn.Linear(d_model, num_heads * (2 * qk_dim + v_dim), bias=False)
        self.gates = nn.Linear(d_model, 2 * num_heads)  # input and forget gate per head
        self.output_gate = nn.Linear(d_model, num_heads * v_dim, bias=False)
        self.norm_weight = nn.Parameter(torch.ones(num_heads * v_dim))
        self.out = nn.Linear(num_heads * v_dim, d_model, bias=False)
        with torch.no_grad():  # forget gates start remembering, at spread-out time scales
            self.gates.bias[:num_heads].fill_(-3.0 if cell == "mlstm" else 0.0)
            self.gates.bias[num_heads:].copy_(torch.linspace(3.0, 6.0, num_heads))

    def _project(self, x: torch.Tensor):
        """q, k ``(..., NH, qk)``, v ``(..., NH, v)``, i, f ``(..., NH)`` from ``x (..., D)``."""
        NH = self.num_heads
        q, k, v = self.qkv(x).split([NH * self.qk_dim, NH * self.qk_dim, NH * self.v_dim], dim=-1)
        i, f = soft_cap(self.gates(x), self.gate_soft_cap).chunk(2, dim=-1)
        heads = x.shape[:-1]
        q, k = q.view(*heads, NH, self.qk_dim), k.view(*heads, NH, self.qk_dim)
        return q, k, v.view(*heads, NH, self.v_dim), i, f

    def _finish(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Per-head RMS norm of ``h (..., NH, v)``, output gate, projection."""
        h = F.rms_norm(h.float(), (self.v_dim,)).to(x.dtype).flatten(-2) * self.norm_weight
        return self.out(h * torch.sigmoid(self.output_gate(x)))

    def forward(
        self, x: torch.Tensor, state: Sequence[torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """``x (B, S, d_model)`` -> ``(y (B, S, d_model), last state)``."""
        q, k, v, i, f = self._project(x)
        op = mlstm_chunkwise if self.cell == "mlstm" else mlstmsig_chunkwise
        h, last = op(
            *(t.transpose(1, 2) for t in (q, k, v, i, f)),
            chunk_size=self.chunk_size,
            initial_state=state,
            return_last_state=True,
            backend=self.backend,
        )
        return self._finish(x, h.transpose(1, 2)), last

    def step(
        self, x: torch.Tensor, state: Sequence[torch.Tensor] | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """One token, ``x (B, d_model)`` -> ``(y (B, d_model), new state)``: O(1) memory."""
        q, k, v, i, f = self._project(x)
        op = mlstm_step if self.cell == "mlstm" else mlstmsig_step
        h, new_state = op(q, k, v, i[..., None], f[..., None], state)
        return self._finish(x, h), new_state


class FeedForward(nn.Module):
    """SwiGLU MLP: ``W_down(silu(W_gate x) * W_up x)``."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(d_model, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class xLSTMBlock(nn.Module):
    """Pre-norm residual block: ``x + mLSTM(norm(x))``, then ``x + FFN(norm(x))``.

    Example:
        >>> block = xLSTMBlock(mLSTMLayer(16, 2, 8, 8, backend="reference"), 16, 32)
        >>> block(torch.randn(1, 5, 16))[0].shape
        torch.Size([1, 5, 16])
    """

    def __init__(self, layer: mLSTMLayer, d_model: int, ffn_hidden: int) -> None:
        super().__init__()
        self.norm_mixer = nn.RMSNorm(d_model)
        self.mixer = layer
        self.norm_ffn = nn.RMSNorm(d_model)
        self.ffn = FeedForward(d_model, ffn_hidden)

    def forward(self, x: torch.Tensor, state=None) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        y, state = self.mixer(self.norm_mixer(x), state)
        x = x + y
        return x + self.ffn(self.norm_ffn(x)), state

    def step(self, x: torch.Tensor, state) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        y, state = self.mixer.step(self.norm_mixer(x), state)
        x = x + y
        return x + self.ffn(self.norm_ffn(x)), state
