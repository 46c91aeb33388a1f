"""The JetBlock: gated delta rule linear attention with a dynamic convolution on the values.

For input ``x (B, T, hidden)``: ``q = SiLU(W_q x)``, ``k = SiLU(W_k x)`` (L2-normalised in the
op), ``v = SiLU(DynConv(W_v x))`` with the kernel generated from ``x``, ``β = σ(W_b x)``,
``g = -exp(A_log) · softplus(W_a x + dt_bias)`` in float32, ``o = GatedDeltaRule(q, k, v, g, β)``,
output ``W_o (RMSNorm(o) · SiLU(W_g x))``. The chunked form runs for training and long inputs,
the fused recurrent one for inputs of at most ``recurrent_threshold`` tokens at inference.

Padding: where ``attention_mask`` is 0, the value input is zeroed and ``g = β = 0``, so a padded
token leaves both the recurrent state (``S ← 1 · S + k · 0``) and the convolution's view of the
sequence untouched; a left-padded row computes exactly what the unpadded row does.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from jet_nemotron.modules.dynamic_conv import DynamicShortConvolution
from jet_nemotron.modules.norm import GatedRMSNorm
from jet_nemotron.ops.gated_delta import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from jet_nemotron.ops.validation import CHUNK_SIZES

MODES = ("chunk", "fused_recurrent")


@dataclass(frozen=True)
class JetBlockConfig:
    """Shape of a JetBlock (defaults: the anchor's ``JetBlockConfig``).

    Attributes:
        num_heads: heads of q, k and v.
        head_dim: key (and query) dim per head.
        expand_v: value dim per head = ``head_dim · expand_v`` (must be an integer).
        conv_size: the dynamic convolution's kernel width ``W``.
        dconv_generator_reduction: the kernel generator's bottleneck is ``value_dim // this``.
        norm_eps: epsilon of the gated output RMSNorm.
        mode: ``"chunk"`` or ``"fused_recurrent"`` for inputs longer than ``recurrent_threshold``
            (training always runs the chunked form).
        chunk_size: 16, 32 or 64.
        recurrent_threshold: at inference, inputs of at most this many tokens take the fused
            recurrent form (the anchor's 64).
    """

    num_heads: int = 6
    head_dim: int = 256
    expand_v: float = 2.0
    conv_size: int = 4
    dconv_generator_reduction: int = 8
    norm_eps: float = 1e-5
    mode: str = "chunk"
    chunk_size: int = 64
    recurrent_threshold: int = 64

    def __post_init__(self) -> None:
        for name in ("num_heads", "head_dim", "conv_size", "dconv_generator_reduction"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"JetBlockConfig.{name} must be a positive integer, got {value!r}")
        if not 2 <= self.conv_size <= 8:
            raise ValueError(f"conv_size must be in [2, 8], got {self.conv_size}")
        value_dim = self.head_dim * self.expand_v
        if self.expand_v <= 0 or not math.isclose(value_dim, round(value_dim), rel_tol=1e-5):
            raise ValueError(
                f"expand_v={self.expand_v} must make head_dim * expand_v a positive integer "
                f"(head_dim={self.head_dim} gives {value_dim})"
            )
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.chunk_size not in CHUNK_SIZES:
            raise ValueError(f"chunk_size must be one of {CHUNK_SIZES}, got {self.chunk_size}")
        if self.norm_eps <= 0 or self.recurrent_threshold < 0:
            raise ValueError("norm_eps must be positive and recurrent_threshold non-negative")
        if self.value_dim < self.dconv_generator_reduction:
            raise ValueError(
                f"value dim {self.value_dim} is smaller than dconv_generator_reduction="
                f"{self.dconv_generator_reduction}"
            )

    @property
    def key_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def head_v_dim(self) -> int:
        return round(self.head_dim * self.expand_v)

    @property
    def value_dim(self) -> int:
        return self.num_heads * self.head_v_dim

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> JetBlockConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown JetBlockConfig fields {unknown}; known: {sorted(known)}")
        return cls(**values)


class JetBlockState(NamedTuple):
    """What a JetBlock carries between calls."""

    recurrent: torch.Tensor  # (B, num_heads, head_dim, head_v_dim) float32
    conv: torch.Tensor  # (B, value_dim, conv_size): the last conv_size inputs of the conv


class JetBlock(nn.Module):
    """Token mixer of Jet-Nemotron (see the module docstring).

    Args:
        hidden_size: model width.
        config: the block's shape.
        layer_idx: position in the model (for caches and messages).
        initializer_range: standard deviation of the linear weights (the reference model's
            ``N(0, initializer_range)``), the generator's first weight and the static
            convolution kernel.

    Example:
        >>> import torch
        >>> block = JetBlock(32, JetBlockConfig(num_heads=2, head_dim=16, chunk_size=16))
        >>> y, state = block(torch.randn(1, 20, 32), use_cache=True)
        >>> y.shape, state.recurrent.shape, state.conv.shape
        (torch.Size([1, 20, 32]), torch.Size([1, 2, 16, 32]), torch.Size([1, 64, 4]))
    """

    def __init__(
        self,
        hidden_size: int,
        config: JetBlockConfig,
        layer_idx: int | None = None,
        initializer_range: float = 0.02,
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.config = config
        self.layer_idx = layer_idx
        H = config.num_heads
        self.q_proj = nn.Linear(hidden_size, config.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, config.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, config.value_dim, bias=False)
        self.b_proj = nn.Linear(hidden_size, H, bias=False)
        self.a_proj = nn.Linear(hidden_size, H, bias=False)
        # A ~ U(0, 16); dt log-uniform in [1e-3, 0.1] (floor 1e-4), dt_bias = softplus⁻¹(dt)
        self.A_log = nn.Parameter(torch.empty(H).uniform_(0, 16).log())
        dt = torch.exp(torch.rand(H) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        dt = dt.clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log._no_weight_decay = True  # type: ignore[attr-defined]
        self.dt_bias._no_weight_decay = True  # type: ignore[attr-defined]
        self.dynamic_conv1d = DynamicShortConvolution(
            config.value_dim,
            generator_input_size=hidden_size,
            kernel_size=config.conv_size,
            generator_reduction=config.dconv_generator_reduction,
            init_std=initializer_range,
        )
        self.g_proj = nn.Linear(hidden_size, config.value_dim, bias=False)
        self.o_norm = GatedRMSNorm(config.head_v_dim, eps=config.norm_eps)
        self.o_proj = nn.Linear(config.value_dim, hidden_size, bias=False)
        for linear in (self.q_proj, self.k_proj, self.v_proj, self.b_proj, self.a_proj,
                       self.g_proj, self.o_proj):  # fmt: skip
            nn.init.normal_(linear.weight, std=initializer_range)

    def _mode(self, length: int) -> str:
        if self.training:
            return "chunk"
        return "fused_recurrent" if length <= self.config.recurrent_threshold else self.config.mode

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        state: JetBlockState | None = None,
        use_cache: bool = False,
    ) -> tuple[torch.Tensor, JetBlockState | None]:
        """Mix ``hidden_states (B, T, hidden)``.

        Args:
            hidden_states: ``(B, T, hidden)``.
            attention_mask: ``(B, T)``, 1 for tokens and 0 for padding, or ``None``.
            state: the state after the previous tokens, or ``None``.
            use_cache: return the state after these tokens.

        Returns:
            ``(output (B, T, hidden), JetBlockState or None)``.
        """
        if hidden_states.dim() != 3 or hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(
                f"hidden_states must be (B, T, {self.hidden_size}), got "
                f"{tuple(hidden_states.shape)}"
            )
        B, T, _ = hidden_states.shape
        cfg = self.config
        x = hidden_states
        gate_dtype = torch.promote_types(x.dtype, torch.float32)
        keep = None
        if attention_mask is not None:
            if attention_mask.shape != (B, T):
                raise ValueError(
                    f"attention_mask must be (B, T) = {(B, T)} for these tokens, got "
                    f"{tuple(attention_mask.shape)}"
                )
            keep = attention_mask.to(gate_dtype)[..., None]
        v_in = self.v_proj(x)
        if keep is not None:
            v_in = v_in * keep.to(v_in.dtype)
        v, conv_state = self.dynamic_conv1d(
            v_in, x, None if state is None else state.conv, use_cache=use_cache
        )
        q = F.silu(self.q_proj(x)).unflatten(-1, (cfg.num_heads, cfg.head_dim))
        k = F.silu(self.k_proj(x)).unflatten(-1, (cfg.num_heads, cfg.head_dim))
        v = v.unflatten(-1, (cfg.num_heads, cfg.head_v_dim))
        beta = self.b_proj(x).to(gate_dtype).sigmoid()
        A, dt_bias = self.A_log.to(gate_dtype).exp(), self.dt_bias.to(gate_dtype)
        g = -A * F.softplus(self.a_proj(x).to(gate_dtype) + dt_bias)
        if keep is not None:
            beta, g = beta * keep, g * keep
        options: dict[str, Any] = {
            "initial_state": None if state is None else state.recurrent,
            "output_final_state": use_cache,
            "use_qk_l2norm_in_kernel": True,
        }
        if self._mode(T) == "chunk":
            o, recurrent = chunk_gated_delta_rule(
                q, k, v, g, beta, chunk_size=cfg.chunk_size, **options
            )
        else:
            o, recurrent = fused_recurrent_gated_delta_rule(q, k, v, g, beta, **options)
        gate = self.g_proj(x).unflatten(-1, (cfg.num_heads, cfg.head_v_dim))
        out = self.o_proj(self.o_norm(o, gate).flatten(-2))
        if not use_cache:
            return out, None
        assert recurrent is not None
        assert conv_state is not None
        return out, JetBlockState(recurrent, conv_state)
