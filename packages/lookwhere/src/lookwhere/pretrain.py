"""Label-free distillation pre-training of the selector and extractor, as the anchor's JAX code.

Per step: the frozen teacher sees the whole high-resolution image and gives its CLS, every patch
feature and its attention map (last block, pre-softmax logits averaged over heads and patch
queries, at patch keys). The selector maps the image; a fixed top-`k_max` of its map is kept, and
a per-step `k ~ U[k_min, k_max]` is realised by hiding kept slots beyond `k` as keys. The extractor
runs on the kept tokens after the selector's CLS and registers, and its patch outputs are
IDW-5 upsampled (hidden slots excluded) to the full grid. Loss:

    MSE(CLS) + MSE(upsampled patches, all teacher patches) + 0.1 KL(teacher map || selector map)

MSEs average over channels (and patches); the KL is between the softmaxes over the patch grid,
summed over patches, teacher first (`kl_divergence_with_log_targets(log_softmax(selector),
log_softmax(teacher))` in the anchor); every term averages over the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from lookwhere.data import ImageTask
from lookwhere.model import LookWhere, idw_upsample, topk_indices
from lookwhere.train import TrainConfig, device_of, optimise, uniform_k
from lookwhere.vit import ViT

LOSS_WEIGHTS = {"cls": 1.0, "patch": 1.0, "map": 0.1}


class TeacherOutput(Protocol):
    """What a teacher must give: CLS `(B, D)`, patches `(B, N, D)`, attention map `(B, N)`."""

    cls: torch.Tensor
    patches: torch.Tensor
    attention: torch.Tensor | None


Teacher = Callable[[torch.Tensor], TeacherOutput]


def teacher_outputs(teacher: ViT | Teacher, images: torch.Tensor) -> TeacherOutput:
    """The teacher's CLS, patch features and attention map on `images`, without gradients.

    A `ViT` is asked for its attention map; any other callable must return an object with
    `cls`, `patches` and `attention`. The teacher itself is left as it is (its parameters'
    `requires_grad` untouched): it runs under `no_grad`.
    """
    with torch.no_grad():
        out = (
            teacher(images, return_attention=True) if isinstance(teacher, ViT) else teacher(images)
        )
    for name in ("cls", "patches", "attention"):
        if getattr(out, name, None) is None:
            raise ValueError(
                f"the teacher gave no {name!r}: LookWhere distils the teacher's CLS, patch "
                "features and attention map (return an object with cls, patches and attention)"
            )
    if out.patches.dim() != 3:
        raise ValueError(
            f"the teacher's patches are {tuple(out.patches.shape)}; expected (B, N, D)"
        )
    batch, _, dim = out.patches.shape
    if out.cls.shape != (batch, dim):
        raise ValueError(
            f"the teacher's cls is {tuple(out.cls.shape)}; expected (B, D) = {(batch, dim)}, "
            "as its patches (a (B, 1, D) slice such as last_hidden_state[:, :1] needs [:, 0])"
        )
    if out.attention.shape != out.patches.shape[:2]:
        raise ValueError(
            f"the teacher's attention map is {tuple(out.attention.shape)}; expected one logit per "
            f"patch, {tuple(out.patches.shape[:2])}"
        )
    return out


@dataclass
class LossTerms:
    """The three distillation terms (batch means) and their weighted total."""

    cls: torch.Tensor
    patch: torch.Tensor
    map: torch.Tensor
    total: torch.Tensor


def kl_teacher_selector(teacher_map: torch.Tensor, selector_map: torch.Tensor) -> torch.Tensor:
    """`KL(softmax(teacher) || softmax(selector))` over the patch axis, per image `(B,)`."""
    log_t = F.log_softmax(teacher_map.float(), dim=-1)
    log_s = F.log_softmax(selector_map.float(), dim=-1)
    return (log_t.exp() * (log_t - log_s)).sum(dim=-1)


def distillation_loss(
    student_cls: torch.Tensor,
    student_patches: torch.Tensor,
    selector_map: torch.Tensor,
    teacher: TeacherOutput,
    weights: dict[str, float] = LOSS_WEIGHTS,
) -> LossTerms:
    """The pre-training loss.

    Args:
        student_cls: The extractor's CLS `(B, D)`.
        student_patches: Its patch outputs upsampled to the full grid `(B, N, D)`.
        selector_map: The selector's saliency logits `(B, N)`.
        teacher: The teacher's outputs on the same images.
        weights: Weights of the "cls", "patch" and "map" terms (the anchor: 1, 1, 0.1).

    Returns:
        The terms and their weighted sum.
    """
    if student_patches.shape != teacher.patches.shape:
        raise ValueError(
            f"student patches {tuple(student_patches.shape)} vs teacher patches "
            f"{tuple(teacher.patches.shape)}: the extractor and teacher grids must match"
        )
    if student_cls.shape != teacher.cls.shape or student_cls.dim() != 2:
        raise ValueError(
            f"student cls {tuple(student_cls.shape)} vs teacher cls {tuple(teacher.cls.shape)}: "
            "both must be (B, D), the same shape (no broadcasting)"
        )
    cls = (student_cls - teacher.cls).pow(2).mean(dim=-1).mean()
    patch = (student_patches - teacher.patches).pow(2).mean(dim=(-1, -2)).mean()
    kl = kl_teacher_selector(teacher.attention, selector_map).mean()
    total = weights["cls"] * cls + weights["patch"] * patch + weights["map"] * kl
    return LossTerms(cls=cls, patch=patch, map=kl, total=total)


def distillation_step(
    model: LookWhere,
    teacher: ViT | Teacher,
    images: torch.Tensor,
    k: int,
    k_max: int,
    weights: dict[str, float] = LOSS_WEIGHTS,
) -> LossTerms:
    """One pre-training forward: fixed top-`k_max` of the selector map, the first `k` visible."""
    if not 1 <= k <= k_max:
        raise ValueError(f"k = {k} must be in [1, k_max = {k_max}]")
    target = teacher_outputs(teacher, images)
    selected = model.selector(images)
    indices = topk_indices(selected.saliency.detach(), k_max)
    valid = (torch.arange(k_max, device=images.device) < k).expand(images.shape[0], -1)
    features = model.extractor(images, selected.prefix, indices, valid)
    upsampled = idw_upsample(features.patches, indices, model.extractor.grid, valid=valid)
    return distillation_loss(features.cls, upsampled, selected.saliency, target, weights)


def pretrain(
    model: LookWhere,
    teacher: ViT | Teacher,
    task: ImageTask,
    config: TrainConfig,
    *,
    k_range: tuple[int, int] = (16, 128),
    weights: dict[str, float] = LOSS_WEIGHTS,
    progress: str | None = None,
) -> list[dict[str, float]]:
    """Distil `teacher` into `model`'s selector and extractor on `task`'s images (labels unused).

    Args:
        model: A LookWhere model (e.g. from `lookwhere_from_teacher`); its head is not trained.
        teacher: A frozen ViT, or any callable giving `cls`, `patches` and `attention`.
        task: The images to distil on.
        config: Optimisation settings (the anchor: AdamW, warm-up cosine).
        k_range: `(k_min, k_max)`, the per-step number of visible tokens (the anchor: 16..128).
        weights: Weights of the three terms.
        progress: A progress-bar label (the bar shows only when stderr is a terminal), or None.

    Returns:
        Per step, the three terms and the total.
    """
    k_min, k_max = k_range
    patches = model.extractor.grid**2
    if not 1 <= k_min <= k_max <= patches:
        raise ValueError(f"k_range {k_range} must satisfy 1 <= k_min <= k_max <= {patches}")
    log: list[dict[str, float]] = []
    params = [*model.selector.parameters(), *model.extractor.parameters()]
    device = device_of(model)

    def loss_fn(indices: torch.Tensor, _step: int, generator: torch.Generator) -> torch.Tensor:
        k = uniform_k(k_min, k_max, generator)
        images = task.floats(indices).to(device)
        terms = distillation_step(model, teacher, images, k, k_max, weights)
        log.append({name: float(getattr(terms, name).detach()) for name in LOSS_WEIGHTS})
        log[-1]["total"] = float(terms.total.detach())
        return terms.total

    optimise(model, loss_fn, len(task), config, params=params, progress=progress)
    return log
