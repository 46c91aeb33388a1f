"""MATLAB's ``imresize`` (bicubic, antialiased when shrinking), the degradation SR papers use.

Per axis: output pixel ``x`` (1-based) reads input position ``u = x / s + (1 - 1 / s) / 2``
through the Keys cubic kernel (``a = -0.5``); when shrinking (``s < 1``) the kernel is stretched
by ``1 / s`` and scaled by ``s`` (antialiasing); weights are normalised to sum to one, and
indices past a border mirror back symmetrically (``..., 2, 1 | 1, 2, ... n | n, n-1, ...``).
Each axis is one matrix, so the resize is ``R_h @ image @ R_w^T``, computed in float64.

The border is where implementations differ: MATLAB mirrors the image, while
``torch.nn.functional.interpolate(mode="bicubic", antialias=True)`` uses the same kernel
(``a = -0.5``) but renormalises it where it is cut at the border; the two agree away from the
borders and differ near them, so LR images made one way are not the other's. (Without
``antialias``, torch's bicubic uses ``a = -0.75``.)
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from spikesr.metrics import check_unit_range


def cubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic convolution kernel with ``a = -0.5`` (MATLAB's "bicubic")."""
    ax = np.abs(x)
    ax2, ax3 = ax**2, ax**3
    return (1.5 * ax3 - 2.5 * ax2 + 1) * (ax <= 1) + (-0.5 * ax3 + 2.5 * ax2 - 4 * ax + 2) * (
        (ax > 1) & (ax <= 2)
    )


@lru_cache(maxsize=64)
def resize_matrix(in_len: int, out_len: int, scale: float, antialias: bool = True) -> np.ndarray:
    """The ``(out_len, in_len)`` float64 matrix of one axis of MATLAB's bicubic ``imresize``."""
    width = 4.0
    if scale < 1 and antialias:
        kernel = lambda x: scale * cubic(scale * x)  # noqa: E731
        width /= scale
    else:
        kernel = cubic
    x = np.arange(1, out_len + 1, dtype=np.float64)
    u = x / scale + 0.5 * (1 - 1 / scale)
    left = np.floor(u - width / 2)
    taps = math.ceil(width) + 2
    indices = left[:, None] + np.arange(taps)[None, :]  # 1-based
    weights = kernel(u[:, None] - indices)
    weights /= weights.sum(axis=1, keepdims=True)
    mirror = np.concatenate([np.arange(in_len), np.arange(in_len)[::-1]])
    columns = mirror[np.mod(indices.astype(np.int64) - 1, 2 * in_len)]
    matrix = np.zeros((out_len, in_len))
    np.add.at(matrix, (np.repeat(np.arange(out_len), taps), columns.ravel()), weights.ravel())
    return matrix


def imresize(image: np.ndarray, scale: float, *, antialias: bool = True) -> np.ndarray:
    """Resize ``(H, W)`` or ``(H, W, C)`` floats by ``scale`` as MATLAB does (output side
    ``ceil(side x scale)``); float64 out, no clipping or rounding."""
    image = np.asarray(image)
    if image.ndim not in (2, 3):
        raise ValueError(f"expected an (H, W) or (H, W, C) image, got shape {image.shape}")
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")
    h, w = image.shape[:2]
    out_h, out_w = math.ceil(h * scale), math.ceil(w * scale)
    rows = resize_matrix(h, out_h, float(scale), antialias)
    cols = resize_matrix(w, out_w, float(scale), antialias)
    pixels = image.astype(np.float64)
    out = np.tensordot(np.tensordot(rows, pixels, axes=(1, 0)), cols, axes=(1, 1))
    return np.moveaxis(out, -1, 1)  # (out_h, [C,] out_w) -> (out_h, out_w[, C])


def modcrop(image: np.ndarray, scale: int) -> np.ndarray:
    """Crop the bottom / right so both sides are multiples of ``scale``."""
    h, w = image.shape[:2]
    return image[: h - h % scale, : w - w % scale]


def degrade(hr: np.ndarray, scale: int, *, quantize: bool = True) -> np.ndarray:
    """The LR image of an HR float image in [0, 1]: MATLAB bicubic by ``1 / scale`` (HR sides
    must be multiples of ``scale``), clipped, and rounded to 8-bit levels as a saved PNG is.
    Values outside [0, 1] (an image on the 0-255 scale) or NaN / inf are an error."""
    hr = np.asarray(hr)
    check_unit_range(hr, "the HR image")
    h, w = hr.shape[:2]
    if h % scale or w % scale:
        raise ValueError(
            f"HR size {h}x{w} is not a multiple of the scale {scale}: modcrop it first"
        )
    lr = np.clip(imresize(hr, 1 / scale), 0.0, 1.0)
    if quantize:
        lr = np.round(lr * 255.0) / 255.0
    return lr.astype(np.float32)
