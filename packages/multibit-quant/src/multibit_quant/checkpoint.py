"""Checkpoints of multi-bit models: ``model.safetensors`` (weights, LSQ steps, BatchNorm
statistics, input signs) + ``config.json`` (how to rebuild the network), loaded without pickle."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from safetensors.torch import save_file

from kernels_common.cli import atomic_folder, read_json, read_safetensors
from multibit_quant.layers import QuantConfig
from multibit_quant.model import (
    MultiBitModel,
    SwitchBatchNorm2d,
    quantize_layers,
    switch_batchnorm,
)
from multibit_quant.models import build_model

WEIGHTS, CONFIG = "model.safetensors", "config.json"
FORMAT_VERSION = 1


def save_checkpoint(
    model: MultiBitModel,
    directory: str | Path,
    architecture: dict,
    normalization: tuple[list[float], list[float]] | None = None,
) -> Path:
    """Write ``model`` to ``directory``; ``architecture`` holds :func:`build_model`'s arguments
    (``name``, ``num_classes``, ``in_channels`` and any keyword arguments under ``kwargs``), and
    ``normalization`` the per-channel pixel mean and std the model was trained with (data
    loaders take it back, so evaluation sees inputs scaled as in training)."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    per_bit_bn = any(isinstance(m, SwitchBatchNorm2d) for m in model.modules())
    meta = {
        "format_version": FORMAT_VERSION,
        "architecture": architecture,
        "trained_bits": list(model.trained_bits),
        "quant_config": asdict(model.config),
        "quantized_layers": model.quantized_names,
        "per_bit_batchnorm": per_bit_bn,
        "normalization": None if normalization is None else [list(v) for v in normalization],
    }
    directory = Path(directory)
    with atomic_folder(directory) as staging:  # both files appear together, or neither
        save_file(state, str(staging / WEIGHTS))
        (staging / CONFIG).write_text(json.dumps(meta, indent=2) + "\n")
    return directory


def build_from_meta(meta: dict) -> MultiBitModel:
    """An untrained :class:`MultiBitModel` with the layers a checkpoint's config describes."""
    arch = meta["architecture"]
    network = build_model(
        arch["name"], arch["num_classes"], arch["in_channels"], **arch.get("kwargs", {})
    )
    model = quantize_layers(
        network, meta["trained_bits"], QuantConfig(**meta["quant_config"]),
        meta["quantized_layers"],
    )  # fmt: skip
    return switch_batchnorm(model) if meta.get("per_bit_batchnorm") else model


_REQUIRED = ("architecture", "trained_bits", "quant_config", "quantized_layers")


def load_checkpoint(directory: str | Path) -> tuple[MultiBitModel, dict]:
    """The model saved by :func:`save_checkpoint` and its config."""
    directory = Path(directory)
    for name in (WEIGHTS, CONFIG):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"no {name} in {directory}: not a multibit-quant checkpoint")
    meta = read_json(directory / CONFIG, "multibit-quant checkpoint config")
    if not isinstance(meta, dict):
        raise ValueError(f"{directory / CONFIG} holds no checkpoint config (not a JSON object)")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{directory / CONFIG}: format_version {meta.get('format_version')!r}; this version "
            f"reads {FORMAT_VERSION}"
        )
    missing = [key for key in _REQUIRED if key not in meta]
    if missing:
        raise ValueError(f"{directory / CONFIG} lacks {missing}: not written by save_checkpoint")
    try:
        model = build_from_meta(meta)
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise ValueError(f"{directory / CONFIG} describes no buildable model: {error}") from None
    state = read_safetensors(directory / WEIGHTS, "multibit-quant checkpoint")
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(
            f"{directory / WEIGHTS} does not match {directory / CONFIG}: {error}"
        ) from None
    return model.eval(), meta
