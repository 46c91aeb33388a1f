"""The linear-attention candidates that PostNAS step 2 compares in one super-network.

Every candidate is a token mixer with the JetBlock's interface: ``forward(hidden_states
(B, T, hidden), attention_mask (B, T) or None, state=None, use_cache=False) -> (out (B, T,
hidden), state or None)``, bias-free ``q_proj, k_proj (hidden -> H·head_dim)``, ``v_proj (hidden
-> H·head_v_dim)`` and ``o_proj (H·head_v_dim -> hidden)`` that can start from a pretrained
attention's projections, and the attributes ``num_heads, head_dim, head_v_dim, layer_idx``.
Each follows FLA's layer of the same name (``fla/layers/*.py``); with ``RMSNorm_g`` the per-head
RMSNorm followed by ``SiLU(W_g x)`` (:class:`~jet_nemotron.modules.norm.GatedRMSNorm`):

* ``"gla"``, Gated Linear Attention (Yang et al. 2024): per-key decay
  ``g = logsigmoid(W2 W1 x) / 16`` (rank-16 gate), ``o = GLA(q, k, v, g)``, ``W_o RMSNorm_g(o)``.
* ``"retnet"``, multi-scale retention (Sun et al. 2023): constant decay ``γ_h = 1 - 2^(-5-h)``
  per head, ``W_o RMSNorm_g(GLA(q, k, v, log γ))``. FLA rotates q and k with RoPE; the block
  interface carries no positions (a decoding step does not know its offset), so no rotation is
  applied here: the decay alone encodes position, as in the other candidates.
* ``"mamba2"``, Mamba2 (Dao & Gu 2024) with per-head ``B = k`` and ``C = q``: q, k, v through
  one static causal conv (width 4, bias) and SiLU, ``Δ = softplus(W_a x + dt_bias)``,
  ``g = -exp(A_log) Δ``, ``y = GLA(q, k, Δ v, g, scale=1) + D ⊙ v``, ``W_o RMSNorm_g(y)``.
  Mamba2 normalises the gated output over the whole inner width; here, as in the other
  candidates, the norm is per head and comes before the gate.
* ``"gated_deltanet"``, Gated DeltaNet (Yang et al. 2025): q, k, v through a bias-free static
  causal conv and SiLU, ``β = σ(W_b x)``, ``g`` as Mamba2, L2-normalised q and k,
  ``W_o RMSNorm_g(GatedDeltaRule(q, k, v, g, β))``.
* ``"jet"``: the :class:`~jet_nemotron.modules.jet_block.JetBlock`.

One static conv over the concatenated ``[q, k, v]`` channels is the same function as FLA's three
depthwise convs. ``A ~ U(0, 16)`` and ``dt`` log-uniform in ``[1e-3, 0.1]`` as in the JetBlock;
linear weights ``N(0, initializer_range)``, linear biases zero.

Modes: training runs the chunked ops; inference runs the recurrent ones for inputs of at most
64 tokens and the chunked ones beyond. Padding as the JetBlock: where ``attention_mask`` is 0 the
conv input is zeroed and the token writes nothing to the recurrent state nor decays it, so a
left-padded row computes what the unpadded row does.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from jet_nemotron.modules.dynamic_conv import DynamicShortConvolution
from jet_nemotron.modules.jet_block import JetBlock, JetBlockConfig
from jet_nemotron.modules.norm import GatedRMSNorm
from jet_nemotron.ops.gated_delta import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from jet_nemotron.ops.gated_linear import chunk_gla, fused_recurrent_gla
from jet_nemotron.ops.validation import check_chunk_size

LINEAR_BLOCKS = ("jet", "gated_deltanet", "gla", "retnet", "mamba2")
RECURRENT_THRESHOLD = 64  # inference inputs of at most this many tokens run the recurrent form


class LinearBlockState(NamedTuple):
    """What a candidate (other than ``"jet"``) carries between calls."""

    recurrent: torch.Tensor  # (B, num_heads, head_dim, head_v_dim), float32
    conv: torch.Tensor | None  # (B, channels, conv_size): the conv's last inputs; None: no conv


class ShortConvolution(nn.Conv1d):
    """Static causal depthwise convolution followed by SiLU, with a decoding state.

    ``y_t = SiLU(Σ_w weight[:, w] ⊙ x_{t-W+1+w} + bias)``. The state ``(B, D, W)`` holds the last
    ``W`` inputs, oldest first (the layout of
    :class:`~jet_nemotron.modules.dynamic_conv.DynamicShortConvolution`); a pass from a state
    reads the inputs before ``x`` from its last ``W - 1`` columns, zeros without one. Weights
    start as ``nn.Conv1d``'s (as FLA's ``ShortConvolution``).

    Example:
        >>> import torch
        >>> conv = ShortConvolution(6, kernel_size=4)
        >>> y, state = conv(torch.randn(2, 5, 6), use_cache=True)
        >>> y.shape, state.shape
        (torch.Size([2, 5, 6]), torch.Size([2, 6, 4]))
    """

    def __init__(self, hidden_size: int, kernel_size: int = 4, bias: bool = False) -> None:
        super().__init__(hidden_size, hidden_size, kernel_size, groups=hidden_size, bias=bias)
        self.hidden_size = hidden_size

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, conv_state: torch.Tensor | None = None, use_cache: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x (B, T, D)``, ``conv_state (B, D, W)`` or ``None`` -> ``(y (B, T, D), the last W
        inputs (B, D, W) or None)``, in ``x``'s dtype."""
        B, _, D = x.shape
        W = self.kernel_size[0]
        if conv_state is None:
            conv_state = x.new_zeros(B, D, W)
        elif conv_state.shape != (B, D, W):
            raise ValueError(
                f"conv state must be (B, channels, conv_size) = {(B, D, W)}, got "
                f"{tuple(conv_state.shape)}"
            )
        window = torch.cat([conv_state.to(x.dtype), x.transpose(1, 2)], dim=-1)
        y = F.conv1d(window[..., 1:], self.weight, self.bias, groups=D)
        return F.silu(y).transpose(1, 2), (window[..., -W:].contiguous() if use_cache else None)


