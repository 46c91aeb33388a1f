"""Using a trained network: whole images upscaled tile by tile, and PSNR / SSIM over test pairs.

Large images go through the network in overlapping LR tiles (the DSA's attention grows with the
number of patches: a 512 x 512 input at once would need gigabytes); the HR tiles are averaged
where they overlap. A tile covers whole DSA patches, so the tiling changes outputs only near tile
seams, by a fraction of a grey level (measured in the tests).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from spikesr import metrics
from spikesr.baselines import bicubic_upscale
from spikesr.data import Pair, to_image, to_tensor
from spikesr.model import SCALES
from spikesr.patches import patch_starts

Upscaler = Callable[[np.ndarray], np.ndarray]


def network_scale(model: nn.Module) -> int:
    scale = getattr(model, "scale", None) or getattr(getattr(model, "config", None), "scale", None)
    if scale not in SCALES:
        raise TypeError(f"{type(model).__name__} has no scale in {SCALES}")
    return scale


def min_input_size(model: nn.Module) -> int:
    return getattr(model, "min_size", 1)


@torch.no_grad()
def upscale(
    model: nn.Module,
    lr: np.ndarray,
    *,
    tile: int | None = 96,
    overlap: int = 16,
    device: str | torch.device = "cpu",
) -> np.ndarray:
    """``model``'s upscaling of one ``(h, w, 3)`` image in [0, 1] -> ``(s h, s w, 3)`` in [0, 1].

    Values outside [0, 1] (an image on the 0-255 scale) or NaN / inf are an error.

    Args:
        tile: LR tile side (None: the whole image at once).
        overlap: LR pixels shared by neighbouring tiles.
        device: where the network runs; the model is moved there for the call and back to its
            own device (and training mode) afterwards.
    """
    lr = np.asarray(lr, dtype=np.float32)
    if lr.ndim != 3 or lr.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) RGB image, got shape {lr.shape}")
    metrics.check_unit_range(lr, "the LR image")
    smallest = min_input_size(model)
    if min(lr.shape[:2]) < smallest:
        raise ValueError(
            f"the image is {lr.shape[0]}x{lr.shape[1]} pixels; this network needs at least "
            f"{smallest}x{smallest} (its DSA patch size)"
        )
    scale = network_scale(model)
    was_training = model.training
    home = next(itertools.chain(model.parameters(), model.buffers()), None)
    model.eval().to(device)
    try:
        return _upscale(model, lr, scale, tile, overlap, smallest, device)
    finally:
        model.train(was_training)
        if home is not None:
            model.to(home.device)


def _upscale(model, lr, scale, tile, overlap, smallest, device) -> np.ndarray:
    h, w = lr.shape[:2]
    if tile is None or (h <= tile and w <= tile):
        out = model(to_tensor(lr).to(device))
        return np.clip(to_image(out), 0.0, 1.0)
    if tile < smallest or not 0 <= overlap < tile:
        raise ValueError(f"need tile >= {smallest} and 0 <= overlap < tile, got {tile}, {overlap}")
    th, tw = min(tile, h), min(tile, w)
    tops = patch_starts(h, th, min(tile - overlap, th))  # a side within one tile: one tile
    lefts = patch_starts(w, tw, min(tile - overlap, tw))
    total = np.zeros((scale * h, scale * w, 3), dtype=np.float64)
    count = np.zeros((scale * h, scale * w, 1), dtype=np.float64)
    for top in tops:
        for left in lefts:
            piece = to_tensor(lr[top : top + th, left : left + tw]).to(device)
            hr = to_image(model(piece))
            rows = slice(scale * top, scale * (top + th))
            cols = slice(scale * left, scale * (left + tw))
            total[rows, cols] += hr
            count[rows, cols] += 1
    return np.clip(total / count, 0.0, 1.0).astype(np.float32)


def model_upscaler(model: nn.Module, **kwargs) -> Upscaler:
    """``model`` as an upscaler for :func:`evaluate`: ``upscale(model, lr, **kwargs)``."""
    return lambda lr: upscale(model, lr, **kwargs)


def bicubic_upscaler(scale: int) -> Upscaler:
    """MATLAB bicubic ``x scale`` as an upscaler for :func:`evaluate`."""
    return lambda lr: bicubic_upscale(lr, scale)


@dataclass(frozen=True)
class Scores:
    """Mean PSNR (dB) / SSIM over the test images in both conventions, and per image."""

    psnr: float
    ssim: float
    psnr_basicsr: float
    ssim_basicsr: float
    per_image: dict[str, dict[str, float]]

    def to_dict(self) -> dict:
        return asdict(self)


def evaluate(upscaler: Upscaler, pairs: list[Pair], scale: int) -> Scores:
    """Score ``upscaler`` on ``pairs``: the author's convention (Y, no crop) and BasicSR's (Y,
    ``scale`` pixels cropped), both on 8-bit-rounded images."""
    if not pairs:
        raise ValueError("no test images")
    per_image = {}
    for pair in pairs:
        sr = upscaler(pair.lr)
        if sr.shape != pair.hr.shape:
            raise ValueError(f"{pair.name}: the output is {sr.shape}, the HR image {pair.hr.shape}")
        metrics.check_unit_range(sr, f"{pair.name}: the upscaler's output")
        p, s = metrics.score(sr, pair.hr, metrics.AUTHOR, scale)
        pb, sb = metrics.score(sr, pair.hr, metrics.BASICSR, scale)
        per_image[pair.name] = {"psnr": p, "ssim": s, "psnr_basicsr": pb, "ssim_basicsr": sb}
    mean = {
        k: float(np.mean([v[k] for v in per_image.values()]))
        for k in next(iter(per_image.values()))
    }
    return Scores(**mean, per_image=per_image)
