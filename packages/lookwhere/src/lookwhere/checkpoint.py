"""Saving and loading models: a folder with ``lookwhere.json`` (what to build) and
``model.safetensors`` (the weights). Nothing is unpickled; a missing, truncated or foreign file is
an error that names it."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from lookwhere.baselines import DenseClassifier
from lookwhere.model import Extractor, LookWhere, Selector
from lookwhere.vit import ViT, ViTConfig

FORMAT_VERSION = 1
CONFIG_FILE = "lookwhere.json"
WEIGHTS_FILE = "model.safetensors"


def describe(model: nn.Module) -> dict:
    """What `build` needs to rebuild `model` (a LookWhere model or a dense ViT classifier)."""
    if isinstance(model, LookWhere):
        return {
            "kind": "lookwhere",
            "selector": model.selector.vit.config.to_dict(),
            "extractor": model.extractor.vit.config.to_dict(),
            "subgrid": model.selector.subgrid,
            "num_classes": 0 if isinstance(model.head, nn.Identity) else model.head.out_features,
            "k": model.k,
            "dense": model.dense,
        }
    if isinstance(model, DenseClassifier) and type(model) is DenseClassifier:
        return {
            "kind": "vit",
            "vit": model.vit.config.to_dict(),
            "num_classes": model.head.out_features,
        }
    raise TypeError(f"cannot save a {type(model).__name__}: save a LookWhere or DenseClassifier")


def build(spec: dict) -> nn.Module:
    """A freshly initialised model from `describe`'s dict."""
    kind = spec.get("kind")
    if kind == "lookwhere":
        extractor = Extractor(ViT(ViTConfig(**spec["extractor"])))
        selector = Selector(ViT(ViTConfig(**spec["selector"])), extractor.grid, spec["subgrid"])
        return LookWhere(selector, extractor, spec["num_classes"], spec["k"], dense=spec["dense"])
    if kind == "vit":
        return DenseClassifier(ViT(ViTConfig(**spec["vit"])), spec["num_classes"])
    raise ValueError(f"unknown model kind {kind!r} (expected 'lookwhere' or 'vit')")


def save(model: nn.Module, folder: str | Path, extra: dict | None = None) -> Path:
    """Write `model` (and JSON-ready `extra` metadata) into `folder`, atomically."""
    from safetensors.torch import save_file

    from kernels_common.cli import atomic_folder

    spec = {"format_version": FORMAT_VERSION, "model": describe(model), "extra": extra or {}}
    with atomic_folder(folder) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(spec, indent=2) + "\n")
        state = {key: value.detach().contiguous() for key, value in model.state_dict().items()}
        save_file(state, str(tmp / WEIGHTS_FILE))
    return Path(folder)


def load(folder: str | Path) -> tuple[nn.Module, dict]:
    """The model saved in `folder` (eval mode) and its `extra` metadata."""
    from kernels_common.cli import read_json, read_safetensors

    folder = Path(folder)
    spec = read_json(folder / CONFIG_FILE, "lookwhere model description")
    if not isinstance(spec, dict) or spec.get("format_version") != FORMAT_VERSION:
        version = spec.get("format_version") if isinstance(spec, dict) else None
        raise ValueError(
            f"{folder / CONFIG_FILE}: format_version {version!r}, expected {FORMAT_VERSION}"
        )
    try:
        model = build(spec["model"])
    except (KeyError, TypeError) as error:
        raise ValueError(f"{folder / CONFIG_FILE}: not a model description ({error})") from error
    state = read_safetensors(folder / WEIGHTS_FILE, "lookwhere weights")
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as error:  # a tensor of another shape
        raise ValueError(
            f"{folder / WEIGHTS_FILE} does not fit {folder / CONFIG_FILE}: {error}"
        ) from None
    if missing or unexpected:
        raise ValueError(
            f"{folder / WEIGHTS_FILE} does not fit {folder / CONFIG_FILE}: missing "
            f"{missing[:3]}, unexpected {unexpected[:3]}"
        )
    return model.eval(), spec.get("extra", {})


def state_equal(a: nn.Module, b: nn.Module) -> bool:
    """Whether two models hold bit-identical weights."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
