"""Real images for super-resolution: aerial and natural photographs, LR/HR pairs, random patches.

The images come from benchdata (opencv-doc's aerial photographs and natural photos, scikit-
image's samples), or from a folder of your own (AID / DOTA / DIOR style: images in the folder or
in class sub-folders). LR images are made once per HR image with MATLAB's bicubic
(:func:`spikesr.resize.degrade`); training draws aligned LR/HR patches with random flips and
90-degree rotations.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from spikesr.metrics import check_unit_range
from spikesr.resize import degrade, modcrop

# held out from training everywhere here: one aerial photograph and two classic test photos
TEST_IMAGES = ("aero3", "baboon", "butterfly")
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff"}
GRAY_MODES = ("1", "L", "LA", "La", "I", "F")  # and the 16-bit "I;16", "I;16B", ...


def read_image(path: str | Path, *, repeat_gray: bool = False) -> np.ndarray:
    """An image file -> float32 ``(H, W, 3)`` in [0, 1] (alpha dropped).

    A grayscale file is an error unless ``repeat_gray`` (then its luma fills the 3 channels).
    8-bit images are divided by 255, 16-bit grayscale ones (PIL modes ``I;16*``) by 65535, and
    float ones (mode ``F``) are taken as they are, which must be within [0, 1]; 32-bit integer
    images (mode ``I``) have no fixed range and are refused.
    """
    from PIL import Image

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no image file at {path}")
    try:
        opened = Image.open(path)
    except (OSError, Image.DecompressionBombError) as error:
        raise ValueError(f"{path} is not a readable image ({type(error).__name__})") from None
    with opened as image:
        mode = image.mode
        if mode not in GRAY_MODES and not mode.startswith("I;16"):
            return np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
        if not repeat_gray:
            raise ValueError(
                f"{path} is a grayscale image (mode {mode}); SpikeSR needs RGB "
                "(pass repeat_gray=True / --repeat-gray to copy it to 3 channels)"
            )
        if mode == "I":
            raise ValueError(
                f"{path} is a 32-bit integer image (PIL mode I), whose range is unknown; save it "
                "with 8 or 16 bits per pixel, or as floats in [0, 1]"
            )
        if mode.startswith("I;16"):
            gray = np.asarray(image, dtype=np.float64) / 65535.0
        elif mode == "F":
            gray = np.asarray(image, dtype=np.float64)
            check_unit_range(gray, f"{path} (a float image, PIL mode F)")
        else:
            gray = np.asarray(image.convert("L"), dtype=np.float64) / 255.0
        return np.repeat(gray[..., None], 3, axis=2).astype(np.float32)


def write_image(path: str | Path, image: np.ndarray) -> Path:
    """Save a float ``(H, W, 3)`` image in [0, 1] as an 8-bit file (format from the suffix)."""
    from PIL import Image

    path = Path(path)
    pixels = np.round(np.clip(image, 0.0, 1.0) * 255.0).astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def folder_images(path: str | Path) -> dict[str, np.ndarray]:
    """Every image under ``path`` (recursively, AID-style class folders), named by relative path
    without the suffix; two files with one name (``scene.png`` and ``scene.jpg``) are an error."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"no image folder at {root}")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"no images ({sorted(IMAGE_SUFFIXES)}) under {root}")
    named: dict[str, Path] = {}
    for file in files:
        name = str(file.relative_to(root).with_suffix(""))
        if name in named:
            raise ValueError(
                f"{named[name]} and {file} would both be the image {name!r}: keep one of them"
            )
        named[name] = file
    return {name: read_image(file, repeat_gray=True) for name, file in named.items()}


def benchmark_images(source: str = "all") -> dict[str, np.ndarray]:
    """benchdata's photographs as RGB floats: "aerial", "natural" or "all"."""
    from benchdata import sr_images

    return sr_images(source, color="rgb")


