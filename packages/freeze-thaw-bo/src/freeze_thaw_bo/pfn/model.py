"""The learning-curve PFN: a small transformer from (context, queries) to bar-distribution logits.

Tokens (as in the CFBO authors' `TransformerModel`, sums of per-feature encodings):

* start token: epoch 0 with the start value y₀ when known, else a learned "unknown start" vector
  (the authors always pass y₀, default 0; a user of an optimizer rarely knows it);
* context token: configuration x + epoch t/T + observed value y;
* query token: x + t/T.

Every token attends to the start token and the context; a query also attends to itself and to no
other query (the PFN mask, the authors' `generate_D_q_matrix`), so each query's prediction depends
on the context alone. Curves are told apart by a learned per-layer, per-head attention bias added
wherever two tokens carry the same curve id. FT-PFN instead adds a learned embedding per id (and
the CFBO authors' non-transfer path passes id 0 for every observation, which merges all curves);
a same-curve bias depends on ids only through equality, so predictions are exactly invariant to
relabelling ids, and no maximum number of curves is baked into the weights.

Configurations with D < `max_dim_x` dimensions are standardised, scaled by √(max_dim_x/D) and
zero-padded (FT-PFN pads the same way, scaling by max/D), so one model serves any D ≤ `max_dim_x`.

Layers are `torch.nn.TransformerEncoderLayer` (pre-norm, GELU, batch_first), but their forward
pass is written out here: the same-curve bias needs a different mask per task and head, which
the layer's inference fast path mishandles (torch 2.13: wrong outputs for (B·H, L, L) masks in
eval mode), and `forward` computes the context's keys and values once for all queries instead of
running queries through a masked (C + Q)² attention (`forward_masked`, kept as the reference).
Tests check both against each other and against `TransformerEncoderLayer.forward` (training mode).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from freeze_thaw_bo.pfn.bar import BarDistribution
from freeze_thaw_bo.pfn.batch import CurveBatch

__all__ = ["LearningCurvePFN", "PFNConfig"]

_START_ID = -1  # curve ids are >= 0, so the start token never counts as anyone's curve


@dataclass(frozen=True)
class PFNConfig:
    """Architecture and input limits of a `LearningCurvePFN`.

    Attributes:
        max_dim_x: most configuration dimensions D the model accepts.
        d_model, num_layers, num_heads, dim_feedforward: transformer sizes.
        num_bars: buckets of the output bar distribution (equal width on [0, 1]).
        max_context: most context tokens seen in training; larger contexts are out of range.
        max_horizon: most epochs T seen in training.
    """

    max_dim_x: int = 16
    d_model: int = 96
    num_layers: int = 4
    num_heads: int = 4
    dim_feedforward: int = 192
    num_bars: int = 256
    max_context: int = 300
    max_horizon: int = 128

    def __post_init__(self) -> None:
        for name in ("max_dim_x", "d_model", "num_layers", "num_heads", "dim_feedforward"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})"
            )
        if self.num_bars < 2:
            raise ValueError(f"num_bars must be >= 2, got {self.num_bars}")
        if self.max_context < 0 or self.max_horizon < 1:
            raise ValueError(
                f"need max_context >= 0 and max_horizon >= 1, got {self.max_context}, "
                f"{self.max_horizon}"
            )


def _scalar_encoder(d_model: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(1, d_model), nn.GELU(), nn.Linear(d_model, d_model))


class LearningCurvePFN(nn.Module):
    """Predicts a bar distribution over the value at each query (configuration, epoch).

    Example:
        >>> import torch
        >>> from freeze_thaw_bo.pfn.prior import sample_training_batch
        >>> model = LearningCurvePFN(PFNConfig(d_model=32, num_layers=2, num_bars=64))
        >>> batch = sample_training_batch(
        ...     2, torch.Generator().manual_seed(0), max_context=20, num_queries=8
        ... )
        >>> model(batch).shape[-1]
        64
    """

    def __init__(self, config: PFNConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.bar = BarDistribution.uniform(config.num_bars)
        self.x_encoder = nn.Linear(config.max_dim_x, d)
        self.t_encoder = _scalar_encoder(d)
        self.y_encoder = _scalar_encoder(d)
        self.unknown_start = nn.Parameter(torch.randn(d) * 0.02)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d,
                config.num_heads,
                config.dim_feedforward,
                dropout=0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(config.num_layers)
        )
        self.same_curve_bias = nn.Parameter(torch.zeros(config.num_layers, config.num_heads))
        self.norm = nn.LayerNorm(d)
        self.decoder = nn.Sequential(
            nn.Linear(d, config.dim_feedforward),
            nn.GELU(),
            nn.Linear(config.dim_feedforward, config.num_bars),
        )
        for layer in self.layers:  # residual branches start at zero, as in the authors' init
            nn.init.zeros_(layer.self_attn.out_proj.weight)
            nn.init.zeros_(layer.self_attn.out_proj.bias)
            nn.init.zeros_(layer.linear2.weight)
            nn.init.zeros_(layer.linear2.bias)

    # ---------------------------------------------------------------- encoding
    def _encode_x(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        if not 1 <= d <= self.config.max_dim_x:
            raise ValueError(
                f"configurations have {d} dimensions; this model accepts 1..{self.config.max_dim_x}"
            )
        z = (x - 0.5) / math.sqrt(1.0 / 12.0) * math.sqrt(self.config.max_dim_x / d)
        return self.x_encoder(F.pad(z, (0, self.config.max_dim_x - d)))

    @staticmethod
    def _normalised(v: torch.Tensor) -> torch.Tensor:
        return ((v - 0.5) / math.sqrt(1.0 / 12.0)).unsqueeze(-1)

    def _context_tokens(self, batch: CurveBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(start + context tokens (B, 1 + C, d), their ids (B, 1 + C))."""
        b = batch.num_tasks
        zero = torch.zeros(b, 1, device=batch.y_start.device)
        start_value = self.y_encoder(self._normalised(batch.y_start))
        start_value = torch.where(batch.start_known[:, None], start_value, self.unknown_start)
        start = self.t_encoder(self._normalised(zero)) + start_value[:, None, :]
        context = (
            self._encode_x(batch.x_context)
            + self.t_encoder(self._normalised(batch.t_context))
            + self.y_encoder(self._normalised(batch.y_context))
        )
        start_id = torch.full((b, 1), _START_ID, dtype=torch.int64, device=batch.id_context.device)
        ids = torch.cat([start_id, batch.id_context], dim=1)
        return torch.cat([start, context], dim=1), ids

    def _query_tokens(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self._encode_x(x) + self.t_encoder(self._normalised(t))

    def _heads(self, v: torch.Tensor) -> torch.Tensor:
        """(B, L, d) → (B, H, L, d/H)."""
        b, length, d = v.shape
        return v.reshape(b, length, self.config.num_heads, d // self.config.num_heads).transpose(
            1, 2
        )

    @staticmethod
    def _merge(v: torch.Tensor) -> torch.Tensor:
        b, h, length, dh = v.shape
        return v.transpose(1, 2).reshape(b, length, h * dh)

    @staticmethod
    def _feed_forward(layer: nn.TransformerEncoderLayer, h: torch.Tensor) -> torch.Tensor:
        return h + layer.linear2(layer.activation(layer.linear1(layer.norm2(h))))

    def _qkv(self, layer: nn.TransformerEncoderLayer, h: torch.Tensor) -> list[torch.Tensor]:
        qkv = F.linear(layer.norm1(h), layer.self_attn.in_proj_weight, layer.self_attn.in_proj_bias)
        return [self._heads(v) for v in qkv.chunk(3, dim=-1)]

    def _block(
        self, layer: nn.TransformerEncoderLayer, h: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One pre-norm encoder layer with an additive (B, H, L, L) attention mask.

        Returns the new states and the layer's (keys, values). Same arithmetic as
        `layer(h, src_mask=mask.flatten(0, 1))` in training mode.
        """
        q, k, v = self._qkv(layer, h)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = self._feed_forward(layer, h + layer.self_attn.out_proj(self._merge(attended)))
        return h, (k, v)

    def _decode(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(h))

    # ---------------------------------------------------------------- forward
    def _context_states(
        self, context: torch.Tensor, ids: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the context's (keys, values), each (B, H, 1 + C, d/H)."""
        same = (ids[:, :, None] == ids[:, None, :]).unsqueeze(1).to(context.dtype)
        cache = []
        h = context
        for layer, bias in zip(self.layers, self.same_curve_bias, strict=True):
            h, keys_values = self._block(layer, h, same * bias[None, :, None, None])
            cache.append(keys_values)
        return cache

    def _query_pass(
        self,
        h: torch.Tensor,
        ids: torch.Tensor,
        context_ids: torch.Tensor,
        cache: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Queries (B, Q, d) through every layer, attending to the cached context and themselves."""
        same = (ids[:, :, None] == context_ids[:, None, :]).unsqueeze(1).to(h.dtype)
        scale = 1.0 / math.sqrt(self.config.d_model // self.config.num_heads)
        for layer, bias, (k_seen, v_seen) in zip(
            self.layers, self.same_curve_bias, cache, strict=True
        ):
            q, k, v = self._qkv(layer, h)
            head_bias = bias[None, :, None, None]
            to_context = q @ k_seen.transpose(-1, -2) * scale + same * head_bias
            to_self = (q * k).sum(-1, keepdim=True) * scale + head_bias
            weights = torch.softmax(torch.cat([to_context, to_self], dim=-1), dim=-1)
            attended = weights[..., :-1] @ v_seen + weights[..., -1:] * v
            h = self._feed_forward(layer, h + layer.self_attn.out_proj(self._merge(attended)))
        return self._decode(h)

    def forward(self, batch: CurveBatch, chunk_size: int | None = None) -> torch.Tensor:
        """(B, Q, num_bars) logits of the bar distribution at every query.

        The start token and the context attend to each other (layer by layer, as in one
        transformer pass); each query attends to them and to itself only. Keys and values of the
        context are computed once and shared by all queries, which are processed `chunk_size` at
        a time (all at once when None): cost linear in the number of queries. Equal to
        `forward_masked` up to float rounding.
        """
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1 or None, got {chunk_size}")
        context, context_ids = self._context_tokens(batch)
        cache = self._context_states(context, context_ids)
        num_queries = batch.x_query.shape[1]
        step = chunk_size or max(num_queries, 1)
        outputs = [
            self._query_pass(
                self._query_tokens(batch.x_query[:, i : i + step], batch.t_query[:, i : i + step]),
                batch.id_query[:, i : i + step],
                context_ids,
                cache,
            )
            for i in range(0, num_queries, step)
        ]
        if not outputs:
            return context.new_zeros(batch.num_tasks, 0, self.config.num_bars)
        return torch.cat(outputs, dim=1)

    def forward_masked(self, batch: CurveBatch) -> torch.Tensor:
        """Reference for `forward`: one pass over [start, context, queries] with the PFN mask.

        The mask lets every token see the start token and the context, and a query itself (the
        authors' `generate_D_q_matrix`), plus the same-curve bias. Quadratic in the number of
        queries; kept as the oracle of `forward` in the tests.
        """
        context, context_ids = self._context_tokens(batch)
        queries = self._query_tokens(batch.x_query, batch.t_query)
        n_seen, n_query = context.shape[1], queries.shape[1]
        h = torch.cat([context, queries], dim=1)
        ids = torch.cat([context_ids, batch.id_query], dim=1)
        same = (ids[:, :, None] == ids[:, None, :]).unsqueeze(1).to(h.dtype)  # (B, 1, L, L)
        length = n_seen + n_query
        allowed = torch.arange(length, device=h.device)[None, :] < n_seen
        allowed = allowed | torch.eye(length, dtype=torch.bool, device=h.device)
        blocked = torch.zeros(length, length, dtype=h.dtype, device=h.device)
        blocked = blocked.masked_fill(~allowed, float("-inf"))
        for layer, bias in zip(self.layers, self.same_curve_bias, strict=True):
            h, _ = self._block(layer, h, blocked + same * bias[None, :, None, None])
        return self._decode(h[:, n_seen:])

    def nll(self, batch: CurveBatch) -> torch.Tensor:
        """Mean negative log density of `batch.y_query` (the training loss)."""
        if batch.y_query is None:
            raise ValueError("the batch has no targets (y_query)")
        return -self.bar.log_prob(self(batch), batch.y_query).mean()
