"""The modulated deformable conv against a brute-force bilinear sampler and against conv2d."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from spikesr.dcn import DeformableConv2d, deform_conv2d


def bilinear(image: torch.Tensor, y: float, x: float) -> torch.Tensor:
    """``image (C, H, W)`` at real position (y, x), zero outside (DCN's convention)."""
    c, h, w = image.shape
    y0, x0 = math.floor(y), math.floor(x)
    value = torch.zeros(c, dtype=image.dtype)
    for yy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
        for xx, wx in ((x0, 1 - (x - x0)), (x0 + 1, x - x0)):
            if 0 <= yy < h and 0 <= xx < w:
                value += wy * wx * image[:, yy, xx]
    return value


def deform_reference(x, offset, weight, bias, padding, mask):
    b, _c, _h, _w = x.shape
    o, _, kh, kw = weight.shape
    ho, wo = offset.shape[-2:]
    out = torch.zeros(b, o, ho, wo, dtype=x.dtype)
    for n in range(b):
        for i in range(ho):
            for j in range(wo):
                acc = bias.clone()
                for k in range(kh * kw):
                    ky, kx = divmod(k, kw)
                    y = i - padding + ky + offset[n, 2 * k, i, j].item()
                    xx = j - padding + kx + offset[n, 2 * k + 1, i, j].item()
                    sample = bilinear(x[n], y, xx) * mask[n, k, i, j]
                    acc += weight[:, :, ky, kx] @ sample
                out[n, :, i, j] = acc
    return out


def test_deform_conv_matches_brute_force():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64)
    weight = torch.randn(4, 3, 3, 3, dtype=torch.float64)
    bias = torch.randn(4, dtype=torch.float64)
    offset = torch.randn(2, 18, 5, 6, dtype=torch.float64) * 1.5  # some taps fall outside
    mask = torch.rand(2, 9, 5, 6, dtype=torch.float64) * 2
    out = deform_conv2d(x, offset, weight, bias, padding=1, mask=mask)
    expected = deform_reference(x, offset, weight, bias, 1, mask)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_zero_offsets_unit_mask_is_conv2d():
    torch.manual_seed(1)
    x = torch.randn(2, 4, 7, 9, dtype=torch.float64)
    weight = torch.randn(5, 4, 3, 3, dtype=torch.float64)
    offset = torch.zeros(2, 18, 7, 9, dtype=torch.float64)
    out = deform_conv2d(
        x, offset, weight, padding=1, mask=torch.ones(2, 9, 7, 9, dtype=torch.float64)
    )
    torch.testing.assert_close(out, F.conv2d(x, weight, padding=1), rtol=1e-12, atol=1e-12)


def test_integer_offsets_shift_the_input():
    torch.manual_seed(2)
    x = torch.randn(1, 2, 6, 6, dtype=torch.float64)
    weight = torch.zeros(2, 2, 1, 1, dtype=torch.float64)
    weight[0, 0] = weight[1, 1] = 1  # identity 1x1 conv
    offset = torch.zeros(1, 2, 6, 6, dtype=torch.float64)
    offset[:, 0], offset[:, 1] = 1.0, -2.0  # read (i + 1, j - 2)
    out = deform_conv2d(x, offset, weight)
    expected = torch.zeros_like(x)
    expected[..., :-1, 2:] = x[..., 1:, :-2]
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def test_module_starts_as_its_plain_conv_and_learns_offsets():
    torch.manual_seed(3)
    dcn = DeformableConv2d(4, 4)
    x = torch.randn(2, 4, 16, 16)
    torch.testing.assert_close(dcn(x), dcn.regular_conv(x), rtol=1e-5, atol=1e-5)
    dcn(x).square().sum().backward()
    assert dcn.offset_conv.weight.grad.abs().sum() > 0
    assert dcn.modulator_conv.weight.grad.abs().sum() > 0


def test_bad_shapes_are_refused():
    x = torch.randn(1, 3, 5, 5)
    weight = torch.randn(2, 3, 3, 3)
    with pytest.raises(ValueError, match="offset must have shape"):
        deform_conv2d(x, torch.zeros(1, 18, 4, 4), weight, padding=1)
    with pytest.raises(ValueError, match="input channels"):
        deform_conv2d(x, torch.zeros(1, 18, 5, 5), torch.randn(2, 4, 3, 3), padding=1)
