"""What every selection method returns, saved as one JSON file.

A :class:`Selection` holds the chosen pool indices, optional elastic token weights for each
chosen sequence (QCS; every other method trains on whole sequences, weight 1), the method's score
of every pool example (QCS's inclusion probability ``s``, IFD, LESS's influence...), the budget,
the optimisation trace and the settings. ``save`` writes it atomically; ``load`` refuses a
missing, truncated or inconsistent file with an error naming it, never falling back to anything.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["Selection", "budget_count", "seeded"]

FORMAT_VERSION = 1


def seeded(seed: int, stream: str) -> torch.Generator:
    """A generator for one named use of a user's ``seed``: different uses (the noise, a random
    selection, LESS's warm-up subset, QCS's draws) get independent streams, so two of them
    seeded alike never pick the same examples by construction."""
    return torch.Generator().manual_seed(int(seed) * 1_000_003 + zlib.crc32(stream.encode()))


def budget_count(budget: float, pool_size: int) -> int:
    """Sequences a budget fraction allows: ``round(budget · n)``, at least 1."""
    if isinstance(budget, bool) or not isinstance(budget, int | float) or not 0 < budget <= 1:
        raise ValueError(f"budget must be a fraction in (0, 1], got {budget!r}")
    if pool_size < 1:
        raise ValueError("the pool is empty")
    return max(1, round(budget * pool_size))


@dataclass
class Selection:
    """A coreset of a pool.

    Attributes:
        method: ``"qcs"``, ``"qcs-seq"``, ``"less"``, ``"ifd"``, ``"random"`` or ``"full"``.
        indices: ``(k,)`` int64 chosen pool indices, sorted.
        scores: ``(n,)`` float64 the method's score of every pool example.
        budget: the sequence budget (fraction of the pool).
        token_weights: chosen index -> float32 weights over its response tokens (``None``: 1).
        trace: per-step records of an iterative method.
        settings: the configuration, JSON-ready.
        seconds: wall-clock of the selection.
    """

    method: str
    indices: torch.Tensor
    scores: torch.Tensor
    budget: float
    token_weights: dict[int, torch.Tensor] | None = None
    trace: list[dict[str, float]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.indices = torch.as_tensor(self.indices, dtype=torch.long).reshape(-1)
        self.scores = torch.as_tensor(self.scores, dtype=torch.float64).reshape(-1)
        n = self.scores.numel()
        if self.indices.numel() == 0:
            raise ValueError("a selection needs at least one sequence")
        if int(self.indices.min()) < 0 or int(self.indices.max()) >= n:
            raise ValueError(f"indices must lie in [0, {n}) (one score per pool example)")
        if torch.unique(self.indices).numel() != self.indices.numel():
            raise ValueError("indices repeat a sequence")
        self.indices = torch.sort(self.indices).values
        if self.token_weights is not None:
            extra = set(self.token_weights) - set(self.indices.tolist())
            if extra:
                raise ValueError(f"token weights for unselected sequences {sorted(extra)[:5]}")

    def __len__(self) -> int:
        return self.indices.numel()

    @property
    def pool_size(self) -> int:
        return self.scores.numel()

    def weights_for(self, lengths) -> list[torch.Tensor] | None:
        """One weight vector per pool example (1 where no token weights were learned), or
        ``None`` when the selection has no token weights."""
        if self.token_weights is None:
            return None
        lengths = [int(n) for n in lengths]
        if len(lengths) != self.pool_size:
            raise ValueError(f"{len(lengths)} lengths for a pool of {self.pool_size}")
        out = [torch.ones(n) for n in lengths]
        for i, w in self.token_weights.items():
            if w.numel() != lengths[i]:
                raise ValueError(
                    f"sequence {i}: {w.numel()} token weights for {lengths[i]} response tokens "
                    "(a selection made on a different tokenization?)"
                )
            out[i] = w.float()
        return out

    def save(self, path: str | Path) -> Path:
        """Write the selection as JSON at ``path`` (atomically)."""
        from kernels_common.cli import atomic_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "format_version": FORMAT_VERSION,
            "method": self.method,
            "budget": self.budget,
            "pool_size": self.pool_size,
            "indices": self.indices.tolist(),
            "scores": [s if math.isfinite(s) else None for s in self.scores.tolist()],
            "token_weights": None if self.token_weights is None else {
                str(i): w.tolist() for i, w in sorted(self.token_weights.items())
            },
            "trace": self.trace,
            "settings": self.settings,
            "seconds": self.seconds,
        }  # fmt: skip
        with atomic_file(path) as temporary:
            temporary.write_text(json.dumps(meta, allow_nan=False) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Selection:
        """Read a file written by :meth:`save`."""
        from kernels_common.cli import read_json

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no selection file at {path} (written by Selection.save)")
        meta = read_json(path, "selection")
        if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
            version = meta.get("format_version") if isinstance(meta, dict) else None
            raise ValueError(f"{path} is not a readable selection (format_version {version!r}, "
                             f"expected {FORMAT_VERSION})")  # fmt: skip
        try:
            scores = [math.nan if s is None else s for s in meta["scores"]]
            if len(scores) != meta["pool_size"]:
                raise ValueError(f"{len(scores)} scores for a pool of {meta['pool_size']}")
            weights = meta["token_weights"]
            return cls(
                method=meta["method"], indices=meta["indices"], scores=scores,
                budget=meta["budget"], trace=meta["trace"], settings=meta["settings"],
                seconds=float(meta["seconds"]),
                token_weights=None if weights is None else {
                    int(i): torch.tensor(w, dtype=torch.float32) for i, w in weights.items()
                },
            )  # fmt: skip
        except KeyError as error:
            raise ValueError(f"{path} is not a readable selection (missing {error})") from None
        except (TypeError, ValueError) as error:
            raise ValueError(f"{path} is not a readable selection: {error}") from None
