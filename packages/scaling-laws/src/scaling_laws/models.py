"""Small models for the experiments: a byte-level decoder-only transformer and an MLP."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GPTConfig", "TinyGPT", "count_parameters", "lm_loss"]


@dataclass(frozen=True)
class GPTConfig:
    """Decoder-only transformer sizes (pre-norm, GELU MLP of width 4·d, learned positions)."""

    vocab_size: int = 256
    seq_len: int = 64
    width: int = 64
    depth: int = 2
    heads: int = 4

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "width", "depth", "heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.width % self.heads:
            raise ValueError(f"width {self.width} must be divisible by heads {self.heads}")


class _Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.norm1 = nn.LayerNorm(config.width)
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.out = nn.Linear(config.width, config.width)
        self.norm2 = nn.LayerNorm(config.width)
        self.mlp = nn.Sequential(
            nn.Linear(config.width, 4 * config.width),
            nn.GELU(),
            nn.Linear(4 * config.width, config.width),
        )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        h = h + self.out(y.transpose(1, 2).reshape(b, t, d))
        return h + self.mlp(self.norm2(h))


class TinyGPT(nn.Module):
    """``tokens: (B, T)`` int64 → logits ``(B, T, vocab_size)`` float32."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.width)
        self.position = nn.Parameter(torch.zeros(config.seq_len, config.width))
        nn.init.normal_(self.position, std=0.02)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.depth))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.ndim != 2 or tokens.shape[1] > self.config.seq_len:
            raise ValueError(
                f"tokens must be (B, T) with T <= {self.config.seq_len}, got {tuple(tokens.shape)}"
            )
        h = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def lm_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of ``batch = (inputs, targets)``, both ``(B, T)``."""
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def count_parameters(model: nn.Module, *, non_embedding: bool = False) -> int:
    """Trainable parameter count; ``non_embedding`` leaves out token and position embeddings."""
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if non_embedding and isinstance(model, TinyGPT):
        total -= model.embed.weight.numel() + model.position.numel()
    return total
