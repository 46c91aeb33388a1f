"""Modulated deformable convolution (DCNv2) in plain PyTorch, torchvision's calling convention.

``deform_conv2d`` takes the same arguments and offset layout as ``torchvision.ops.deform_conv2d``
(offsets ``(B, 2 kh kw, Ho, Wo)`` as ``(dy, dx)`` pairs per kernel tap in row-major tap order,
mask ``(B, kh kw, Ho, Wo)``), samples bilinearly with zeros outside the image, and needs no
compiled extension (torchvision must not enter this CPU stack). The sampling runs through
``grid_sample``, so autograd gives the gradients for the input, the offsets and the mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from spikesr.energy import add_macs


def _pair(value: int | tuple[int, int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def deform_conv2d(
    x: torch.Tensor,
    offset: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Deformable convolution: tap ``k`` of output ``(i, j)`` reads the input bilinearly at
    ``(i s - p + k_y d + dy, j s - p + k_x d + dx)`` and is scaled by ``mask`` (DCNv2)."""
    b, c, h, w = x.shape
    out_channels, in_channels, kh, kw = weight.shape
    if in_channels != c:
        raise ValueError(f"weight expects {in_channels} input channels, the input has {c}")
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    taps = kh * kw
    if offset.shape != (b, 2 * taps, ho, wo):
        raise ValueError(
            f"offset must have shape {(b, 2 * taps, ho, wo)}, got {tuple(offset.shape)}"
        )
    if mask is not None and mask.shape != (b, taps, ho, wo):
        raise ValueError(f"mask must have shape {(b, taps, ho, wo)}, got {tuple(mask.shape)}")
    dtype, device = x.dtype, x.device
    ky, kx = torch.meshgrid(
        torch.arange(kh, device=device, dtype=dtype) * dh,
        torch.arange(kw, device=device, dtype=dtype) * dw,
        indexing="ij",
    )
    base_y = torch.arange(ho, device=device, dtype=dtype) * sh - ph
    base_x = torch.arange(wo, device=device, dtype=dtype) * sw - pw
    # (taps, Ho, Wo) sampling positions before the learned offsets
    grid_y = ky.reshape(taps, 1, 1) + base_y.view(1, ho, 1)
    grid_x = kx.reshape(taps, 1, 1) + base_x.view(1, 1, wo)
    offset = offset.view(b, taps, 2, ho, wo)
    y = grid_y + offset[:, :, 0]
    xx = grid_x + offset[:, :, 1]
    # pixel centre i sits at (2 i + 1) / size - 1 with align_corners=False; zeros outside
    grid = torch.stack(((2 * xx + 1) / w - 1, (2 * y + 1) / h - 1), dim=-1)
    columns = F.grid_sample(
        x, grid.view(b, taps * ho, wo, 2), mode="bilinear", padding_mode="zeros",
        align_corners=False,
    ).view(b, c, taps, ho, wo)  # fmt: skip
    if mask is not None:
        columns = columns * mask.unsqueeze(1)
    samples = b * c * taps * ho * wo
    add_macs(4 * samples, "deformable sampling")  # 4 bilinear weights per sampled value
    add_macs(samples * out_channels, "deformable conv")
    out = torch.einsum("bcthw,oct->bohw", columns, weight.reshape(out_channels, c, taps))
    return out if bias is None else out + bias.view(1, -1, 1, 1)


class DeformableConv2d(nn.Module):
    """A modulated deformable conv whose offsets and mask come from two convs of the input
    (zero-initialised: it starts as a plain conv, mask ``2 sigmoid(0) = 1``), as in the anchor."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int = 3, padding: int = 1,
        bias: bool = True,
    ):  # fmt: skip
        super().__init__()
        taps = kernel_size * kernel_size
        self.padding = padding
        self.offset_conv = nn.Conv2d(in_channels, 2 * taps, kernel_size, padding=padding)
        self.modulator_conv = nn.Conv2d(in_channels, taps, kernel_size, padding=padding)
        for conv in (self.offset_conv, self.modulator_conv):
            nn.init.zeros_(conv.weight)
            nn.init.zeros_(conv.bias)
        self.regular_conv = nn.Conv2d(
            in_channels, out_channels, kernel_size, padding=padding, bias=bias
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offset = self.offset_conv(x)
        mask = 2 * torch.sigmoid(self.modulator_conv(x))
        return deform_conv2d(
            x, offset, self.regular_conv.weight, self.regular_conv.bias,
            padding=self.padding, mask=mask,
        )  # fmt: skip
