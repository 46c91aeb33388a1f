"""The hybrid causal LM: Llama's decoder with full attention, sliding-window attention or a
JetBlock as the token mixer of each layer.

Each decoder layer is ``x + mixer(RMSNorm(x))`` then ``x + MLP(RMSNorm(x))`` with Llama's RMSNorm,
gated MLP and rotary embedding (reused from ``transformers``), so parameter names and numerics
match ``LlamaForCausalLM`` layer for layer. Padding is on the left, given by the usual 2D
``attention_mask``; padded positions change nothing for the real ones. Generation carries a
:class:`~jet_nemotron.models.cache.HybridCache`, created by the model on the first call.

Runs on transformers 4.57 to 5.x: the cache is accepted as ``cache`` (5.x) or
``past_key_values`` (4.x) and returned under the installed version's output field name.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from jet_nemotron.models.attention import HybridAttention, attention_mask_for
from jet_nemotron.models.cache import HybridCache
from jet_nemotron.models.configuration import HybridConfig
from jet_nemotron.modules.jet_block import JetBlock

# transformers 5 renamed the outputs' `past_key_values` field to `cache`.
CACHE_FIELD = (
    "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
)


def _one_cache(
    cache: HybridCache | None, past_key_values: HybridCache | None
) -> HybridCache | None:
    if cache is not None and past_key_values is not None:
        raise ValueError("give the cache as `cache` or as `past_key_values`, not both")
    cache = cache if cache is not None else past_key_values
    if cache is not None and not isinstance(cache, HybridCache):
        raise TypeError(
            f"the hybrid model needs a HybridCache (or None to start one), got "
            f"{type(cache).__name__}"
        )
    return cache


class HybridDecoderLayer(GradientCheckpointingLayer):
    """``x + mixer(RMSNorm(x))``, then ``x + MLP(RMSNorm(x))``; the mixer is ``self_attn``
    whatever its type (a :class:`HybridAttention` or a :class:`JetBlock`)."""

    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.layer_type = config.layer_types[layer_idx]
        self.self_attn: HybridAttention | JetBlock
        if self.layer_type == "jet":
            self.self_attn = JetBlock(
                config.hidden_size, config.jet_block_config, layer_idx, config.initializer_range
            )
        else:
            window = config.sliding_window if self.layer_type == "swa" else None
            self.self_attn = HybridAttention(config, layer_idx, sliding_window=window)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        cache: HybridCache | None = None,
    ) -> torch.Tensor:
        """``hidden_states (B, T, hidden)`` -> ``(B, T, hidden)``.

        ``attention_mask`` is this layer type's kernel mask (attention layers);
        ``padding_mask (B, T)`` marks the tokens among these ``T`` positions (JetBlock layers).
        """
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        if isinstance(self.self_attn, JetBlock):
            state = None if cache is None else cache.jet_state(self.layer_idx)
            hidden_states, state = self.self_attn(
                hidden_states, padding_mask, state=state, use_cache=cache is not None
            )
            if cache is not None and state is not None:
                cache.update_jet_state(self.layer_idx, state, hidden_states.shape[1])
        else:
            hidden_states = self.self_attn(
                hidden_states, position_embeddings, attention_mask, cache=cache
            )
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states


class HybridPreTrainedModel(PreTrainedModel):
    """Weight initialisation, loading and saving (safetensors) of the hybrid models.

    JetBlocks initialise themselves when built (their dynamic convolution starts as a static one,
    ``A_log``/``dt_bias`` follow Mamba's ranges); the generic initialisation skips them.
    """

    config_class = HybridConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules: ClassVar[list[str]] = ["HybridDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = False
    _supports_flex_attn = False

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # generate must not build a DynamicCache: the model starts its own HybridCache.
        return False


class HybridModel(HybridPreTrainedModel):
    """Embeddings, the hybrid decoder layers and the final norm.

    Example:
        >>> import torch
        >>> config = HybridConfig(
        ...     vocab_size=32,
        ...     hidden_size=16,
        ...     intermediate_size=32,
        ...     num_hidden_layers=2,
        ...     num_attention_heads=2,
        ...     layer_types=["attn", "swa"],
        ...     sliding_window=4,
        ... )
        >>> HybridModel(config)(torch.tensor([[1, 2, 3]])).last_hidden_state.shape
        torch.Size([1, 3, 16])
    """

    def __init__(self, config: HybridConfig) -> None:
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList(
            [HybridDecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        for layer in self.layers:
            if isinstance(layer.self_attn, JetBlock):
                for module in layer.self_attn.modules():
                    module._is_hf_initialized = True
        self.post_init()

    def _masks(
        self,
        padding_mask: torch.Tensor | None,
        inputs_embeds: torch.Tensor,
        past_length: int,
        cache: HybridCache | None,
    ) -> dict[str, torch.Tensor | None]:
        """The attention mask of each attention layer type present in the model."""
        batch_size, query_length = inputs_embeds.shape[:2]
        masks: dict[str, torch.Tensor | None] = {}
        for layer in self.layers:
            if layer.layer_type == "jet" or layer.layer_type in masks:
                continue
            kept = 0 if cache is None else cache.kept_length(layer.layer_idx)
            window = self.config.sliding_window if layer.layer_type == "swa" else None
            masks[layer.layer_type] = attention_mask_for(
                self.config._attn_implementation,
                padding_mask,
                batch_size,
                query_length,
                past_length,
                kept + query_length,
                window,
                inputs_embeds.dtype,
            )
        return masks

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: HybridCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        past_key_values: HybridCache | None = None,
    ) -> BaseModelOutputWithPast:
        """Run the decoder.

        Args:
            input_ids: ``(B, T)`` token ids, or give ``inputs_embeds (B, T, hidden)`` instead.
            attention_mask: ``(B, past + T)``, 1 for tokens and 0 for (left) padding, covering
                the cached positions too; ``None`` for no padding.
            position_ids: ``(B or 1, T)``; default ``past, …, past + T - 1``.
            cache: the :class:`HybridCache` of the previous positions (updated in place), or
                ``None``; with ``use_cache`` a new one is started. ``past_key_values`` is the
                transformers 4.x name of the same argument.
            use_cache: return the cache (default ``config.use_cache`` in eval mode, no cache
                in training mode).
            output_hidden_states: also return the embeddings, the output of every layer but the
                last, and the final normed output.

        Returns:
            ``BaseModelOutputWithPast`` with ``last_hidden_state (B, T, hidden)``, the cache and,
            if asked, ``hidden_states``.

        Raises:
            ValueError: both or neither of ``input_ids``/``inputs_embeds``, or an
                ``attention_mask`` that is not ``(B, past + T)``.
            TypeError: a cache that is not a ``HybridCache``.
        """
        cache = _one_cache(cache, past_key_values)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache is None:
            use_cache = self.config.use_cache and not self.training
        if use_cache and cache is None:
            cache = HybridCache(self.config)
        batch_size, query_length = inputs_embeds.shape[:2]
        past_length = 0 if cache is None else cache.get_seq_length()
        if attention_mask is not None and (
            attention_mask.dim() != 2
            or tuple(attention_mask.shape) != (batch_size, past_length + query_length)
        ):
            expected = (batch_size, past_length + query_length)
            raise ValueError(
                f"attention_mask must be 2D (B, past + T) = {expected} (1 for tokens, 0 for "
                f"padding), got {tuple(attention_mask.shape)}"
            )
        if position_ids is None:
            position_ids = torch.arange(
                past_length, past_length + query_length, device=inputs_embeds.device
            ).unsqueeze(0)
        masks = self._masks(attention_mask, inputs_embeds, past_length, cache)
        padding_mask = None if attention_mask is None else attention_mask[:, past_length:]
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)
        all_hidden_states: tuple[torch.Tensor, ...] | None = () if output_hidden_states else None
        for layer in self.layers:
            if all_hidden_states is not None:
                all_hidden_states += (hidden_states,)
            hidden_states = layer(
                hidden_states,
                position_embeddings,
                attention_mask=masks.get(layer.layer_type),
                padding_mask=padding_mask,
                cache=cache,
            )
        hidden_states = self.norm(hidden_states)
        if all_hidden_states is not None:
            all_hidden_states += (hidden_states,)
        return BaseModelOutputWithPast(
            last_hidden_state=hidden_states,
            hidden_states=all_hidden_states,
            **{CACHE_FIELD: cache},
        )


class HybridForCausalLM(HybridPreTrainedModel, GenerationMixin):
    """The hybrid decoder with a language-model head; supports ``generate`` (greedy, sampling,
    beam search) with a :class:`HybridCache`.

    Example:
        >>> import torch
        >>> config = HybridConfig(
        ...     vocab_size=32,
        ...     hidden_size=16,
        ...     intermediate_size=32,
        ...     num_hidden_layers=2,
        ...     num_attention_heads=2,
        ...     layer_types=["attn", "swa"],
        ...     sliding_window=4,
        ... )
        >>> model = HybridForCausalLM(config).eval()
        >>> model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False).shape
        torch.Size([1, 7])
    """

    _tied_weights_keys: ClassVar[dict[str, str]] = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: HybridConfig) -> None:
        super().__init__(config)
        self.model = HybridModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: HybridCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: HybridCache | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast | tuple:
        """Logits (and the loss with ``labels``) for ``(B, T)`` tokens.

        Args:
            input_ids, attention_mask, position_ids, cache, inputs_embeds, use_cache,
            output_hidden_states, past_key_values: as :meth:`HybridModel.forward`.
            labels: ``(B, T)`` next-token targets as ``transformers`` takes them (shifted inside;
                -100 ignored); the loss is their mean cross-entropy.
            logits_to_keep: an int ``n`` computes logits for the last ``n`` positions only
                (0: all), a 1D tensor for those sequence indices.
            return_dict: ``False`` for a tuple.
            **kwargs: passed to the loss (e.g. ``num_items_in_batch``); generation's bookkeeping
                arguments are ignored.

        Returns:
            ``CausalLMOutputWithPast`` with ``logits (B, kept positions, vocab_size)`` in the
            model's dtype, ``loss`` (float32 scalar) when ``labels`` is given, the cache and
            ``hidden_states`` if asked.

        Raises:
            ValueError: ``output_attentions=True`` (attention weights are not returned), and
                see :meth:`HybridModel.forward`.
        """
        if kwargs.pop("output_attentions", False):
            raise ValueError("the hybrid model does not return attention weights")
        kwargs.pop("cache_position", None)  # transformers 4.x generation bookkeeping
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=_one_cache(cache, past_key_values),
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
        )
        hidden_states = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, keep, :])
        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs
            )
        result = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)},
        )
        return result.to_tuple() if return_dict is False else result
