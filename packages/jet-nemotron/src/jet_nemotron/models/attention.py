"""Softmax attention of the ``"attn"`` and ``"swa"`` layers, and the masks they take.

The layer is Llama's attention (same projections, RoPE, grouped key/value heads and attention
kernels, reused from ``transformers``), so an all-``"attn"`` hybrid computes exactly what
``LlamaForCausalLM`` computes. Two kernels are supported, chosen by the config's
``_attn_implementation``: ``"eager"`` (matmul + softmax, additive float mask) and ``"sdpa"``
(``torch.nn.functional.scaled_dot_product_attention``, boolean mask, or no mask at all where its
``is_causal`` flag means the same thing). A config not attached to a model (implementation unset)
runs eager, as in ``transformers``.

Positions: the queries are the ``T`` newest positions ``past, …, past + T - 1``; the keys are the
``key_length`` newest positions up to ``past + T - 1`` (all of them for ``"attn"``, the rolling
window of a ``"swa"`` cache otherwise). Query ``i`` sees key ``j`` when ``j <= i``, when
``j > i - sliding_window`` for ``"swa"``, and when position ``j`` is not padding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, eager_attention_forward

from jet_nemotron.models.cache import HybridCache
from jet_nemotron.models.configuration import HybridConfig

ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa")


def _check_implementation(implementation: str | None) -> str:
    if implementation is None:  # a config not attached to a model yet: transformers' default
        return "eager"
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"attention implementation {implementation!r} is not supported by the hybrid model; "
            f"allowed: {ATTENTION_IMPLEMENTATIONS}"
        )
    return implementation


def visible_positions(
    padding_mask: torch.Tensor | None,
    batch_size: int,
    query_length: int,
    past_length: int,
    key_length: int,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Which key each query may attend to.

    Args:
        padding_mask: ``(B, past_length + query_length)``, true/1 for tokens and false/0 for
            padding, or ``None`` for no padding.
        batch_size: ``B``.
        query_length: ``T``, the new positions.
        past_length: positions before them.
        key_length: how many of the newest positions the keys cover (``<= past + T``).
        sliding_window: a query sees only the last ``sliding_window`` positions (itself
            included); ``None`` for no limit.

    Returns:
        ``(B, 1, T, key_length)`` bool, true where the query sees the key.
    """
    device = padding_mask.device if padding_mask is not None else None
    query_pos = torch.arange(past_length, past_length + query_length, device=device)
    first_key = past_length + query_length - key_length
    key_pos = torch.arange(first_key, first_key + key_length, device=device)
    visible = key_pos[None, :] <= query_pos[:, None]
    if sliding_window is not None:
        visible &= key_pos[None, :] > query_pos[:, None] - sliding_window
    visible = visible[None, None]
    if padding_mask is not None:
        visible = visible & padding_mask[:, None, None, first_key:].bool()
    return visible.expand(batch_size, 1, query_length, key_length)


def attention_mask_for(
    implementation: str,
    padding_mask: torch.Tensor | None,
    batch_size: int,
    query_length: int,
    past_length: int,
    key_length: int,
    sliding_window: int | None,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """The mask the attention kernel ``implementation`` takes (see :func:`visible_positions`).

    Returns:
        ``"eager"``: ``(B, 1, T, key_length)`` in ``dtype``, 0 where visible and the dtype's
        minimum elsewhere. ``"sdpa"``: the ``(B, 1, T, key_length)`` bool mask, or ``None`` when
        SDPA's own causal flag (``T > 1``) or no mask (``T == 1``) means the same: no padding
        among the keys, the window cuts nothing, and ``T == 1`` or ``T == key_length``. These are
        ``transformers``' masks and choices, so the kernels receive the same inputs as Llama's.

    Raises:
        ValueError: an implementation other than ``"eager"`` or ``"sdpa"``.
    """
    implementation = _check_implementation(implementation)
    first_key = past_length + query_length - key_length
    if (
        implementation == "sdpa"
        and (padding_mask is None or bool(padding_mask[:, first_key:].all()))
        and (sliding_window is None or key_length < sliding_window)
        and (query_length == 1 or key_length == query_length)
    ):
        return None
    visible = visible_positions(
        padding_mask, batch_size, query_length, past_length, key_length, sliding_window
    )
    if implementation == "sdpa":
        return visible
    zero = torch.zeros((), dtype=dtype, device=visible.device)
    return torch.where(visible, zero, torch.finfo(dtype).min)


def attention_function(implementation: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """``transformers``' attention kernel for ``"eager"`` or ``"sdpa"``."""
    if _check_implementation(implementation) == "eager":
        return eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS["sdpa"]


class HybridAttention(nn.Module):
    """Llama's causal self-attention, optionally over a sliding window.

    Args:
        config: the model's configuration (sizes, biases, dropout, ``_attn_implementation``).
        layer_idx: the layer's index (its slot in the cache).
        sliding_window: ``None`` for an ``"attn"`` layer, the window of a ``"swa"`` layer.

    Example:
        >>> import torch
        >>> config = HybridConfig(
        ...     vocab_size=32,
        ...     hidden_size=16,
        ...     intermediate_size=32,
        ...     num_hidden_layers=1,
        ...     num_attention_heads=2,
        ... )
        >>> attention = HybridAttention(config, layer_idx=0)
        >>> cos, sin = torch.ones(1, 5, 8), torch.zeros(1, 5, 8)
        >>> mask = attention_mask_for("eager", None, 1, 5, 0, 5, None, torch.float32)
        >>> attention(torch.randn(1, 5, 16), (cos, sin), mask).shape
        torch.Size([1, 5, 16])
    """

    def __init__(
        self, config: HybridConfig, layer_idx: int, sliding_window: int | None = None
    ) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.sliding_window = sliding_window
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        q_size = config.num_attention_heads * self.head_dim
        kv_size = config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_size, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_size, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=config.attention_output_bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None,
        cache: HybridCache | None = None,
    ) -> torch.Tensor:
        """Attend from ``hidden_states (B, T, hidden)`` to the cached and new positions.

        Args:
            hidden_states: ``(B, T, hidden)``.
            position_embeddings: RoPE ``(cos, sin)``, each ``(B or 1, T, head_dim)``.
            attention_mask: from :func:`attention_mask_for` for this layer's key length.
            cache: keys/values of the previous positions, updated in place; ``None`` to attend
                within ``hidden_states`` only.

        Returns:
            ``(B, T, hidden)`` in the input's dtype.
        """
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if cache is not None:
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx)
        attend = attention_function(self.config._attn_implementation)
        attn_output, _ = attend(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
        )
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output)
