"""The networks of the paper's experiments, built from plain PyTorch layers (``quantize`` them):

* :func:`preact_resnet20`: the CIFAR-style pre-activation ResNet-20 of Any-Precision DNNs
  (3 stages × 3 basic blocks, widths ``w, 2w, 4w``; each block BN → ReLU → conv → BN → ReLU →
  conv, a 1×1 conv + BN shortcut where the stride is 2; a final BN, global average pool and
  linear classifier). ``width=16`` is the original ResNet-20, Any-Precision trains ``width=80``.
* :func:`small_vit`: a ViT (patch embedding, class token, learned positions, pre-norm blocks of
  multi-head self-attention and a GELU MLP, final LayerNorm, linear head).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PreActBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.bn0 = nn.BatchNorm2d(in_planes)
        self.conv0 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv1 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.shortcut = None
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride, 0, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn0(x))
        skip = x if self.shortcut is None else self.shortcut(out)
        out = self.conv1(F.relu(self.bn1(self.conv0(out))))
        return out + skip


class PreActResNet(nn.Module):
    def __init__(self, blocks: tuple[int, int, int], width: int, in_channels: int, classes: int):
        super().__init__()
        self.conv0 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
        layers, planes = [], width
        for stage, count in enumerate(blocks):
            out_planes = width * 2**stage
            for index in range(count):
                stride = 2 if stage > 0 and index == 0 else 1
                layers.append(PreActBlock(planes, out_planes, stride))
                planes = out_planes
        self.layers = nn.Sequential(*layers)
        self.bn = nn.BatchNorm2d(planes)
        self.fc = nn.Linear(planes, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn(self.layers(self.conv0(x)))
        return self.fc(out.mean((2, 3)))


def preact_resnet20(num_classes: int = 10, in_channels: int = 1, width: int = 16) -> nn.Module:
    """Pre-activation ResNet-20 (``(B, in_channels, H, W)`` → ``(B, num_classes)`` logits)."""
    if width < 1:
        raise ValueError(f"width must be a positive integer, got {width!r}")
    return PreActResNet((3, 3, 3), width, in_channels, num_classes)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).view(batch, tokens, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, dim))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self, image_size, patch, in_channels, classes, dim, depth, heads, mlp_ratio):
        super().__init__()
        self.patch = nn.Conv2d(in_channels, dim, patch, patch)
        tokens = (image_size // patch) ** 2 + 1
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.blocks = nn.Sequential(*(Block(dim, heads, mlp_ratio) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def small_vit(
    num_classes: int = 10,
    in_channels: int = 1,
    image_size: int = 28,
    patch: int = 7,
    dim: int = 64,
    depth: int = 4,
    heads: int = 4,
    mlp_ratio: int = 2,
) -> nn.Module:
    """A small ViT (``(B, in_channels, image_size, image_size)`` → ``(B, num_classes)``)."""
    if image_size % patch:
        raise ValueError(f"image_size {image_size} is not a multiple of the patch size {patch}")
    if dim % heads:
        raise ValueError(f"dim {dim} is not a multiple of heads {heads}")
    return ViT(image_size, patch, in_channels, num_classes, dim, depth, heads, mlp_ratio)


MODELS = {"resnet20": preact_resnet20, "vit": small_vit}


def build_model(name: str, num_classes: int, in_channels: int, **kwargs) -> nn.Module:
    """A model by name (``"resnet20"`` or ``"vit"``)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    return MODELS[name](num_classes=num_classes, in_channels=in_channels, **kwargs)
