"""``get_peft_model`` and ``from_pretrained``: wrap a Hugging Face model with an adapter, or load a
saved adapter onto a base model."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from kernels_common.cli import read_json, read_safetensors
from peft_zoo.arch import architecture
from peft_zoo.base import CONFIG_NAME, FORMAT_VERSION, WEIGHTS_NAME, PeftZooModel
from peft_zoo.capt import CaPTModel
from peft_zoo.config import AdapterConfig, CaPTConfig, LoPEConfig, PTMoEConfig, config_from_dict
from peft_zoo.lope import LoPEModel
from peft_zoo.ptmoe import PTMoEModel


def get_peft_model(model: nn.Module, config: AdapterConfig, tokenizer=None) -> PeftZooModel:
    """Freeze ``model`` and attach the adapter described by ``config``.

    Args:
        model: a Hugging Face transformers model (Llama/SmolLM2, Mistral, Qwen2, GPT-2 causal LMs;
            BERT/RoBERTa encoders, e.g. for sequence classification).
        config: :class:`PTMoEConfig`, :class:`CaPTConfig` or :class:`LoPEConfig`.
        tokenizer: needed only for ``PTMoEConfig(init_text=...)`` (SVD initialisation).

    Returns:
        The wrapped model; only the adapter's parameters require gradients. ``LoPEModel`` starts
        in stage I (call ``set_stage(2)`` for task training).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch nn.Module, got {type(model).__name__}")
    architecture(model)  # unsupported families fail here, naming the supported ones
    if isinstance(config, PTMoEConfig):
        return PTMoEModel(model, config, tokenizer=tokenizer)
    if isinstance(config, CaPTConfig):
        return CaPTModel(model, config)
    if isinstance(config, LoPEConfig):
        return LoPEModel(model, config)
    raise TypeError(
        f"config must be a PTMoEConfig, CaPTConfig or LoPEConfig, got {type(config).__name__}"
    )


def from_pretrained(model: nn.Module, directory: str | Path) -> PeftZooModel:
    """Attach the adapter saved by ``save_pretrained(directory)`` to the base ``model``.

    A missing, truncated or foreign ``adapter_config.json`` or ``adapter_model.safetensors``, an
    unknown format version or tensors that do not fit ``model`` raise ``FileNotFoundError`` /
    ``ValueError`` naming the file.
    """
    directory = Path(directory)
    config_path, weights_path = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    for path in (config_path, weights_path):
        if not path.is_file():
            raise FileNotFoundError(f"no {path.name} in {directory}")
    meta = read_json(config_path, "adapter config")
    if not isinstance(meta, dict):
        raise ValueError(f"{config_path}: expected a JSON object, got {type(meta).__name__}")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{config_path}: adapter format_version {meta.get('format_version')!r}; this "
            f"version reads {FORMAT_VERSION}"
        )
    missing = [key for key in ("base_model_type", "config") if key not in meta]
    if missing or not isinstance(meta["config"], dict):
        raise ValueError(f"{config_path} is not an adapter config (missing {missing or 'config'})")
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if meta["base_model_type"] != model_type:
        raise ValueError(
            f"adapter was saved for a {meta['base_model_type']!r} model, got {model_type!r} "
            f"({config_path})"
        )
    try:
        config = config_from_dict(meta["config"])
    except (TypeError, ValueError) as error:
        raise ValueError(f"{config_path}: {error}") from None
    tensors = read_safetensors(weights_path, "adapter weights file")
    wrapped = get_peft_model(model, config)
    try:
        wrapped.load_adapter_tensors(tensors)
    except ValueError as error:
        raise ValueError(f"{weights_path}: {error}") from None
    state = meta.get("state", {})
    if not isinstance(state, dict):
        raise ValueError(f"{config_path}: adapter state must be a JSON object, got {state!r}")
    try:
        wrapped.load_extra_state(state)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{config_path}: bad adapter state {state!r} ({error})") from None
    return wrapped
