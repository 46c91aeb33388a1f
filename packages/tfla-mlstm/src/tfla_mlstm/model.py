"""A small causal language model of xLSTM blocks (mLSTM or mLSTMsig), with recurrent generation."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tfla_mlstm.layers import CELLS, mLSTMLayer, xLSTMBlock
from tfla_mlstm.validation import check_chunk_size


@dataclass(frozen=True)
class xLSTMConfig:
    """Sizes and cell of :class:`xLSTMLM`.

    Attributes:
        vocab_size: tokens.
        d_model: width; ``num_heads`` must divide it.
        num_layers: xLSTM blocks.
        num_heads: heads per mLSTM layer.
        cell: ``"mlstm"`` or ``"mlstmsig"``.
        qk_dim_factor, v_dim_factor: per-head q/k and v sizes as fractions of ``d_model / NH``.
        ffn_factor: SwiGLU hidden size as a multiple of ``d_model`` (rounded up to 8).
        chunk_size: chunk size of the chunkwise kernels (power of two >= 16), or ``None`` for
            :func:`tfla_mlstm.default_chunk_size` of each call's length.
        gate_soft_cap: soft cap of the gate pre-activations, ``None`` for none.
        backend: kernel backend (``None``: automatic).
        tie_embeddings: the output head reuses the embedding matrix (default); ``False`` gives
            the head its own ``nn.Linear`` (e.g. for per-layer DP clipping, which refuses a
            parameter used by two layers).
    """

    vocab_size: int = 256
    d_model: int = 128
    num_layers: int = 2
    num_heads: int = 4
    cell: str = "mlstm"
    qk_dim_factor: float = 0.5
    v_dim_factor: float = 1.0
    ffn_factor: float = 8 / 3
    chunk_size: int | None = 64
    gate_soft_cap: float | None = 15.0
    backend: str | None = None
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "num_layers", "num_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must divide d_model ({self.d_model})")
        if self.cell not in CELLS:
            raise ValueError(f"cell must be one of {CELLS}, got {self.cell!r}")
        for name in ("qk_dim_factor", "v_dim_factor", "ffn_factor"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.gate_soft_cap is not None and not self.gate_soft_cap > 0:
            raise ValueError(f"gate_soft_cap must be positive or None, got {self.gate_soft_cap}")
        if self.chunk_size is not None:
            check_chunk_size(self.chunk_size)
        if not isinstance(self.tie_embeddings, bool):
            raise TypeError(f"tie_embeddings must be a bool, got {self.tie_embeddings!r}")

    def head_dims(self) -> tuple[int, int]:
        head = self.d_model // self.num_heads
        return max(1, round(head * self.qk_dim_factor)), max(1, round(head * self.v_dim_factor))

    def ffn_hidden(self) -> int:
        return -(-round(self.d_model * self.ffn_factor) // 8) * 8


class xLSTMLM(nn.Module):
    """Causal LM: embedding, xLSTM blocks, final RMS norm, output head (tied by default).

    Example:
        >>> model = xLSTMLM(xLSTMConfig(vocab_size=50, d_model=32, backend="reference"))
        >>> model(torch.randint(0, 50, (2, 12))).shape
        torch.Size([2, 12, 50])
        >>> model.generate(torch.randint(0, 50, (1, 4)), max_new_tokens=3).shape
        torch.Size([1, 7])
    """

    def __init__(self, config: xLSTMConfig) -> None:
        super().__init__()
        self.config = config
        qk_dim, v_dim = config.head_dims()
        self.embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(
            xLSTMBlock(
                mLSTMLayer(
                    config.d_model, config.num_heads, qk_dim, v_dim,
                    cell=config.cell, chunk_size=config.chunk_size,
                    gate_soft_cap=config.gate_soft_cap, backend=config.backend,
                ),
                config.d_model,
                config.ffn_hidden(),
            )
            for _ in range(config.num_layers)
        )  # fmt: skip
        self.norm = nn.RMSNorm(config.d_model)
        nn.init.normal_(self.embedding.weight, std=config.d_model**-0.5)
        self.head: nn.Linear | None = None
        if not config.tie_embeddings:
            self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
            with torch.no_grad():
                self.head.weight.copy_(self.embedding.weight)  # the tied model's start

    def _check_tokens(self, tokens: torch.Tensor, ndim: int) -> None:
        if tokens.dtype != torch.long or tokens.ndim != ndim:
            shape = "(B, S)" if ndim == 2 else "(B,)"
            raise ValueError(f"tokens must be int64 of shape {shape}, got {tokens.dtype} "
                             f"{tuple(tokens.shape)}")  # fmt: skip
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.config.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size})")

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.head is None:
            return self.norm(x) @ self.embedding.weight.T
        return self.head(self.norm(x))

    def forward(self, tokens: torch.Tensor, states: list | None = None, return_states=False):
        """``tokens (B, S)`` int64 -> logits ``(B, S, vocab)`` (and the per-layer states)."""
        self._check_tokens(tokens, 2)
        x = self.embedding(tokens)
        new_states = []
        for index, block in enumerate(self.blocks):
            x, state = block(x, None if states is None else states[index])
            new_states.append(state)
        logits = self._logits(x)
        return (logits, new_states) if return_states else logits

    def step(self, token: torch.Tensor, states: list) -> tuple[torch.Tensor, list]:
        """One token per sequence, ``token (B,)`` -> ``(logits (B, vocab), new states)``."""
        self._check_tokens(token, 1)
        x = self.embedding(token)
        new_states = []
        for block, state in zip(self.blocks, states, strict=True):
            x, state = block.step(x, state)
            new_states.append(state)
        return self._logits(x), new_states

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue ``prompt (B, S0)`` by ``max_new_tokens``: one chunkwise pass over the prompt,
        then one recurrent step per token (memory independent of the length).

        ``temperature = 0`` picks the most likely token; otherwise tokens are sampled.
        Returns ``(B, S0 + max_new_tokens)``.
        """
        if max_new_tokens < 0 or temperature < 0:
            raise ValueError("max_new_tokens and temperature must be non-negative")
        logits, states = self(prompt, return_states=True)
        logits, out = logits[:, -1], [prompt]
        for step in range(max_new_tokens):
            if temperature == 0:
                token = logits.argmax(-1)
            else:
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                token = torch.multinomial(probs, 1, generator=generator)[:, 0]
            out.append(token[:, None])
            if step + 1 < max_new_tokens:
                logits, states = self.step(token, states)
        return torch.cat(out, dim=1)
