"""PSNR and SSIM with every convention explicit: Y or RGB, border crop, 8-bit rounding.

Super-resolution papers disagree on how they score, and the differences are larger than the gains
they report. Both functions take float images in [0, 1] (``(H, W, 3)`` or ``(H, W)``; values
outside it, or NaN, are an error rather than clipped) and score on the 0-255 scale:

* ``y_channel``: score MATLAB's ``rgb2ycbcr`` luma ``16 + (65.481 R + 128.553 G + 24.966 B)``
  instead of the three RGB channels;
* ``crop``: drop that many pixels at every border first (BasicSR uses the scale);
* ``round``: quantise both images to 8-bit levels first, as when they are saved to PNG.

``AUTHOR`` (Y, no crop; the anchor's TTST-derived evaluation) and ``BASICSR`` (Y, crop = scale)
are the two conventions reported, both on rounded 8-bit images. The anchor's script saves its
outputs through ``np.uint8`` (truncation, a bias of half a grey level, about 0.03 dB at 32 dB) and
MATLAB's ``rgb2ycbcr`` of a uint8 image rounds Y; here images are rounded and Y kept in float.
SSIM is Wang et al.'s: an 11 x 11 Gaussian window, sigma 1.5, ``K = (0.01, 0.03)``, valid
positions only, averaged over channels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Convention:
    """How images are prepared before scoring."""

    y_channel: bool
    crop: int | None  # None: crop by the scale factor
    round: bool = True

    def crop_for(self, scale: int) -> int:
        return scale if self.crop is None else self.crop


AUTHOR = Convention(y_channel=True, crop=0)
BASICSR = Convention(y_channel=True, crop=None)


def check_unit_range(image: np.ndarray, what: str = "the image") -> None:
    """A clear error unless every value of ``image`` is finite and within [0, 1] (an image on the
    0-255 scale, or NaN / inf, would otherwise be scored or resized into wrong numbers)."""
    image = np.asarray(image)
    if image.size == 0:
        return
    if not np.isfinite(image).all():
        raise ValueError(f"{what} has non-finite values (NaN or inf)")
    low, high = float(image.min()), float(image.max())
    if low < 0.0 or high > 1.0:
        hint = " (is it on the 0-255 scale? divide by 255)" if high > 1.0 else ""
        raise ValueError(
            f"{what} has values in [{low:.4g}, {high:.4g}]; expected floats in [0, 1]{hint}"
        )


def rgb_to_y(image: np.ndarray) -> np.ndarray:
    """MATLAB's ``rgb2ycbcr`` luma of an RGB image in [0, 1], on the 0-255 scale (16-235)."""
    return 16.0 + image.astype(np.float64) @ np.array([65.481, 128.553, 24.966])


def prepare(image: np.ndarray, *, y_channel: bool, crop: int = 0, round: bool = True) -> np.ndarray:
    """An image in [0, 1] -> float64 on the 0-255 scale, as it will be scored."""
    image = np.asarray(image, dtype=np.float64)
    if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] != 3):
        raise ValueError(f"expected an (H, W) or (H, W, 3) image, got shape {image.shape}")
    check_unit_range(image)
    if crop < 0 or 2 * crop >= min(image.shape[:2]):
        raise ValueError(f"border crop {crop} does not fit an image of {image.shape[:2]}")
    if round:
        image = np.round(image * 255.0) / 255.0
    if y_channel:
        if image.ndim != 3:
            raise ValueError("y_channel=True needs an RGB image (H, W, 3)")
        image = rgb_to_y(image)
    else:
        image = image * 255.0
    if crop:
        image = image[crop:-crop, crop:-crop]
    return image


def _pair(a: np.ndarray, b: np.ndarray, **flags) -> tuple[np.ndarray, np.ndarray]:
    if np.shape(a) != np.shape(b):
        raise ValueError(f"images differ in shape: {np.shape(a)} vs {np.shape(b)}")
    check_unit_range(a, "the SR image")
    check_unit_range(b, "the HR image")
    return prepare(a, **flags), prepare(b, **flags)


def psnr(
    sr: np.ndarray, hr: np.ndarray, *, y_channel: bool, crop: int = 0, round: bool = True
) -> float:
    """Peak signal-to-noise ratio in dB (peak 255); ``inf`` for identical images."""
    a, b = _pair(sr, hr, y_channel=y_channel, crop=crop, round=round)
    mse = np.mean((a - b) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> np.ndarray:
    x = np.arange(size) - (size - 1) / 2
    g = np.exp(-(x**2) / (2 * sigma**2))
    g /= g.sum()
    return g


def _filter_valid(image: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Separable 'valid' correlation of a 2-D image with the 1-D window ``g`` on both axes."""
    k = len(g)
    rows = np.lib.stride_tricks.sliding_window_view(image, k, axis=0) @ g
    return np.lib.stride_tricks.sliding_window_view(rows, k, axis=1) @ g


def _ssim_2d(a: np.ndarray, b: np.ndarray) -> float:
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    g = _gaussian_window()
    mu_a, mu_b = _filter_valid(a, g), _filter_valid(b, g)
    var_a = _filter_valid(a * a, g) - mu_a**2
    var_b = _filter_valid(b * b, g) - mu_b**2
    cov = _filter_valid(a * b, g) - mu_a * mu_b
    ssim_map = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / (
        (mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2)
    )
    return float(ssim_map.mean())


def ssim(
    sr: np.ndarray, hr: np.ndarray, *, y_channel: bool, crop: int = 0, round: bool = True
) -> float:
    """Structural similarity (Wang et al. 2004), averaged over channels for RGB."""
    a, b = _pair(sr, hr, y_channel=y_channel, crop=crop, round=round)
    if min(a.shape[:2]) < 11:
        raise ValueError(f"SSIM needs at least 11x11 pixels after cropping, got {a.shape[:2]}")
    if a.ndim == 2:
        return _ssim_2d(a, b)
    return float(np.mean([_ssim_2d(a[..., c], b[..., c]) for c in range(a.shape[2])]))


def score(
    sr: np.ndarray, hr: np.ndarray, convention: Convention, scale: int
) -> tuple[float, float]:
    """``(PSNR, SSIM)`` under a convention."""
    flags = {
        "y_channel": convention.y_channel,
        "crop": convention.crop_for(scale),
        "round": convention.round,
    }
    return psnr(sr, hr, **flags), ssim(sr, hr, **flags)
