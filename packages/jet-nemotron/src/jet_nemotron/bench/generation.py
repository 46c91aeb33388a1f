"""Decoding throughput and cache size against context length: a hybrid vs its full-attention
source model, side by side in one process.

A decoding step's cost depends on how much the cache holds, not on what it holds, so each
context of ``L`` tokens is represented by a cache filled with ``L`` positions of random keys and
values (and random JetBlock states): that makes 16k-64k contexts measurable on a CPU, where a
real prefill of the full-attention model would take many minutes (``real_prefill=True`` runs
one instead, to check that the two agree). Each measurement is the median
time of ``new_tokens`` greedy decoding steps (batch ``batch_size``), as tokens per second, and
the bytes the cache holds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from jet_nemotron.models.cache import HybridCache
from jet_nemotron.models.configuration import HybridConfig
from jet_nemotron.models.modeling import CACHE_FIELD
from jet_nemotron.modules.jet_block import JetBlock, JetBlockState

LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodePoint:
    """Decoding at one context length."""

    context: int
    tokens_per_s: float
    cache_bytes: int


def _kv(batch: int, heads: int, length: int, head_dim: int, like: torch.Tensor) -> torch.Tensor:
    return torch.randn(batch, heads, length, head_dim, dtype=like.dtype, device=like.device)


def filled_cache(model: Any, context: int, batch_size: int = 1) -> Any:
    """A cache holding ``context`` positions of random content for ``model`` (a hybrid, or a
    Hugging Face causal LM using ``DynamicCache``)."""
    config = model.config
    like = next(model.parameters())
    heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if not isinstance(config, HybridConfig):
        cache = DynamicCache(config=config)
        for layer in range(config.num_hidden_layers):
            kv = _kv(batch_size, heads, context, head_dim, like)
            cache.update(kv, kv.clone(), layer)
        return cache
    cache = HybridCache(config)
    blocks = {m.layer_idx: m for m in model.modules() if isinstance(m, JetBlock)}
    for layer, kind in enumerate(config.layer_types):
        if kind == "jet":
            jet = blocks[layer].config
            recurrent = torch.randn(batch_size, jet.num_heads, jet.head_dim, jet.head_v_dim)
            conv = torch.randn(batch_size, jet.value_dim, jet.conv_size, dtype=like.dtype)
            state = JetBlockState(recurrent.to(like.device), conv.to(like.device))
            cache.update_jet_state(layer, state, context)
        else:
            kv = _kv(batch_size, heads, context, head_dim, like)
            cache.update(kv, kv.clone(), layer)
    return cache


def _prefilled_cache(model: Any, context: int, batch_size: int) -> tuple[Any, torch.Tensor]:
    """The cache after a real prefill of ``context`` random tokens, and the next token."""
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch_size, context), generator=generator)
    output = model(input_ids=ids.to(device), use_cache=True)
    return getattr(output, CACHE_FIELD), output.logits[:, -1:].argmax(-1)


@torch.no_grad()
def decode_point(
    model: Any,
    context: int,
    new_tokens: int = 16,
    batch_size: int = 1,
    real_prefill: bool = False,
) -> DecodePoint:
    """Median tokens/s of greedy decoding steps after a ``context``-token cache: random content
    (default) or a real prefill of random tokens (``real_prefill``)."""
    model.eval()
    device = next(model.parameters()).device
    if real_prefill:
        cache, token = _prefilled_cache(model, context, batch_size)
    else:
        cache = filled_cache(model, context, batch_size)
        token = torch.zeros(batch_size, 1, dtype=torch.long, device=device)
    size = _cache_bytes(cache)
    times = []
    for _ in range(new_tokens + 1):  # the first step is a warm-up
        start = time.perf_counter()
        logits = model(input_ids=token, use_cache=True, **{CACHE_FIELD: cache}).logits
        token = logits[:, -1:].argmax(-1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    median = sorted(times[1:])[len(times[1:]) // 2]
    return DecodePoint(context, batch_size / median, size)


def _cache_bytes(cache: Any) -> int:
    if isinstance(cache, HybridCache):
        return cache.cache_bytes()
    return sum(
        t.numel() * t.element_size()
        for layer in cache.layers
        for t in (layer.keys, layer.values)
        if t is not None
    )


def decode_sweep(
    models: dict[str, Any],
    contexts: Sequence[int],
    new_tokens: int = 16,
    batch_size: int = 1,
    max_cache_bytes: int = 8 * 2**30,
    real_prefill: bool = False,
) -> dict[str, list[dict[str, float]]]:
    """:func:`decode_point` for every model at every context, the models interleaved per context.

    A model whose cache would exceed ``max_cache_bytes`` at a context is skipped there (logged).
    """
    results: dict[str, list[dict[str, float]]] = {name: [] for name in models}
    for context in contexts:
        for name, model in models.items():
            estimate = _estimated_bytes(model, context, batch_size)
            if estimate > max_cache_bytes:
                LOGGER.info("%s at %d tokens: cache of %.1f GiB skipped", name, context,
                            estimate / 2**30)  # fmt: skip
                continue
            point = decode_point(model, context, new_tokens, batch_size, real_prefill)
            LOGGER.info("%s at %d tokens: %.1f tokens/s, cache %.1f MiB", name, context,
                        point.tokens_per_s, point.cache_bytes / 2**20)  # fmt: skip
            results[name].append(asdict(point))
    return results


def _estimated_bytes(model: Any, context: int, batch_size: int) -> int:
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_layer = 2 * batch_size * config.num_key_value_heads * context * head_dim
    attention_layers = (
        sum(kind == "attn" for kind in config.layer_types)
        if isinstance(config, HybridConfig)
        else config.num_hidden_layers
    )
    return attention_layers * per_layer * next(model.parameters()).element_size()