def _decay_parameters(num_heads: int) -> tuple[nn.Parameter, nn.Parameter]:
    """``(A_log, dt_bias)`` of shape ``(H,)``: ``A ~ U(0, 16)``, ``dt`` log-uniform in
    ``[1e-3, 0.1]`` (floor 1e-4), ``dt_bias = softplus⁻¹(dt)``; no weight decay."""
    A_log = nn.Parameter(torch.empty(num_heads).uniform_(0, 16).log())
    low, high = math.log(1e-3), math.log(0.1)
    dt = torch.exp(torch.rand(num_heads) * (high - low) + low).clamp(min=1e-4)
    dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
    A_log._no_weight_decay = True  # type: ignore[attr-defined]
    dt_bias._no_weight_decay = True  # type: ignore[attr-defined]
    return A_log, dt_bias


def _check_dims(**dims: int) -> None:
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


class LinearAttentionBlock(nn.Module):
    """What every candidate shares: projections, mode choice, masking and the gated output.

    A subclass adds its own modules in :meth:`build` and runs its recurrence in :meth:`mix`; this
    class checks the inputs and applies ``o_proj(RMSNorm_g(o))``.

    Args:
        hidden_size: model width.
        num_heads: heads ``H``.
        head_dim: query/key dim per head ``K``.
        head_v_dim: value dim per head ``V``; ``None`` is ``head_dim``.
        layer_idx: position in the model (for caches and messages).
        initializer_range: standard deviation of the linear weights.
        chunk_size: chunk length of the chunked op (16, 32 or 64); ``None`` is the class's
            ``default_chunk_size``.
        norm_eps: epsilon of the gated output RMSNorm.
    """

    default_chunk_size = 64

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        head_v_dim: int | None = None,
        layer_idx: int | None = None,
        initializer_range: float = 0.02,
        chunk_size: int | None = None,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        head_v_dim = head_dim if head_v_dim is None else head_v_dim
        _check_dims(
            hidden_size=hidden_size, num_heads=num_heads, head_dim=head_dim, head_v_dim=head_v_dim
        )
        if not initializer_range > 0:
            raise ValueError(f"initializer_range must be positive, got {initializer_range!r}")
        chunk_size = self.default_chunk_size if chunk_size is None else chunk_size
        check_chunk_size(chunk_size)
        self.hidden_size, self.num_heads, self.layer_idx = hidden_size, num_heads, layer_idx
        self.head_dim, self.head_v_dim, self.chunk_size = head_dim, head_v_dim, chunk_size
        self.initializer_range = initializer_range
        key_dim, value_dim = num_heads * head_dim, num_heads * head_v_dim
        self.q_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, value_dim, bias=False)
        self.g_proj = nn.Linear(hidden_size, value_dim, bias=False)
        self.o_norm = GatedRMSNorm(head_v_dim, eps=norm_eps)
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False)
        self.build()
        for module in self.modules():  # every linear weight N(0, initializer_range), bias zero
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=initializer_range)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def build(self) -> None:
        """Add the candidate's own modules and parameters (called by ``__init__``)."""

    def mix(
        self,
        x: torch.Tensor,
        keep: torch.Tensor | None,
        state: LinearBlockState | None,
        use_cache: bool,
    ) -> tuple[torch.Tensor, LinearBlockState | None]:
        """``x (B, T, hidden)``, ``keep (B, T, 1)`` float32 (1 token, 0 padding) or ``None`` ->
        ``(o (B, T, H, head_v_dim), state or None)``."""
        raise NotImplementedError

    def use_chunked(self, length: int) -> bool:
        """Training, or inference on more than ``RECURRENT_THRESHOLD`` tokens."""
        return self.training or length > RECURRENT_THRESHOLD

    def project(
        self, x: torch.Tensor, keep: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``q, k (B, T, H, head_dim)`` and ``v (B, T, H, head_v_dim)``, v zero where padded."""
        q = self.heads(self.q_proj(x), self.head_dim)
        k = self.heads(self.k_proj(x), self.head_dim)
        return q, k, self.heads(_masked(self.v_proj(x), keep), self.head_v_dim)

    def heads(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """``(B, T, H·dim) -> (B, T, H, dim)``."""
        return x.unflatten(-1, (self.num_heads, dim))

    def gla(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        state: LinearBlockState | None,
        use_cache: bool,
        scale: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Gated linear attention in this call's mode (shapes as in
        :mod:`jet_nemotron.ops.gated_linear`)."""
        initial = None if state is None else state.recurrent
        if self.use_chunked(q.shape[1]):
            return chunk_gla(q, k, v, g, scale, initial, use_cache, chunk_size=self.chunk_size)
        return fused_recurrent_gla(q, k, v, g, scale, initial, use_cache)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        state: LinearBlockState | None = None,
        use_cache: bool = False,
    ) -> tuple[torch.Tensor, LinearBlockState | None]:
        """Mix ``hidden_states (B, T, hidden)``; ``attention_mask (B, T)`` is 1 for tokens and 0
        for padding. Returns ``(out (B, T, hidden), the state after these tokens or None)``."""
        if hidden_states.dim() != 3 or hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(
                f"hidden_states must be (B, T, {self.hidden_size}), got "
                f"{tuple(hidden_states.shape)}"
            )
        if state is not None and not isinstance(state, LinearBlockState):
            raise TypeError(f"state must be a LinearBlockState or None, got {type(state)}")
        B, T, _ = hidden_states.shape
        keep = None
        if attention_mask is not None:
            if attention_mask.shape != (B, T):
                raise ValueError(
                    f"attention_mask must be (B, T) = {(B, T)} for these tokens, got "
                    f"{tuple(attention_mask.shape)}"
                )
            keep = attention_mask.to(torch.promote_types(hidden_states.dtype, torch.float32))
            keep = keep[..., None]
        o, new_state = self.mix(hidden_states, keep, state, use_cache)
        gate = self.heads(self.g_proj(hidden_states), self.head_v_dim)
        out = self.o_proj(self.o_norm(o, gate).flatten(-2))
        return out, (new_state if use_cache else None)


