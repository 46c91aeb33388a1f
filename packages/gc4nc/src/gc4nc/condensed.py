"""`CondensedGraph`: what every condensation method returns, and its on-disk form.

A folder holding `graph.safetensors` (x, labels, and the adjacency when there is one) and
`meta.json` (method, hyperparameters, seed, setting, rate definition, time, peak memory, the
tensors' sha256). Loading checks every file and the checksum: a missing or corrupt condensed
graph is an error, never a silent fallback to the original graph.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gc4nc.graph import Structure

FORMAT_VERSION = 1
TENSORS = "graph.safetensors"
META = "meta.json"


class CondensedGraphError(ValueError):
    """A condensed graph on disk is missing, incomplete or corrupt."""


@dataclass
class CondensedGraph:
    """A small synthetic graph standing in for the original's training nodes.

    Attributes:
        x: (n, F) float32 node features.
        adjacency: (n, n) symmetric non-negative weighted adjacency, or None when the method is
            structure-free (the condensed graph is then n isolated nodes: propagation is the
            identity).
        y: (n,) int64 hard labels, or (n, C) float32 soft labels (rows are distributions).
        metadata: method, hyperparameters, seed, setting, reduction rate and its definition,
            condensation seconds and peak memory bytes, original node / class counts.
    """

    x: torch.Tensor
    adjacency: torch.Tensor | None
    y: torch.Tensor
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.x.ndim != 2:
            raise ValueError(f"x must be (n, F), got {tuple(self.x.shape)}")
        n = self.x.shape[0]
        if n == 0:
            raise ValueError("a condensed graph needs at least one node")
        if self.adjacency is not None and self.adjacency.shape != (n, n):
            raise ValueError(
                f"adjacency must be (n, n) = ({n}, {n}), got {tuple(self.adjacency.shape)}"
            )
        if self.y.shape[0] != n or self.y.ndim not in (1, 2):
            raise ValueError(
                f"y must be (n,) labels or (n, C) soft labels with n = {n}, got "
                f"{tuple(self.y.shape)}"
            )
        if self.y.ndim == 1 and self.y.dtype.is_floating_point:
            raise ValueError("hard labels y must be integers")

    @property
    def num_nodes(self) -> int:
        return self.x.shape[0]

    @property
    def soft_labels(self) -> bool:
        return self.y.ndim == 2

    @property
    def hard_labels(self) -> torch.Tensor:
        """(n,) the label of each node (argmax of soft labels)."""
        return self.y.argmax(1) if self.soft_labels else self.y

    def structure(self) -> Structure:
        if self.adjacency is None:
            return Structure.identity(self.num_nodes)
        return Structure.dense(self.adjacency)

    def to(self, device: torch.device | str) -> CondensedGraph:
        adj = None if self.adjacency is None else self.adjacency.to(device)
        return CondensedGraph(self.x.to(device), adj, self.y.to(device), dict(self.metadata))

    def save(self, folder: str | Path) -> Path:
        """Write `graph.safetensors` and `meta.json` into `folder` (created)."""
        from safetensors.torch import save

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {
            "x": self.x.detach().float().contiguous().cpu(),
            "y": self.y.detach().contiguous().cpu(),
        }
        if self.adjacency is not None:
            tensors["adjacency"] = self.adjacency.detach().float().contiguous().cpu()
        blob = save(tensors)
        (folder / TENSORS).write_bytes(blob)
        meta = {
            "format": FORMAT_VERSION,
            "sha256": hashlib.sha256(blob).hexdigest(),
            "metadata": self.metadata,
        }
        (folder / META).write_text(json.dumps(meta, indent=2, sort_keys=True, default=str))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> CondensedGraph:
        """Read a folder written by `save`; CondensedGraphError if anything is missing or wrong."""
        from safetensors.torch import load

        folder = Path(folder)
        for name in (TENSORS, META):
            if not (folder / name).is_file():
                raise CondensedGraphError(
                    f"no condensed graph at {folder}: {name} is missing (run `gc4nc condense`)"
                )
        try:
            meta = json.loads((folder / META).read_text())
        except json.JSONDecodeError as error:
            raise CondensedGraphError(f"{folder / META} is not valid JSON: {error}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
            raise CondensedGraphError(
                f"{folder / META} is not a gc4nc condensed graph (format {FORMAT_VERSION})"
            )
        blob = (folder / TENSORS).read_bytes()
        if hashlib.sha256(blob).hexdigest() != meta.get("sha256"):
            raise CondensedGraphError(
                f"{folder / TENSORS} is corrupt: its sha256 does not match {META}"
            )
        tensors = load(blob)
        missing = {"x", "y"} - set(tensors)
        if missing:
            raise CondensedGraphError(f"{folder / TENSORS} lacks {sorted(missing)}")
        return cls(tensors["x"], tensors.get("adjacency"), tensors["y"], meta["metadata"])
