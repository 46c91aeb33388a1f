"""Overlapping square patches of a feature map, and their overlap-averaged reassembly.

The patch grid is the anchor's (HPINet's): starts ``0, step, 2 step, ...`` along each axis, the
last one clamped so the patch ends at the border, one patch when the side equals the patch size.
``reverse`` averages every pixel over the patches that cover it. The anchor halves the overlap
strips instead, which is the same wherever at most two patches cover a pixel along an axis, but
not where three do: at its 16 / 14 setting, sides with ``(side - 16) % 14 == 1`` (31, 45, 73, ...)
leave a line covered three times and divided by 4.
"""

from __future__ import annotations

import torch


def patch_starts(size: int, patch: int, step: int) -> list[int]:
    """Top (or left) coordinates of the patches along one axis of length ``size``."""
    if size < patch:
        raise ValueError(
            f"a feature map side of {size} is smaller than the attention patch size {patch}; "
            f"the low-resolution input must be at least {patch} pixels on each side"
        )
    if not 1 <= step <= patch:
        raise ValueError(f"patch step must be in [1, patch size {patch}], got {step}")
    if size == patch:
        return [0]
    return [min(start, size - patch) for start in range(0, size + step - patch, step)]


def _indices(h: int, w: int, patch: int, step: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    offsets = torch.arange(patch, device=device)
    rows = torch.tensor(patch_starts(h, patch, step), device=device)[:, None] + offsets
    cols = torch.tensor(patch_starts(w, patch, step), device=device)[:, None] + offsets
    return rows, cols  # (nh, patch), (nw, patch)


def divide(x: torch.Tensor, patch: int, step: int) -> torch.Tensor:
    """``(B, C, H, W)`` -> ``(B, N, C, patch, patch)``, patches in row-major order."""
    b, c, h, w = x.shape
    rows, cols = _indices(h, w, patch, step, x.device)
    crops = x[:, :, rows][..., cols]  # (B, C, nh, patch, nw, patch)
    return crops.permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c, patch, patch)


def reverse(crops: torch.Tensor, h: int, w: int, step: int) -> torch.Tensor:
    """Inverse of :func:`divide`: ``(B, N, C, p, p)`` -> ``(B, C, H, W)``, overlaps averaged."""
    b, n, c, patch, _ = crops.shape
    rows, cols = _indices(h, w, patch, step, crops.device)
    nh, nw = len(rows), len(cols)
    if n != nh * nw:
        raise ValueError(f"{n} patches do not tile a {h}x{w} map ({nh}x{nw} expected)")
    flat = (rows[:, :, None, None] * w + cols[None, None]).reshape(-1)  # (nh p nw p)
    values = crops.view(b, nh, nw, c, patch, patch).permute(0, 3, 1, 4, 2, 5).reshape(b, c, -1)
    out = crops.new_zeros(b, c, h * w).index_add(2, flat, values)
    count = crops.new_zeros(h * w).index_add(0, flat, crops.new_ones(flat.numel()))
    return (out / count).view(b, c, h, w)