def _masked(x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """``x (B, T, ...)`` with padded tokens zeroed."""
    return x if keep is None else x * keep.to(x.dtype)


class GLABlock(LinearAttentionBlock):
    """Gated Linear Attention (see the module docstring). The default chunk is 16: the per-key
    decay makes the chunked op hold ``chunk · head_dim`` floats per token and head."""

    default_chunk_size = 16
    gate_low_rank_dim = 16
    gate_logit_normalizer = 16

    def build(self) -> None:
        self.gk_proj = nn.Sequential(
            nn.Linear(self.hidden_size, self.gate_low_rank_dim, bias=False),
            nn.Linear(self.gate_low_rank_dim, self.num_heads * self.head_dim, bias=True),
        )

    def mix(
        self,
        x: torch.Tensor,
        keep: torch.Tensor | None,
        state: LinearBlockState | None,
        use_cache: bool,
    ) -> tuple[torch.Tensor, LinearBlockState | None]:
        q, k, v = self.project(x, keep)
        gk = self.gk_proj(x).to(torch.promote_types(x.dtype, torch.float32))
        gk = self.heads(_masked(F.logsigmoid(gk) / self.gate_logit_normalizer, keep), self.head_dim)
        o, recurrent = self.gla(q, k, v, gk, state, use_cache)
        return o, (LinearBlockState(recurrent, None) if recurrent is not None else None)


class RetNetBlock(LinearAttentionBlock):
    """Multi-scale retention without rotary embedding (see the module docstring)."""

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """``log γ_h = log(1 - 2^(-5-h))`` for ``h < H``: ``(H,)`` in float32 (float64 for a
        float64 ``x``); computed here rather than kept as a buffer, so that casting the model to
        bfloat16 cannot round ``γ_h`` to 1."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        h = torch.arange(self.num_heads, dtype=dtype, device=x.device)
        return torch.log1p(-torch.exp2(-5.0 - h))

    def mix(
        self,
        x: torch.Tensor,
        keep: torch.Tensor | None,
        state: LinearBlockState | None,
        use_cache: bool,
    ) -> tuple[torch.Tensor, LinearBlockState | None]:
        q, k, v = self.project(x, keep)
        g = self.log_decay(x)
        if keep is not None:  # per-token decay: a padded token does not decay the state
            g = keep.to(g.dtype) * g
        o, recurrent = self.gla(q, k, v, g, state, use_cache)
        return o, (LinearBlockState(recurrent, None) if recurrent is not None else None)


class _ConvBlock(LinearAttentionBlock):
    """A candidate with a static short conv over ``[q, k, v]`` and Mamba's decay gate."""

    conv_size = 4
    conv_bias = False

    def build(self) -> None:
        H = self.num_heads
        channels = H * (2 * self.head_dim + self.head_v_dim)
        self.conv1d = ShortConvolution(channels, kernel_size=self.conv_size, bias=self.conv_bias)
        self.a_proj = nn.Linear(self.hidden_size, H, bias=False)
        self.A_log, self.dt_bias = _decay_parameters(H)

    def conv_qkv(
        self,
        x: torch.Tensor,
        keep: torch.Tensor | None,
        state: LinearBlockState | None,
        use_cache: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``SiLU(conv([q, k, v]))`` split into heads, and the conv state."""
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        qkv, conv_state = self.conv1d(
            _masked(qkv, keep), None if state is None else state.conv, use_cache
        )
        key_dim = self.num_heads * self.head_dim
        q, k, v = qkv.split([key_dim, key_dim, self.num_heads * self.head_v_dim], dim=-1)
        q, k = self.heads(q, self.head_dim), self.heads(k, self.head_dim)
        return q, k, self.heads(v, self.head_v_dim), conv_state

    def decay(self, x: torch.Tensor, keep: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """``Δ = softplus(W_a x + dt_bias)`` and ``g = -exp(A_log) Δ``, both ``(B, T, H)`` in
        float32 and zero at padding."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        dt = _masked(F.softplus(self.a_proj(x).to(dtype) + self.dt_bias.to(dtype)), keep)
        return dt, -self.A_log.to(dtype).exp() * dt


class Mamba2Block(_ConvBlock):
    """Mamba2 in gated-linear-attention form (see the module docstring)."""

    conv_bias = True

    def build(self) -> None:
        super().build()
        self.D = nn.Parameter(torch.ones(self.num_heads))
        self.D._no_weight_decay = True  # type: ignore[attr-defined]

    def mix(
        self,
        x: torch.Tensor,
        keep: torch.Tensor | None,
        state: LinearBlockState | None,
        use_cache: bool,
    ) -> tuple[torch.Tensor, LinearBlockState | None]:
        q, k, v, conv_state = self.conv_qkv(x, keep, state, use_cache)
        dt, g = self.decay(x, keep)
        o, recurrent = self.gla(q, k, v * dt[..., None].to(v.dtype), g, state, use_cache, 1.0)
        o = o + self.D.to(v.dtype)[:, None] * v
        return o, (LinearBlockState(recurrent, conv_state) if recurrent is not None else None)


class GatedDeltaNetBlock(_ConvBlock):
    """Gated DeltaNet (see the module docstring)."""

    def build(self) -> None:
        super().build()
        self.b_proj = nn.Linear(self.hidden_size, self.num_heads, bias=False)

    def mix(
        self,
        x: torch.Tensor,
        keep: torch.Tensor | None,
        state: LinearBlockState | None,
        use_cache: bool,
    ) -> tuple[torch.Tensor, LinearBlockState | None]:
        q, k, v, conv_state = self.conv_qkv(x, keep, state, use_cache)
        dt, g = self.decay(x, keep)
        beta = _masked(self.b_proj(x).to(dt.dtype).sigmoid(), keep)
        initial = None if state is None else state.recurrent
        if self.use_chunked(x.shape[1]):
            o, recurrent = chunk_gated_delta_rule(
                q, k, v, g, beta, None, initial, use_cache, True, chunk_size=self.chunk_size
            )
        else:
            o, recurrent = fused_recurrent_gated_delta_rule(
                q, k, v, g, beta, None, initial, use_cache, True
            )
        return o, (LinearBlockState(recurrent, conv_state) if recurrent is not None else None)


class JetBlockCandidate(JetBlock):
    """The JetBlock with the candidates' ``num_heads, head_dim, head_v_dim`` attributes."""

    @property
    def num_heads(self) -> int:
        return self.config.num_heads

    @property
    def head_dim(self) -> int:
        return self.config.head_dim

    @property
    def head_v_dim(self) -> int:
        return self.config.head_v_dim


_CLASSES: dict[str, type[LinearAttentionBlock]] = {
    "gated_deltanet": GatedDeltaNetBlock,
    "gla": GLABlock,
    "retnet": RetNetBlock,
    "mamba2": Mamba2Block,
}


def build_linear_block(
    name: str,
    hidden_size: int,
    num_heads: int,
    head_dim: int,
    *,
    head_v_dim: int | None = None,
    layer_idx: int | None = None,
    initializer_range: float = 0.02,
) -> nn.Module:
    """The candidate ``name`` (one of :data:`LINEAR_BLOCKS`) for a model of width ``hidden_size``.

    Args:
        name: ``"jet"``, ``"gated_deltanet"``, ``"gla"``, ``"retnet"`` or ``"mamba2"``.
        hidden_size: model width.
        num_heads: heads ``H``.
        head_dim: query/key dim per head.
        head_v_dim: value dim per head; ``None`` is ``head_dim``.
        layer_idx: position in the model.
        initializer_range: standard deviation of the linear weights.

    Returns:
        the block; ``forward(hidden_states, attention_mask=None, state=None, use_cache=False)``.

    Example:
        >>> import torch
        >>> block = build_linear_block("gla", 32, num_heads=2, head_dim=16)
        >>> out, state = block(torch.randn(1, 5, 32), use_cache=True)
        >>> out.shape, state.recurrent.shape, state_numel(block)
        (torch.Size([1, 5, 32]), torch.Size([1, 2, 16, 16]), 512)
    """
    head_v_dim = head_dim if head_v_dim is None else head_v_dim
    _check_dims(
        hidden_size=hidden_size, num_heads=num_heads, head_dim=head_dim, head_v_dim=head_v_dim
    )
    if name == "jet":
        config = JetBlockConfig(
            num_heads=num_heads, head_dim=head_dim, expand_v=head_v_dim / head_dim
        )
        return JetBlockCandidate(hidden_size, config, layer_idx, initializer_range)
    if name not in _CLASSES:
        raise ValueError(f"unknown linear block {name!r}; allowed: {', '.join(LINEAR_BLOCKS)}")
    return _CLASSES[name](
        hidden_size, num_heads, head_dim, head_v_dim, layer_idx, initializer_range
    )


def state_numel(block: nn.Module) -> int:
    """Floats a candidate carries per sequence between decoding steps: the recurrent state
    ``H · head_dim · head_v_dim`` plus every short conv's ``channels · conv_size``."""
    if not isinstance(block, LinearAttentionBlock | JetBlockCandidate):
        raise TypeError(
            f"state_numel takes a block from build_linear_block, got {type(block).__name__}"
        )
    total = block.num_heads * block.head_dim * block.head_v_dim
    for module in block.modules():
        if isinstance(module, ShortConvolution):
            total += module.hidden_size * module.kernel_size[0]
        elif isinstance(module, DynamicShortConvolution):
            total += module.hidden_size * module.kernel_size
    return total
