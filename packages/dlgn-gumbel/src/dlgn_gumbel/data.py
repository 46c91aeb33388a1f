"""Image datasets from ``benchdata`` as flat float tensors in ``[0, 1]``, with fixed splits."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["DATASETS", "DATASET_SHAPES", "ImageData", "load_images"]

DATASETS = ("fashion-mnist", "mnist-5k", "digits")
# (pixels per image, classes) of each dataset, known without loading it: the command line checks
# an architecture against them before any data is read
DATASET_SHAPES = {"fashion-mnist": (784, 10), "mnist-5k": (784, 10), "digits": (64, 10)}


@dataclass(frozen=True)
class ImageData:
    """Train/test images ``(N, H·W)`` float32 in ``[0, 1]`` and labels ``(N,)`` int64."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int

    def subset(self, train: int | None, test: int | None, seed: int = 0) -> ImageData:
        """A class-mixed random subset (``None`` keeps a split whole)."""
        g = torch.Generator().manual_seed(seed)

        def pick(x: torch.Tensor, y: torch.Tensor, n: int | None):
            if n is None or n >= x.shape[0]:
                return x, y
            idx = torch.randperm(x.shape[0], generator=g)[:n]
            return x[idx], y[idx]

        return ImageData(
            *pick(self.x_train, self.y_train, train),
            *pick(self.x_test, self.y_test, test),
            self.num_classes,
        )


def _split(images: np.ndarray, labels: np.ndarray, test_fraction: float, seed: int):
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = round(test_fraction * len(labels))
    return order[n_test:], order[:n_test]


def load_images(name: str) -> ImageData:
    """Load ``"fashion-mnist"`` (60k/10k), ``"mnist-5k"`` (4k/1k split, seed 0) or ``"digits"``
    (1437/360 split, seed 0) through benchdata, pixels scaled to ``[0, 1]``."""
    if name not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}, got {name!r}")
    import benchdata

    if name == "fashion-mnist":
        train, test = benchdata.fashion_mnist("train"), benchdata.fashion_mnist("test")
        parts = (train.images, train.labels, test.images, test.labels)
        scale = 255.0
    else:
        data = benchdata.mnist_5k() if name == "mnist-5k" else benchdata.digits()
        scale = 255.0 if name == "mnist-5k" else 16.0
        tr, te = _split(data.images, data.labels, 0.2, seed=0)
        parts = (data.images[tr], data.labels[tr], data.images[te], data.labels[te])
    xtr, ytr, xte, yte = parts
    return ImageData(
        torch.from_numpy(xtr.reshape(len(xtr), -1).astype(np.float32) / scale),
        torch.from_numpy(np.asarray(ytr, dtype=np.int64)),
        torch.from_numpy(xte.reshape(len(xte), -1).astype(np.float32) / scale),
        torch.from_numpy(np.asarray(yte, dtype=np.int64)),
        10,
    )
