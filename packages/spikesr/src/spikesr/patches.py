"""Overlapping square patches of a feature map, and their overlap-averaged reassembly.

The patch grid is the anchor's (HPINet's): starts ``0, step, 2 step, ...`` along each axis, the
last one clamped so the patch ends at the border, one patch when the side equals the patch size.
``reverse`` averages every pixel over the patches that cover it. The anchor halves the overlap
strips instead, which is the same wherever at most two patches cover a pixel along an axis, but
not where three do: at its 16 / 14 setting, sides with ``(side - 16) % 14 == 1`` (31, 45, 73, ...)
leave a line covered three times and divided by 4.
"""

from __future__ import annotations

from functools import lru_cache

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


def divide(x: torch.Tensor, patch: int, step: int) -> torch.Tensor:
    """``(B, C, H, W)`` -> ``(B, N, C, patch, patch)``, patches in row-major order."""
    _, _, h, w = x.shape
    rows, cols = patch_starts(h, patch, step), patch_starts(w, patch, step)
    # one slice per patch: at the DSA's grid (tens to hundreds of patches) this beats a gather
    return torch.stack([x[:, :, r : r + patch, c : c + patch] for r in rows for c in cols], dim=1)


@lru_cache(maxsize=64)
def coverage(h: int, w: int, patch: int, step: int) -> torch.Tensor:
    """``(H, W)``: how many patches of the grid cover each pixel (cached; do not modify)."""
    count = torch.zeros(h, w)
    for r in patch_starts(h, patch, step):
        for c in patch_starts(w, patch, step):
            count[r : r + patch, c : c + patch] += 1
    return count


def reverse(crops: torch.Tensor, h: int, w: int, step: int) -> torch.Tensor:
    """Inverse of :func:`divide`: ``(B, N, C, p, p)`` -> ``(B, C, H, W)``, overlaps averaged."""
    b, n, c, patch, _ = crops.shape
    rows, cols = patch_starts(h, patch, step), patch_starts(w, patch, step)
    if n != len(rows) * len(cols):
        raise ValueError(
            f"{n} patches do not tile a {h}x{w} map ({len(rows)}x{len(cols)} expected)"
        )
    out = crops.new_zeros(b, c, h, w)
    index = 0
    for r in rows:
        for col in cols:
            out[:, :, r : r + patch, col : col + patch] += crops[:, index]
            index += 1
    return out.div_(coverage(h, w, patch, step).to(crops))
