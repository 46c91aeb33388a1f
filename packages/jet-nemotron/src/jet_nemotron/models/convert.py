"""Build a hybrid model from a pretrained Llama or Qwen2 causal LM (PostNAS's starting point).

Everything but the mixers of the ``"jet"`` layers is copied: embeddings, norms, MLPs, LM head and
the attention weights of ``"attn"``/``"swa"`` layers, under the same names. An all-``"attn"``
conversion therefore reproduces the source model's logits exactly.

A new JetBlock can start from the attention it replaces (``init_from_attention``): its q
projection is the attention's, its k and v projections are the attention's grouped key/value
heads repeated over each group (query head ``h`` reads key/value head ``h // group``, as in
attention), v also tiled along the head dim when ``expand_v > 1``, and its output projection is
the attention's when the value dim is ``num_attention_heads · head_dim``. This needs the block's
``num_heads`` and ``head_dim`` to be the attention's, hence the default block shape
``num_heads = num_attention_heads, head_dim = head_dim, expand_v = 1.0``, which makes all four
projections initialisable. Attention biases (Qwen2's q/k/v biases) have no JetBlock counterpart
and are dropped for ``"jet"`` layers. The rest of the block (gates, dynamic convolution, output
gate and norm) keeps its own initialisation.

Freezing: PostNAS freezes the MLPs while it trains and searches the new attention blocks, so
``freeze_mlp`` (default) sets ``requires_grad=False`` on every layer's MLP, and only there.
Embeddings, norms and the LM head stay trainable: they are not what PostNAS keeps fixed by
name, and with tied embeddings a frozen head would silently freeze the input embeddings too.
Freeze them explicitly (``model.model.embed_tokens.requires_grad_(False)``, ...) to train the
mixers alone.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from jet_nemotron.models.configuration import HybridConfig
from jet_nemotron.models.modeling import HybridForCausalLM
from jet_nemotron.modules.jet_block import JetBlockConfig

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def _hybrid_config(
    source: Any,
    layer_types: Sequence[str],
    jet_block: JetBlockConfig | dict[str, Any] | None,
    sliding_window: int | None,
) -> HybridConfig:
    """The source config's fields in a :class:`HybridConfig`."""
    qwen2 = source.model_type == "qwen2"
    if qwen2 and getattr(source, "use_sliding_window", False):
        raise ValueError(
            "the Qwen2 model uses sliding-window attention layers, which conversion does not "
            "reproduce; convert a model with use_sliding_window=False"
        )
    head_dim = getattr(source, "head_dim", None) or source.hidden_size // source.num_attention_heads
    rope: dict[str, Any] = {}
    if getattr(source, "rope_parameters", None) is not None:
        rope["rope_parameters"] = copy.deepcopy(dict(source.rope_parameters))
    else:
        rope["rope_theta"] = source.rope_theta
        rope["rope_scaling"] = copy.deepcopy(source.rope_scaling)
    config = HybridConfig(
        vocab_size=source.vocab_size,
        hidden_size=source.hidden_size,
        intermediate_size=source.intermediate_size,
        num_hidden_layers=source.num_hidden_layers,
        num_attention_heads=source.num_attention_heads,
        num_key_value_heads=source.num_key_value_heads,
        head_dim=head_dim,
        hidden_act=source.hidden_act,
        max_position_embeddings=source.max_position_embeddings,
        initializer_range=source.initializer_range,
        rms_norm_eps=source.rms_norm_eps,
        use_cache=getattr(source, "use_cache", True),
        pad_token_id=source.pad_token_id,
        bos_token_id=source.bos_token_id,
        eos_token_id=source.eos_token_id,
        tie_word_embeddings=source.tie_word_embeddings,
        attention_bias=True if qwen2 else source.attention_bias,
        attention_output_bias=False if qwen2 else source.attention_bias,
        attention_dropout=float(source.attention_dropout or 0.0),
        mlp_bias=False if qwen2 else source.mlp_bias,
        layer_types=list(layer_types),
        sliding_window=sliding_window,
        jet_block=jet_block,
        **rope,
    )
    implementation = source._attn_implementation
    config._attn_implementation = implementation if implementation == "eager" else "sdpa"
    return config


