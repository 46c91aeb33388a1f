"""safetensors + JSON serialisation of optimizer state and RNG state (no pickle anywhere).

An optimizer's ``state_dict()`` is split into its tensors (stored in safetensors under
``{prefix}.{param index}.{key}``) and everything else (param groups, plain numbers: JSON). Loading
rebuilds the same dict and hands it to ``optimizer.load_state_dict``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from kernels_common import cli

__all__ = [
    "check_safetensors",
    "merge_optimizer_state",
    "read_json",
    "split_optimizer_state",
    "write_json",
]


def split_optimizer_state(
    optimizer: torch.optim.Optimizer, prefix: str
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(tensors, json_part)`` of ``optimizer.state_dict()``."""
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    plain: dict[str, dict[str, Any]] = {}
    for index, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{prefix}.{index}.{key}"] = value.detach().contiguous().cpu()
            else:
                plain.setdefault(str(index), {})[key] = value
    groups = [
        {k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items()}
        for group in state["param_groups"]
    ]
    return tensors, {"param_groups": groups, "plain_state": plain}


def merge_optimizer_state(
    optimizer: torch.optim.Optimizer,
    tensors: dict[str, torch.Tensor],
    json_part: dict[str, Any],
    prefix: str,
) -> None:
    """Load what :func:`split_optimizer_state` produced into ``optimizer``."""
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith(prefix + "."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = value
    for index, entry in json_part["plain_state"].items():
        state.setdefault(int(index), {}).update(entry)
    groups = []
    for group in json_part["param_groups"]:
        groups.append({k: (tuple(v) if k == "betas" else v) for k, v in group.items()})
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` whole or not at all (temporary name, then one rename)."""
    text = json.dumps(data, indent=1, sort_keys=True, allow_nan=False)
    with cli.atomic_file(path) as temporary:
        temporary.write_text(text)


def read_json(path: Path, keys: tuple[str, ...] = ()) -> dict:
    """A checkpoint's JSON object; a missing, truncated or incomplete file raises
    ``FileNotFoundError`` / ``ValueError`` naming it."""
    data = cli.read_json(path, "checkpoint file")
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a checkpoint file (expected a JSON object)")
    missing = [key for key in keys if key not in data]
    if missing:
        raise ValueError(f"{path} is not a complete checkpoint file (no {', '.join(missing)})")
    return data


def check_safetensors(path: Path, keys: tuple[str, ...] = ()) -> None:
    """Raise ``FileNotFoundError`` / ``ValueError`` naming ``path`` when it is missing, truncated,
    not safetensors or lacks one of ``keys``; reads the header only."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as handle:
            present = set(handle.keys())
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(
            f"{path} is not a readable checkpoint file (truncated or not safetensors: "
            f"{str(error).strip()})"
        ) from None
    missing = [key for key in keys if key not in present]
    if missing:
        raise ValueError(f"{path} is not a complete checkpoint file (no {', '.join(missing)})")
