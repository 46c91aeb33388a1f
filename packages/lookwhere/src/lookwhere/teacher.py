"""A small full-resolution ViT teacher, trained here on the benchmark data.

No pretrained DINOv2 installs offline, so LookWhere's teacher is pluggable (any callable giving
CLS, patch features and an attention map; a DINOv2 folder through :mod:`lookwhere.hf`) and this
module trains one. It is **supervised**: at the scale a CPU trains in minutes, a self-supervised
ViT (DINO, iBOT) learns neither features nor attention that single out a small object among
clutter, and an attention map that points at the object is what the selector must learn from.
The labels are used once, to make the teacher; LookWhere's pre-training itself never sees them.

A ViT from scratch is slow to learn where a small object is, so the teacher follows a
resolution curriculum: object crops first (the global task at a low resolution, few tokens,
cheap), then progressively larger canvases, its position embeddings bicubically resized at each
stage.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from lookwhere.baselines import DenseClassifier
from lookwhere.data import ImageTask
from lookwhere.train import TrainConfig, device_of, train_classifier
from lookwhere.vit import ViT, ViTConfig, vit_at_resolution


def at_resolution(model: DenseClassifier, size: int) -> DenseClassifier:
    """A copy of `model` for `size`-pixel images: position embeddings resized, head kept."""
    out = DenseClassifier(vit_at_resolution(model.vit, size), model.head.out_features)
    out.head.load_state_dict(model.head.state_dict())
    return out.to(device_of(model))


def train_teacher(
    config: ViTConfig,
    stages: Sequence[tuple[ImageTask, int]],
    train: TrainConfig,
    *,
    num_classes: int,
    init: DenseClassifier | None = None,
    device: str | torch.device = "cpu",
    progress: bool = False,
) -> DenseClassifier:
    """A ViT classifier trained through `stages` of `(task, steps)`, in order.

    Args:
        config: The teacher's shape (its `image_size` is the first stage's; later stages resize
            the position embeddings to their own image size).
        stages: Training sets and their step counts, lowest resolution first.
        train: Optimisation settings (steps replaced per stage; the learning rate and
            schedule restart each stage).
        num_classes: Classes of the head.
        init: Start from (a copy of) this classifier instead of a fresh ViT (e.g. a shared
            crop stage).
        device: Where to train.
        progress: Show progress bars.

    Returns:
        The teacher at the last stage's resolution, in eval mode.
    """
    if not stages:
        raise ValueError("the teacher needs at least one training stage")
    if init is not None:
        model = copy.deepcopy(init)
    else:
        model = DenseClassifier(ViT(config.replace(image_size=stages[0][0].size)), num_classes)
    model = model.to(device)
    for index, (task, steps) in enumerate(stages):
        if task.size != model.vit.config.image_size:
            model = at_resolution(model, task.size).to(device)
        stage = train.replace(steps=steps, seed=train.seed + index)
        label = f"teacher {task.name} {task.size}px" if progress else None
        train_classifier(model, task, stage, progress=label)
    return model.eval()
