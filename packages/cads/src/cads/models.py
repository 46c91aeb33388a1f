"""Small models for the experiments: a CNN for 14×14 or 28×28 images and a byte-level causal
convolutional LM. Each factory takes a seed and returns a freshly initialised model, so every run
of a selection method starts from a known initialisation without touching the global RNG."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ByteLM", "byte_lm", "small_cnn"]


def _seeded(seed: int, build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def small_cnn(
    seed: int = 0,
    *,
    side: int = 14,
    channels: tuple[int, int] = (8, 16),
    hidden: int = 64,
    classes: int = 10,
    in_channels: int = 1,
) -> nn.Module:
    """Two 3×3 conv + ReLU + 2×2 max-pool stages, a hidden layer, logits ``(B, classes)``; the
    paper's MNIST CNN (5×5 kernels, 32/64 channels, 128 hidden) at ``channels=(32, 64)``,
    ``hidden=128`` is in reach, the default is sized for CPU runs. Input ``(B, C, side, side)``."""
    if side < 4:
        raise ValueError(f"side must be at least 4 (two 2x2 pools), got {side}")
    c1, c2 = channels

    def build():
        return nn.Sequential(
            nn.Conv2d(in_channels, c1, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(c2 * (side // 2 // 2) ** 2, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    return _seeded(seed, build)


class ByteLM(nn.Module):
    """Byte-level causal convolutional LM: tokens ``(B, T)`` int64 < 256 → logits
    ``(B, T, 256)``. Byte embeddings, then ``layers`` causal convolutions (kernel ``kernel``,
    dilations 1, 2, 4, ...: a receptive field of ``1 + (kernel − 1)(2^layers − 1)`` bytes) with
    residual connections, then a linear read-out; position ``t`` sees bytes ``≤ t`` only."""

    def __init__(self, width: int = 64, layers: int = 3, kernel: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.convs = nn.ModuleList(
            nn.Conv1d(width, width, kernel, dilation=2**i) for i in range(layers)
        )
        self.pads = [(kernel - 1) * 2**i for i in range(layers)]
        self.head = nn.Linear(width, 256)

    @property
    def receptive_field(self) -> int:
        return 1 + sum(self.pads)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens).transpose(1, 2)  # (B, width, T)
        for conv, pad in zip(self.convs, self.pads, strict=True):
            x = x + torch.relu(conv(nn.functional.pad(x, (pad, 0))))
        return self.head(x.transpose(1, 2))


def byte_lm(seed: int = 0, *, width: int = 64, layers: int = 3, kernel: int = 3) -> ByteLM:
    """A seeded :class:`ByteLM`."""
    return _seeded(seed, lambda: ByteLM(width, layers, kernel))
