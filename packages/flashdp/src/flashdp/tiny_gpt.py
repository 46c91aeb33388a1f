"""A small GPT made only of layers that both flashdp and Opacus clip (Linear, Embedding,
LayerNorm), for the benchmark and the reproduce run."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256
    seq_len: int = 128
    width: int = 256
    depth: int = 4
    heads: int = 4

    def __post_init__(self) -> None:
        if self.width % self.heads:
            raise ValueError(f"width {self.width} must be divisible by heads {self.heads}")


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.ln_attn = nn.LayerNorm(config.width)
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)
        self.ln_mlp = nn.LayerNorm(config.width)
        self.up = nn.Linear(config.width, 4 * config.width)
        self.down = nn.Linear(4 * config.width, config.width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = h.shape
        q, k, v = self.qkv(self.ln_attn(h)).split(width, dim=-1)
        q, k, v = (t.view(batch, tokens, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(attention.transpose(1, 2).reshape(batch, tokens, width))
        return h + self.down(F.gelu(self.up(self.ln_mlp(h))))


class TinyGPT(nn.Module):
    """Decoder-only transformer: ``tokens: (B, T)`` int64 -> logits ``(B, T, vocab_size)``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tokens = nn.Embedding(config.vocab_size, config.width)
        self.positions = nn.Embedding(config.seq_len, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.depth))
        self.ln_out = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = (
            torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens).contiguous()
        )
        h = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_out(h))


class SequenceCrossEntropy(nn.Module):
    """Each example's loss is its mean token cross-entropy; ``reduction`` combines examples
    (``"mean"``, ``"sum"`` or ``"none"`` for the ``(B,)`` per-example losses)."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        per_token = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        per_example = per_token.mean(1)
        if self.reduction == "none":
            return per_example
        return per_example.sum() if self.reduction == "sum" else per_example.mean()
