"""Architecture facts the methods need: where the transformer layers live and which linear layers
LoPE targets by default, per Hugging Face ``model_type``.

Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64))
    >>> len(transformer_layers(model))
    2
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class Architecture:
    """Where a family keeps its layer stack and which projections LoPE adapts by default.

    Attributes:
        layers: dotted path from the backbone (``model.base_model``) to the ``nn.ModuleList`` of
            transformer layers.
        default_targets: leaf names of the linear layers adapted when no target is given.
    """

    layers: str
    default_targets: tuple[str, ...]


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("layers", ("q_proj", "v_proj")),
    "mistral": Architecture("layers", ("q_proj", "v_proj")),
    "qwen2": Architecture("layers", ("q_proj", "v_proj")),
    "gpt2": Architecture("h", ("c_attn",)),
    "bert": Architecture("encoder.layer", ("query", "value")),
    "roberta": Architecture("encoder.layer", ("query", "value")),
}


def architecture(model: nn.Module) -> Architecture:
    """The :class:`Architecture` of a Hugging Face model; ``ValueError`` if it is not supported."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type is None:
        raise TypeError(
            f"expected a Hugging Face transformers model with a `config.model_type`, got "
            f"{type(model).__name__}"
        )
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"model type {model_type!r} ({type(model).__name__}) is not supported; supported "
            f"model types: {sorted(ARCHITECTURES)}"
        )
    return ARCHITECTURES[model_type]


def transformer_layers(model: nn.Module) -> nn.ModuleList:
    """The list of transformer layers (decoder or encoder blocks) of ``model``."""
    module: nn.Module = model.base_model
    for name in architecture(model).layers.split("."):
        module = getattr(module, name)
    if not isinstance(module, nn.ModuleList):
        raise TypeError(f"expected a ModuleList of layers, found {type(module).__name__}")
    return module


def hidden_size(model: nn.Module) -> int:
    """Width of the token embeddings."""
    return model.get_input_embeddings().embedding_dim