def split_images(
    images: dict[str, np.ndarray], test: tuple[str, ...] = TEST_IMAGES
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(train, test)`` by name; every name in ``test`` must be present."""
    missing = [name for name in test if name not in images]
    if missing:
        raise ValueError(f"test images {missing} are not among {sorted(images)}")
    train = {k: v for k, v in images.items() if k not in test}
    return train, {k: images[k] for k in test}


@dataclass(frozen=True)
class Pair:
    """An HR image cropped to a multiple of the scale, and its LR image."""

    name: str
    hr: np.ndarray
    lr: np.ndarray


def make_pairs(images: dict[str, np.ndarray], scale: int) -> list[Pair]:
    """LR/HR pairs by MATLAB bicubic degradation (``degrade``), HR modcropped to the scale."""
    pairs = []
    for name, image in images.items():
        hr = modcrop(np.asarray(image, dtype=np.float32), scale)
        pairs.append(Pair(name, hr, degrade(hr, scale)))
    return pairs


class PatchSampler:
    """Random aligned LR/HR patches from pairs, with flips and 90-degree rotations.

    Each patch comes from an image drawn uniformly (as DIV2K-style loaders do: one large, mostly
    dark image such as a retina scan would otherwise supply a third of the patches), at a uniform
    position, under one of the 8 flips / rotations (the anchor's loader uses 4 of them: flips and
    the 180-degree rotation, no transpose).

    Args:
        pairs: from :func:`make_pairs`.
        scale: the pairs' scale.
        lr_patch: LR patch side (the HR patch is ``scale`` times larger).
        seed: the sampler's own random stream.
    """

    def __init__(self, pairs: list[Pair], scale: int, lr_patch: int, seed: int = 0):
        if not pairs:
            raise ValueError("no training images")
        small = [p.name for p in pairs if min(p.lr.shape[:2]) < lr_patch]
        if small:
            raise ValueError(f"images {small} are smaller than an LR patch of {lr_patch} pixels")
        self.pairs, self.scale, self.lr_patch = pairs, scale, lr_patch
        self.rng = np.random.default_rng(seed)

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lr (B, 3, p, p), hr (B, 3, s p, s p))`` float32 tensors."""
        lrs, hrs = [], []
        p, s = self.lr_patch, self.scale
        for index in self.rng.integers(0, len(self.pairs), size=batch_size):
            pair = self.pairs[index]
            top = int(self.rng.integers(0, pair.lr.shape[0] - p + 1))
            left = int(self.rng.integers(0, pair.lr.shape[1] - p + 1))
            lr = pair.lr[top : top + p, left : left + p]
            hr = pair.hr[s * top : s * (top + p), s * left : s * (left + p)]
            flip_h, flip_v, transpose = self.rng.integers(0, 2, size=3)
            lr, hr = (
                augment(lr, bool(flip_h), bool(flip_v), bool(transpose)),
                augment(hr, bool(flip_h), bool(flip_v), bool(transpose)),
            )
            lrs.append(lr)
            hrs.append(hr)
        return to_tensor(np.stack(lrs)), to_tensor(np.stack(hrs))


def augment(image: np.ndarray, flip_h: bool, flip_v: bool, transpose: bool) -> np.ndarray:
    """One of the 8 flips / rotations of an ``(H, W, C)`` image."""
    if flip_h:
        image = image[:, ::-1]
    if flip_v:
        image = image[::-1]
    if transpose:
        image = image.transpose(1, 0, 2)
    return np.ascontiguousarray(image)


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """``(H, W, 3)`` or ``(B, H, W, 3)`` floats -> ``(B, 3, H, W)`` float32."""
    images = np.asarray(images, dtype=np.float32)
    if images.ndim == 3:
        images = images[None]
    return torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))


def to_image(tensor: torch.Tensor) -> np.ndarray:
    """``(1, 3, H, W)`` or ``(3, H, W)`` -> ``(H, W, 3)`` float32 numpy."""
    if tensor.dim() == 4:
        if tensor.shape[0] != 1:
            raise ValueError(f"expected one image, got a batch of {tensor.shape[0]}")
        tensor = tensor[0]
    return tensor.detach().float().cpu().permute(1, 2, 0).numpy()
