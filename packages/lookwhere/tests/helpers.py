"""A ViT whose every weight matters, for the equality tests."""

from __future__ import annotations

import torch

from lookwhere.vit import ViT, ViTConfig


def random_vit(config: ViTConfig, seed: int = 0, scale: float = 0.2) -> ViT:
    """A ViT in eval mode with N(0, scale) added to every parameter: untrained weights are near
    zero (and LayerScale small), which would let a wrong path through unnoticed."""
    torch.manual_seed(seed)
    vit = ViT(config).eval()
    with torch.no_grad():
        for param in vit.parameters():
            param.add_(torch.randn_like(param) * scale)
    return vit
