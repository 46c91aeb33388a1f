"""Saving and loading learning-curve PFNs: safetensors weights next to a JSON config.

`save_pfn(model, "dir/name.safetensors")` writes `dir/name.safetensors` and `dir/name.json`;
given a directory it writes `pfn.safetensors` and `pfn.json` inside. The JSON holds the
`PFNConfig`, a format tag and free-form metadata (how the weights were trained). Loading reads
tensors only (safetensors cannot hold code), so a checkpoint cannot execute anything.

Example:
    >>> import tempfile
    >>> from freeze_thaw_bo.pfn.model import LearningCurvePFN, PFNConfig
    >>> model = LearningCurvePFN(PFNConfig(d_model=16, num_layers=1, num_bars=32))
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = save_pfn(model, tmp)
    ...     loaded = load_pfn(path)
    >>> loaded.config == model.config
    True
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from importlib import resources
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from freeze_thaw_bo.pfn.model import LearningCurvePFN, PFNConfig

__all__ = [
    "DEFAULT_WEIGHTS",
    "default_weights_path",
    "load_default_pfn",
    "load_pfn",
    "read_pfn_metadata",
    "save_pfn",
]

FORMAT = "freeze-thaw-bo/learning-curve-pfn"
FORMAT_VERSION = 1
DEFAULT_WEIGHTS = "ftpfn_small.safetensors"


def _paths(path: str | Path) -> tuple[Path, Path]:
    """(weights, config) paths for a weights file, a JSON file or a directory."""
    path = Path(path)
    if path.suffix in (".safetensors", ".json"):
        return path.with_suffix(".safetensors"), path.with_suffix(".json")
    return path / "pfn.safetensors", path / "pfn.json"


def save_pfn(
    model: LearningCurvePFN, path: str | Path, *, metadata: dict[str, Any] | None = None
) -> Path:
    """Write `model`'s weights (safetensors) and config (JSON); return the weights' path.

    `path` is a `.safetensors` (or `.json`) file name, or a directory (created if missing).
    """
    if not isinstance(model, LearningCurvePFN):
        raise TypeError(f"model must be a LearningCurvePFN, got {type(model).__name__}")
    weights, config = _paths(path)
    weights.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().cpu().contiguous() for name, t in model.state_dict().items()}
    save_file(tensors, str(weights), metadata={"format": FORMAT})
    document = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": asdict(model.config),
        "metadata": metadata or {},
    }
    config.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    weights.chmod(config.stat().st_mode & 0o777)  # safetensors writes 0600; follow the umask
    return weights


def read_pfn_metadata(path: str | Path) -> dict[str, Any]:
    """The JSON document saved with a checkpoint (format, config, metadata)."""
    _, config = _paths(path)
    if not config.is_file():
        raise FileNotFoundError(f"no PFN config at {config}")
    document = json.loads(config.read_text())
    if document.get("format") != FORMAT:
        raise ValueError(f"{config} is not a {FORMAT} config (format {document.get('format')!r})")
    if document.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{config} has format version {document.get('format_version')}, this library reads "
            f"version {FORMAT_VERSION}"
        )
    return document


def load_pfn(path: str | Path, *, device: str = "cpu") -> LearningCurvePFN:
    """Load a model saved by `save_pfn` (pass the weights file, the JSON or the directory)."""
    weights, _ = _paths(path)
    if not weights.is_file():
        raise FileNotFoundError(f"no PFN weights at {weights}")
    document = read_pfn_metadata(path)
    known = {f.name for f in fields(PFNConfig)}
    unknown = set(document["config"]) - known
    if unknown:
        raise ValueError(f"{weights}: unknown config fields {sorted(unknown)}")
    model = LearningCurvePFN(PFNConfig(**document["config"]))
    model.load_state_dict(load_file(str(weights), device=device), strict=True)
    return model.to(device).eval()


def default_weights_path() -> Path:
    """Where the shipped weights live inside the installed package."""
    return Path(str(resources.files("freeze_thaw_bo").joinpath("weights", DEFAULT_WEIGHTS)))


def load_default_pfn() -> LearningCurvePFN:
    """The shipped model (`weights/ftpfn_small.safetensors`), trained on the prior on CPU."""
    path = default_weights_path()
    if not path.is_file() or not path.with_suffix(".json").is_file():
        raise FileNotFoundError(
            f"the shipped PFN weights are missing ({path}); recreate them with "
            f"`freeze-thaw-bo train-surrogate --out {path}` (about 10 minutes on one CPU core) "
            "or pass your own model: PFNSurrogate(load_pfn(path))"
        )
    return load_pfn(path)