def _group_heads(weight: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """``(Hkv·D, hidden)`` key/value rows -> ``(H, D, hidden)``, head ``h`` = kv head
    ``h // (H / Hkv)``."""
    grouped = weight.unflatten(0, (-1, head_dim))
    return grouped.repeat_interleave(num_heads // grouped.shape[0], dim=0)


@torch.no_grad()
def copy_attention_projections(
    block: nn.Module, weights: dict[str, torch.Tensor], num_heads: int, head_dim: int
) -> None:
    """Start a linear-attention ``block`` from the q/k/v/o projections of an attention layer.

    ``block`` has bias-free ``q_proj``, ``k_proj`` (``hidden -> num_heads · head_dim``),
    ``v_proj`` (``hidden -> num_heads · head_v_dim``) and ``o_proj``; ``weights`` holds the
    attention's ``"q_proj"``, ``"k_proj"``, ``"v_proj"``, ``"o_proj"`` weights (key/value heads
    possibly grouped). The output projection is copied when its shape matches.

    Raises:
        ValueError: the block's q/k shape is not the attention's ``num_heads · head_dim``.
    """
    H, D = num_heads, head_dim
    query, key = block.q_proj.weight.shape, block.k_proj.weight.shape
    if query != weights["q_proj"].shape or key[0] != H * D:
        raise ValueError(
            f"starting a block from the attention needs its q/k projections to be the "
            f"attention's {H} heads x {D} dims ({tuple(weights['q_proj'].shape)}); got q "
            f"{tuple(query)}, k {tuple(key)}. Use "
            f"that shape or init_from_attention=False"
        )
    head_v_dim = block.v_proj.weight.shape[0] // H
    block.q_proj.weight.copy_(weights["q_proj"])
    block.k_proj.weight.copy_(_group_heads(weights["k_proj"], H, D).flatten(0, 1))
    value = _group_heads(weights["v_proj"], H, D)
    value = value.repeat(1, math.ceil(head_v_dim / D), 1)[:, :head_v_dim]
    block.v_proj.weight.copy_(value.flatten(0, 1))
    if block.o_proj.weight.shape == weights["o_proj"].shape:
        block.o_proj.weight.copy_(weights["o_proj"])


def from_pretrained_llama(
    model: PreTrainedModel,
    layer_types: Sequence[str],
    *,
    jet_block: JetBlockConfig | dict[str, Any] | None = None,
    sliding_window: int | None = None,
    init_from_attention: bool = True,
    freeze_mlp: bool = True,
) -> HybridForCausalLM:
    """A :class:`HybridForCausalLM` with ``model``'s weights and ``layer_types`` mixers.

    Args:
        model: a ``LlamaForCausalLM`` or ``Qwen2ForCausalLM`` (or another causal LM whose config
            has ``model_type`` ``"llama"``/``"qwen2"``); it is not modified.
        layer_types: ``"attn"``, ``"swa"`` or ``"jet"`` for each of its layers.
        jet_block: shape of the JetBlocks; default ``num_heads = num_attention_heads``,
            ``head_dim = head_dim``, ``expand_v = 1.0``.
        sliding_window: window of the ``"swa"`` layers (required if there are any).
        init_from_attention: start each JetBlock from the attention it replaces (see the module
            docstring); otherwise from the block's own initialisation.
        freeze_mlp: ``requires_grad=False`` on every MLP (nothing else is frozen).

    Returns:
        The hybrid model on ``model``'s device and dtype, in its train/eval mode, with its
        generation config and attention implementation (``"eager"`` stays ``"eager"``, anything
        else becomes ``"sdpa"``).

    Raises:
        TypeError: ``model`` is not a Llama or Qwen2 causal LM.
        ValueError: bad ``layer_types``/``sliding_window``/``jet_block``, a Qwen2 model with
            sliding-window layers, or ``init_from_attention`` with a block shape unlike the
            attention's.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> llama = LlamaForCausalLM(
        ...     LlamaConfig(
        ...         vocab_size=64,
        ...         hidden_size=32,
        ...         intermediate_size=64,
        ...         num_hidden_layers=3,
        ...         num_attention_heads=4,
        ...     )
        ... )
        >>> hybrid = from_pretrained_llama(llama, ["attn", "jet", "swa"], sliding_window=8)
        >>> hybrid.config.layer_types
        ['attn', 'jet', 'swa']
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if not isinstance(model, PreTrainedModel) or model_type not in SUPPORTED_MODEL_TYPES:
        raise TypeError(
            f"from_pretrained_llama converts causal LMs with model_type in "
            f"{SUPPORTED_MODEL_TYPES}, got {type(model).__name__} (model_type {model_type!r})"
        )
    if not hasattr(model, "lm_head"):
        raise TypeError(f"{type(model).__name__} has no lm_head: pass the *ForCausalLM model")
    config = _hybrid_config(model.config, layer_types, jet_block, sliding_window)
    parameter = next(model.parameters())
    hybrid = HybridForCausalLM(config).to(device=parameter.device, dtype=parameter.dtype)

    state = model.state_dict()
    jet_prefixes = [
        f"model.layers.{i}.self_attn" for i, kind in enumerate(config.layer_types) if kind == "jet"
    ]
    copied = {
        name: tensor
        for name, tensor in state.items()
        if not any(name.startswith(prefix + ".") for prefix in jet_prefixes)
    }
    missing, unexpected = hybrid.load_state_dict(copied, strict=False)
    missing = [n for n in missing if not any(n.startswith(p + ".") for p in jet_prefixes)]
    if missing or unexpected:
        raise ValueError(
            f"{type(model).__name__} does not have the Llama layout the conversion expects: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    if init_from_attention:
        for prefix in jet_prefixes:
            weights = {name: state[f"{prefix}.{name}.weight"] for name in PROJECTIONS}
            block = hybrid.get_submodule(prefix)
            copy_attention_projections(block, weights, config.num_attention_heads, config.head_dim)
    if freeze_mlp:
        for layer in hybrid.model.layers:
            layer.mlp.requires_grad_(False)
    if getattr(model, "generation_config", None) is not None:
        hybrid.generation_config = copy.deepcopy(model.generation_config)
    return hybrid.train(model.training)
