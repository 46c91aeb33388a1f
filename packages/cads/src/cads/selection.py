"""What a selection method returns, how it turns into training examples, and how it is judged.

A :class:`Selection` holds the learned probabilities (one per example, or one sampling ratio per
source), the chosen example indices, the trace of the outer objective and the settings. It saves
as ``selection.json`` (settings, trace, indices) + ``selection.safetensors`` (the probabilities)
and loads back exactly; a missing, truncated or mismatched file is an error, never a silent
fallback.

The chosen examples are deterministic: at the example level the ``round(Σ s_i)`` examples of
highest probability (the expected size of the learned distribution); at the source level
``round(s_j · n_j)`` examples of each source ``j``, taken in a seeded order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cads.budget import (
    ComputeBudget,
    InnerConfig,
    as_budget,
    first_batch_flops,
    train_under_budget,
)
from cads.task import SelectionTask, evaluate

__all__ = ["LEVELS", "Selection", "evaluate_selection", "indices_from_probabilities"]

LEVELS = ("example", "source")
FORMAT_VERSION = 1
JSON_FILE, TENSOR_FILE = "selection.json", "selection.safetensors"


def indices_from_probabilities(
    probabilities: torch.Tensor, level: str, sources: torch.Tensor, seed: int = 0
) -> torch.Tensor:
    """Sorted example indices ``(k,)`` (int64) a learned distribution selects (see above)."""
    if level == "example":
        keep = round(float(probabilities.sum()))
        order = torch.argsort(probabilities.double(), descending=True, stable=True)
        return torch.sort(order[:keep]).values
    generator = torch.Generator().manual_seed(seed)
    chosen = []
    for j, ratio in enumerate(probabilities.tolist()):
        members = torch.nonzero(sources == j).flatten()
        order = members[torch.randperm(members.numel(), generator=generator)]
        chosen.append(order[: round(ratio * members.numel())])
    return torch.sort(torch.cat(chosen)).values


@dataclass
class Selection:
    """The result of :func:`cads.select`.

    Attributes:
        method: ``"cads-e"``, ``"cads-s"``, ``"bilevel-e"``, ``"implicit-s"``, ``"el2n"``...
        level: ``"example"`` or ``"source"``: what ``probabilities`` are over.
        probabilities: ``(n,)`` float64 inclusion probabilities (example level) or sampling
            ratios (source level); for a score baseline, its 0/1 choice.
        indices: ``(k,)`` int64 the chosen pool examples, sorted.
        budget: the compute budget selected for.
        trace: one dict per outer step (objective, validation loss, ``expected_size``:
            ``Σ w s`` after the step, the size the projection constrains; for the sampling
            methods ``expected_draw_size``: the expected examples of the step's draws, ...).
        settings: the configuration, JSON-serialisable.
        source_names: the task's sources, for reading ``probabilities`` at the source level.
        seconds: wall-clock of the selection (scoring or outer optimisation, surrogate included).
        model: CADS's jointly trained model ``θ*`` (not saved; ``None`` for other methods).
    """

    method: str
    level: str
    probabilities: torch.Tensor
    indices: torch.Tensor
    budget: ComputeBudget
    trace: list[dict[str, float]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    source_names: tuple[str, ...] = ()
    seconds: float = 0.0
    model: torch.nn.Module | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {self.level!r}")
        self.probabilities = torch.as_tensor(self.probabilities, dtype=torch.float64)
        self.indices = torch.as_tensor(self.indices, dtype=torch.long)
        if self.probabilities.dim() != 1 or self.indices.dim() != 1:
            raise ValueError("probabilities and indices must be vectors")
        self.source_names = tuple(self.source_names)

    def __len__(self) -> int:
        return self.indices.numel()

    def save(self, folder: str | Path) -> Path:
        """Write ``selection.json`` + ``selection.safetensors`` into ``folder`` (atomically)."""
        from safetensors.torch import save_file

        from kernels_common.cli import atomic_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        meta = {
            "format_version": FORMAT_VERSION,
            "method": self.method,
            "level": self.level,
            "budget": {"amount": self.budget.amount, "unit": self.budget.unit},
            "indices": self.indices.tolist(),
            "trace": self.trace,
            "settings": self.settings,
            "source_names": list(self.source_names),
            "seconds": self.seconds,
        }
        with atomic_file(folder / TENSOR_FILE) as temporary:
            save_file({"probabilities": self.probabilities.contiguous()}, str(temporary))
        with atomic_file(folder / JSON_FILE) as temporary:
            temporary.write_text(json.dumps(meta, indent=1, allow_nan=False) + "\n")
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> Selection:
        """Read a folder written by :meth:`save`; refuses missing or inconsistent files."""
        from kernels_common.cli import read_json, read_safetensors

        folder = Path(folder)
        for name in (JSON_FILE, TENSOR_FILE):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"no {name} in {folder} (written by Selection.save)")
        # truncated or foreign files: a ValueError naming the file
        meta = read_json(folder / JSON_FILE, "selection")
        tensors = read_safetensors(folder / TENSOR_FILE, "selection")
        if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
            version = meta.get("format_version") if isinstance(meta, dict) else None
            raise ValueError(
                f"{folder / JSON_FILE} is not a readable selection "
                f"(format_version {version!r}, expected {FORMAT_VERSION})"
            )
        try:
            probabilities = tensors["probabilities"]
            budget = ComputeBudget(meta["budget"]["amount"], meta["budget"]["unit"])
            selection = cls(
                method=meta["method"],
                level=meta["level"],
                probabilities=probabilities,
                indices=torch.tensor(meta["indices"], dtype=torch.long),
                budget=budget,
                trace=meta["trace"],
                settings=meta["settings"],
                source_names=tuple(meta["source_names"]),
                seconds=float(meta["seconds"]),
            )
        except (KeyError, TypeError) as error:
            raise ValueError(f"{folder} is not a readable selection (missing {error})") from None
        if (
            selection.level == "example"
            and selection.indices.numel()
            and (int(selection.indices.max()) >= len(probabilities))
        ):
            raise ValueError(f"{folder}: indices beyond the {len(probabilities)} probabilities")
        if selection.level == "source" and len(selection.source_names) != len(probabilities):
            raise ValueError(
                f"{folder}: {len(probabilities)} ratios for {len(selection.source_names)} sources"
            )
        return selection


def evaluate_selection(
    task: SelectionTask,
    selection: Selection | torch.Tensor,
    budget: ComputeBudget | int,
    inner: InnerConfig = InnerConfig(),
    *,
    seed: int = 0,
) -> dict[str, float]:
    """Train a fresh model (``model_fn(seed)``) on the selected examples for exactly ``budget``
    and report its validation and test metrics: the one test-set measurement of a selection.

    ``selection`` is a :class:`Selection` or a vector ``(k,)`` of distinct integer pool indices.
    """
    budget = as_budget(budget)
    indices = selection.indices if isinstance(selection, Selection) else torch.as_tensor(selection)
    if indices.numel() == 0:
        raise ValueError("the selection is empty: there is nothing to train on")
    if indices.dtype == torch.bool or indices.is_floating_point() or indices.is_complex():
        raise ValueError(f"selection indices must be integers, got dtype {indices.dtype}")
    if indices.dim() != 1:
        raise ValueError(f"selection indices must be a vector (k,), got {tuple(indices.shape)}")
    if indices.min() < 0 or indices.max() >= len(task):
        raise ValueError(f"selection indices must lie in [0, {len(task)}) for this task")
    if torch.unique(indices).numel() != indices.numel():
        raise ValueError(
            f"selection indices must be distinct: {indices.numel()} indices name "
            f"{torch.unique(indices).numel()} examples"
        )
    indices = indices.long()
    model = task.model_fn(seed)
    flops_per_step = first_batch_flops(model, task.loss_fn, task.inputs, task.targets, indices,
                                       inner.batch_size)  # fmt: skip
    log = train_under_budget(
        model,
        task.inputs,
        task.targets,
        indices,
        budget,
        task.loss_fn,
        inner,
        generator=torch.Generator().manual_seed(seed + 1),
        flops_per_step=flops_per_step,
    )
    val = evaluate(model, task.val_inputs, task.val_targets, task.loss_fn)
    test = evaluate(model, task.test_inputs, task.test_targets, task.loss_fn)
    result = {f"val_{k}": v for k, v in val.items()} | {f"test_{k}": v for k, v in test.items()}
    result |= {"size": indices.numel(), "steps": log.steps, "flops": log.flops}
    return result
