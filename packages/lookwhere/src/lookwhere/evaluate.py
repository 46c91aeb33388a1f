"""Judging a model at one operating point: accuracy, FLOPs per image (counted), measured time per
image, and for LookWhere how much of the target its selection covers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from lookwhere.data import ImageTask
from lookwhere.flops import count_flops, measure_time
from lookwhere.model import LookWhere, topk_indices
from lookwhere.train import accuracy, device_of


@dataclass(frozen=True)
class OperatingPoint:
    """One method at one setting.

    Attributes:
        method: Method name ("lookwhere", "dense", "low-res", "random", "evit", "tome").
        setting: Its knob, as text ("k=16", "r=8", "keep=0.7", "48px", "all").
        accuracy: Top-1 accuracy on the test images.
        gflops: GFLOPs per image (counted, 2 per multiply-accumulate).
        ms_per_image: Measured milliseconds per image at the timing batch size.
        tokens: High-resolution tokens the expensive model runs on (its last block for
            EViT / ToMe).
        target_recall: For LookWhere, the fraction of the target's patches that the top-k keeps
            (sparse task); None otherwise.
    """

    method: str
    setting: str
    accuracy: float
    gflops: float
    ms_per_image: float
    tokens: int
    target_recall: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def judge(
    method: str,
    setting: str,
    predict: Callable[[torch.Tensor], torch.Tensor],
    task: ImageTask,
    *,
    tokens: int,
    time_batch: int = 32,
    repeat: int = 5,
    device: str | torch.device = "cpu",
    target_recall: float | None = None,
) -> OperatingPoint:
    """Accuracy over `task`, FLOPs of one image, median time of a `time_batch` batch."""
    one = task.floats(slice(0, 1)).to(device)
    batch = task.floats(slice(0, time_batch)).to(device)
    seconds = measure_time(lambda: predict(batch), device=device, repeat=repeat)
    return OperatingPoint(
        method=method,
        setting=setting,
        accuracy=accuracy(predict, task, device=device),
        gflops=count_flops(lambda: predict(one)) / 1e9,
        ms_per_image=1e3 * seconds / batch.shape[0],
        tokens=tokens,
        target_recall=target_recall,
    )


@torch.no_grad()
def target_recall(model: LookWhere, task: ImageTask, k: int, batch_size: int = 256) -> float:
    """Fraction of the target's patches (those its box overlaps) that the top-k selection keeps."""
    device = device_of(model)
    target = task.target_patches(model.extractor.vit.config.patch_size)
    kept_target, total = 0, 0
    for start in range(0, len(task), batch_size):
        index = slice(start, start + batch_size)
        saliency = model.selector(task.floats(index).to(device)).saliency
        indices = topk_indices(saliency, k).cpu()
        hit = torch.gather(target[index], 1, indices)
        kept_target += int(hit.sum())
        total += int(target[index].sum())
    return kept_target / max(total, 1)
