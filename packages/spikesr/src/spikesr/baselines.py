"""The baselines SpikeSR is compared with: bicubic upsampling and an EDSR-baseline-style CNN.

The ANN twin and the two ablations are SpikeSR itself (``SpikeSR(neuron="relu")``,
``SpikeSR(hda=False)``, ``SpikeSR(dsa=False)``).

``EDSR`` follows Lim et al. (2017), EDSR-baseline: mean shift by the DIV2K RGB mean, a 3x3 head
conv, residual blocks ``conv -> ReLU -> conv`` (no batch norm, residual scale 1), a 3x3 conv and
the global skip, then sub-pixel upsampling (one ``x2`` pixel shuffle per factor of two) and a 3x3
output conv. The paper's EDSR-baseline is 16 blocks of 64 channels; :func:`edsr_width_for` picks
the width that gives a parameter count equal to a given network's, for comparisons at equal size.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from spikesr.metrics import check_unit_range
from spikesr.model import SCALES, check_input
from spikesr.resize import imresize

DIV2K_RGB_MEAN = (0.4488, 0.4371, 0.4040)


def bicubic_upscale(lr: np.ndarray, scale: int) -> np.ndarray:
    """MATLAB bicubic ``x scale`` of an ``(h, w, 3)`` image in [0, 1], clipped to [0, 1]."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale}")
    check_unit_range(lr, "the LR image")
    return np.clip(imresize(lr, scale), 0.0, 1.0).astype(np.float32)


class ResidualBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class EDSR(nn.Module):
    """EDSR-baseline-style CNN: ``(B, 3, h, w)`` in [0, 1] -> ``(B, 3, s h, s w)``."""

    def __init__(self, scale: int = 4, width: int = 64, blocks: int = 16):
        super().__init__()
        if scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, got {scale}")
        if width < 1 or blocks < 1:
            raise ValueError(f"width and blocks must be >= 1, got {width}, {blocks}")
        self.scale, self.width, self.blocks = scale, width, blocks
        self.register_buffer(
            "mean", torch.tensor(DIV2K_RGB_MEAN).view(1, 3, 1, 1), persistent=False
        )
        self.head = nn.Conv2d(3, width, 3, padding=1)
        self.body = nn.Sequential(
            *(ResidualBlock(width) for _ in range(blocks)), nn.Conv2d(width, width, 3, padding=1)
        )
        upsample = []
        for _ in range(int(math.log2(scale))):
            upsample += [nn.Conv2d(width, 4 * width, 3, padding=1), nn.PixelShuffle(2)]
        self.tail = nn.Sequential(*upsample, nn.Conv2d(width, 3, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(x)
        features = self.head(x - self.mean)
        return self.tail(self.body(features) + features) + self.mean


def edsr_parameters(scale: int, width: int, blocks: int) -> int:
    """The parameter count of ``EDSR(scale, width, blocks)``, in closed form."""
    conv = lambda cin, cout: 9 * cin * cout + cout  # noqa: E731
    ups = int(math.log2(scale)) * conv(width, 4 * width)
    return conv(3, width) + (2 * blocks + 1) * conv(width, width) + ups + conv(width, 3)


def edsr_width_for(parameters: int, scale: int, blocks: int) -> int:
    """The EDSR width whose parameter count is closest to ``parameters``."""
    if parameters < 1:
        raise ValueError(f"parameters must be >= 1, got {parameters}")
    width = 1
    while edsr_parameters(scale, width + 1, blocks) <= parameters:
        width += 1
    above = width + 1
    if abs(edsr_parameters(scale, above, blocks) - parameters) < abs(
        edsr_parameters(scale, width, blocks) - parameters
    ):
        return above
    return width
