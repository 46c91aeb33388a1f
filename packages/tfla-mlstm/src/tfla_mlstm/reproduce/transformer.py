"""The Transformer baseline of the language-model comparison: pre-norm causal self-attention with
the same width, depth, heads, SwiGLU MLP and tied head as the xLSTM models."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tfla_mlstm.layers import FeedForward


class AttentionBlock(nn.Module):
    def __init__(self, d_model: int, num_heads: int, ffn_hidden: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.norm_attn = nn.RMSNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.norm_ffn = nn.RMSNorm(d_model)
        self.ffn = FeedForward(d_model, ffn_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, D = x.shape
        q, k, v = self.qkv(self.norm_attn(x)).view(B, S, 3, self.num_heads, -1).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.out(y.transpose(1, 2).reshape(B, S, D))
        return x + self.ffn(self.norm_ffn(x))


class TransformerLM(nn.Module):
    """``tokens (B, S)`` -> logits ``(B, S, vocab)``; learned positions up to ``max_len``."""

    def __init__(self, vocab_size, d_model, num_layers, num_heads, ffn_hidden, max_len) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Parameter(torch.zeros(max_len, d_model))
        self.blocks = nn.ModuleList(
            AttentionBlock(d_model, num_heads, ffn_hidden) for _ in range(num_layers)
        )
        self.norm = nn.RMSNorm(d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens) + self.positions[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embedding.weight.T
