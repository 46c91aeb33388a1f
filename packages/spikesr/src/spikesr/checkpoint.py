"""Saving and loading models as one ``.safetensors`` file: the weights, and in its metadata what
to build (``{"kind": "spikesr", "config": {...}}`` or ``{"kind": "edsr", ...}``). Nothing is
unpickled; a missing, truncated or foreign file is an error that names it."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import torch
from torch import nn

from spikesr.baselines import EDSR
from spikesr.model import SCALES, SpikeSR, SpikeSRConfig

FORMAT_VERSION = "1"


def describe(model: nn.Module) -> dict:
    """What :func:`build` needs to rebuild ``model``."""
    if isinstance(model, SpikeSR):
        return {"kind": "spikesr", "config": model.config.to_dict()}
    if isinstance(model, EDSR):
        return {"kind": "edsr", "scale": model.scale, "width": model.width, "blocks": model.blocks}
    raise TypeError(f"cannot save a {type(model).__name__}: save a SpikeSR or EDSR model")


def build(spec: dict) -> nn.Module:
    """A freshly initialised model from :func:`describe`'s dict."""
    kind = spec.get("kind")
    if kind == "spikesr":
        return SpikeSR(SpikeSRConfig(**spec["config"]))
    if kind == "edsr":
        return EDSR(spec["scale"], spec["width"], spec["blocks"])
    raise ValueError(f"unknown model kind {kind!r} (expected 'spikesr' or 'edsr')")


def save(
    model: nn.Module, path: str | Path, extra: dict | None = None, *, half: bool = False
) -> Path:
    """Write ``model`` (weights in float16 if ``half``) and JSON-ready ``extra`` to ``path``."""
    from safetensors.torch import save_file

    from kernels_common.cli import atomic_file

    dtype = torch.float16 if half else None
    state = {}
    for key, value in model.state_dict().items():
        value = value.detach().cpu().contiguous()
        state[key] = value.to(dtype) if dtype is not None and value.is_floating_point() else value
    metadata = {
        "format_version": FORMAT_VERSION,
        "model": json.dumps(describe(model)),
        "extra": json.dumps(extra or {}),
    }
    with atomic_file(path) as tmp:
        save_file(state, str(tmp), metadata=metadata)
    return Path(path)


def load(path: str | Path) -> tuple[nn.Module, dict]:
    """The model saved at ``path`` (float32, eval mode) and its ``extra`` metadata."""
    from safetensors import SafetensorError, safe_open

    from kernels_common.cli import read_safetensors

    path = Path(path)
    state = read_safetensors(path, "spikesr weights file")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except SafetensorError as error:  # read_safetensors already vouched for the file
        raise ValueError(f"{path}: unreadable metadata ({error})") from None
    if metadata.get("format_version") != FORMAT_VERSION or "model" not in metadata:
        raise ValueError(
            f"{path} is not a spikesr weights file (metadata format_version "
            f"{metadata.get('format_version')!r}, expected {FORMAT_VERSION!r})"
        )
    try:
        model = build(json.loads(metadata["model"]))
    except (KeyError, TypeError, ValueError) as error:  # JSONDecodeError is a ValueError
        detail = f"missing {error}" if isinstance(error, KeyError) else str(error)
        raise ValueError(f"{path}: its model metadata describes no model ({detail})") from None
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    mismatch = state_mismatch(model.state_dict(), state)
    if mismatch:
        raise ValueError(f"{path}: its weights do not fit the model in its metadata ({mismatch})")
    model.load_state_dict(state)
    return model.eval(), json.loads(metadata.get("extra", "{}"))


def state_mismatch(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor]) -> str:
    """What differs between two state dicts, in a line ("" if they have the same keys and
    shapes); up to three names of each kind."""

    def some(names: list[str]) -> str:
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    parts = []
    missing = [k for k in expected if k not in found]
    if missing:
        parts.append(f"missing {some(missing)}")
    unexpected = [k for k in found if k not in expected]
    if unexpected:
        parts.append(f"unexpected {some(unexpected)}")
    shapes = [
        f"{k} {tuple(found[k].shape)} instead of {tuple(v.shape)}"
        for k, v in expected.items()
        if k in found and found[k].shape != v.shape
    ]
    if shapes:
        parts.append(f"shapes {some(shapes)}")
    return "; ".join(parts)


def pretrained_path(scale: int) -> Path:
    """The shipped weights for ``scale`` (trained by the command in the README)."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale}")
    return Path(str(resources.files("spikesr") / "weights" / f"spikesr_x{scale}.safetensors"))


def pretrained(scale: int = 4) -> SpikeSR:
    """The small SpikeSR shipped with the package for ``scale`` (eval mode)."""
    model, _ = load(pretrained_path(scale))
    return model
