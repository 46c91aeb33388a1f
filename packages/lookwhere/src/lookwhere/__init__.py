"""LookWhere: efficient visual recognition by learning where to look and what to see.

A low-resolution **selector** (a truncated ViT with a per-patch head) predicts where the
informative patches of a high-resolution image are; a high-resolution **extractor** patch-embeds
the image and runs all its blocks on the top-k of those patches only, after the selector's CLS
and register tokens. Both are pre-trained together, without labels, by distillation from a
teacher ViT (its CLS, every patch feature and its attention map), then fine-tuned with the
selector frozen.

``lookwhere_from_teacher`` builds the model from any teacher ViT (``lookwhere.hf.load_dinov2``
reads DINOv2-with-registers weights from a Hugging Face folder), ``pretrain`` distils, and
``lookwhere.experiment.run_task`` measures it against the dense, low-resolution, random-token,
EViT and ToMe baselines by accuracy, counted FLOPs and measured time.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from lookwhere.baselines import (
    DenseClassifier,
    EViTClassifier,
    LowResClassifier,
    RandomTokenClassifier,
    ToMeClassifier,
    bipartite_merge,
)
from lookwhere.checkpoint import load, save
from lookwhere.data import ImageTask, global_images, sparse_canvases
from lookwhere.evaluate import OperatingPoint, judge, target_recall
from lookwhere.flops import count_flops, dense_flops, lookwhere_flops, measure_time, vit_flops
from lookwhere.hf import load_dinov2, lookwhere_from_dinov2
from lookwhere.model import (
    Extractor,
    LookWhere,
    LookWhereOutput,
    Selector,
    SelectorOutput,
    gather_tokens,
    idw_upsample,
    lookwhere_from_teacher,
    topk_indices,
)
from lookwhere.pretrain import LOSS_WEIGHTS, LossTerms, distillation_loss, pretrain
from lookwhere.teacher import train_teacher
from lookwhere.train import TrainConfig, accuracy, train_classifier
from lookwhere.vit import ViT, ViTConfig, ViTOutput

try:
    __version__ = _metadata.version("lookwhere")
except _metadata.PackageNotFoundError:  # imported from a source tree (PYTHONPATH), not installed
    __version__ = "0.0.0+source"

__all__ = [
    "LOSS_WEIGHTS",
    "DenseClassifier",
    "EViTClassifier",
    "Extractor",
    "ImageTask",
    "LookWhere",
    "LookWhereOutput",
    "LossTerms",
    "LowResClassifier",
    "OperatingPoint",
    "RandomTokenClassifier",
    "Selector",
    "SelectorOutput",
    "ToMeClassifier",
    "TrainConfig",
    "ViT",
    "ViTConfig",
    "ViTOutput",
    "__version__",
    "accuracy",
    "bipartite_merge",
    "count_flops",
    "dense_flops",
    "distillation_loss",
    "gather_tokens",
    "global_images",
    "idw_upsample",
    "judge",
    "load",
    "load_dinov2",
    "lookwhere_flops",
    "lookwhere_from_dinov2",
    "lookwhere_from_teacher",
    "measure_time",
    "pretrain",
    "save",
    "sparse_canvases",
    "target_recall",
    "topk_indices",
    "train_classifier",
    "train_teacher",
    "vit_flops",
]
