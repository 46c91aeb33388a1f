"""Natural and aerial photographs for super-resolution: scikit-image's samples and opencv-doc's."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np

from benchdata._files import DataNotFoundError, optional_import, require

OPENCV_DATA_DIR = Path("/usr/share/doc/opencv-doc/examples/data")
# scikit-image samples that ship inside its wheel (the others download through pooch)
SKIMAGE_NATURAL = (
    "astronaut",
    "brick",
    "camera",
    "chelsea",
    "coffee",
    "coins",
    "grass",
    "gravel",
    "hubble_deep_field",
    "immunohistochemistry",
    "moon",
    "retina",
    "rocket",
)
OPENCV_NATURAL = ("baboon.jpg", "building.jpg", "butterfly.jpg", "fruits.jpg", "home.jpg")
OPENCV_AERIAL = ("aero1.jpg", "aero3.jpg")
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff"}

Source = Literal["all", "natural", "aerial"]
Color = Literal["rgb", "gray"]


def to_float(image: np.ndarray, color: Color) -> np.ndarray:
    """uint8 `(H, W)`, `(H, W, 3)` or `(H, W, 4)` -> float32 in [0, 1], `(H, W, 3)` or `(H, W)`.

    "gray" is the ITU-R BT.601 luma that super-resolution papers score PSNR on.
    """
    if image.dtype != np.uint8:
        raise ValueError(f"expected a uint8 image, got {image.dtype}")
    pixels = image.astype(np.float32) / 255.0
    if pixels.ndim == 3:
        pixels = pixels[..., :3]  # drop alpha
    if color == "rgb":
        return np.repeat(pixels[..., None], 3, axis=2) if pixels.ndim == 2 else pixels
    if color == "gray":
        if pixels.ndim == 2:
            return pixels
        return (pixels @ np.array([0.299, 0.587, 0.114], dtype=np.float32)).astype(np.float32)
    raise ValueError(f"color must be 'rgb' or 'gray', got {color!r}")


def _read(path: Path) -> np.ndarray:
    io = optional_import("skimage.io", "images")
    return np.asarray(io.imread(path))


def _skimage(name: str) -> np.ndarray:
    data = optional_import("skimage.data", "images")
    return np.asarray(getattr(data, name)())


def sr_images(
    source: Source = "all", *, color: Color = "rgb", path: str | Path | None = None
) -> dict[str, np.ndarray]:
    """Real photographs as float32 arrays in [0, 1], by name.

    Args:
        source: "natural" (13 scikit-image samples: astronaut, coffee, hubble_deep_field, ...,
            and 5 opencv-doc photos: baboon, butterfly, ...), "aerial" (opencv-doc's aero1 and
            aero3, 640x480 aerial photographs), or "all".
        color: "rgb" -> `(H, W, 3)` (grayscale images repeated), "gray" -> `(H, W)` luma.
        path: a folder of your own images (png/jpg/bmp/tif, e.g. Set5 or DIV2K HR); when given,
            only those are returned, named by file stem.
    """
    if source not in ("all", "natural", "aerial"):
        raise ValueError(f"source must be 'all', 'natural' or 'aerial', got {source!r}")
    if color not in ("rgb", "gray"):
        raise ValueError(f"color must be 'rgb' or 'gray', got {color!r}")
    if path is not None:
        folder = require(Path(path), "image folder", "images")
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise DataNotFoundError(f"images ({sorted(IMAGE_SUFFIXES)})", folder, "images")
        return {p.stem: to_float(_read(p), color) for p in files}
    images = {}
    if source in ("all", "natural"):
        images.update({name: to_float(_skimage(name), color) for name in SKIMAGE_NATURAL})
    opencv = {"all": OPENCV_NATURAL + OPENCV_AERIAL, "natural": OPENCV_NATURAL}
    for file in opencv.get(source, OPENCV_AERIAL):
        image = _read(require(OPENCV_DATA_DIR / file, f"opencv-doc image {file}", "aerial"))
        images[Path(file).stem] = to_float(image, color)
    return images
