"""FLOPs, counted and in closed form, and measured time.

Convention (torch's ``FlopCounterMode``): 2 FLOPs per multiply-accumulate of every matrix product
and convolution -- linear layers, the patch embedding, attention's `QK^T` and `AV`. Elementwise
work, norms, softmax, resizing, top-k and the IDW fill are not counted. torch's counter has no
formula for the CPU flash-attention op, so :func:`count_flops` adds one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lookwhere.vit import ViTConfig

_aten = torch.ops.aten


def _sdpa_flops(query_shape, key_shape, value_shape) -> int:
    batch, heads, queries, dim = query_shape
    keys, value_dim = key_shape[-2], value_shape[-1]
    return 2 * batch * heads * queries * keys * (dim + value_dim)


def _cpu_flash_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return _sdpa_flops(query, key, value)


_CUSTOM = {}
if hasattr(_aten, "_scaled_dot_product_flash_attention_for_cpu"):
    _CUSTOM[_aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_flash_flops


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of one call of `fn` (no gradients), by torch's counter plus CPU attention."""
    from torch.utils.flop_counter import FlopCounterMode  # imports triton where installed

    with FlopCounterMode(display=False, custom_mapping=_CUSTOM) as counter, torch.no_grad():
        fn()
    return int(counter.get_total_flops())


def block_flops(tokens: int, config: ViTConfig) -> int:
    """One block on `tokens` tokens: QKV, projection, `QK^T`, `AV` and the MLP."""
    dim, hidden = config.dim, config.hidden
    linear = 2 * tokens * dim * (3 * dim + dim + 2 * hidden)
    attention = 2 * 2 * tokens * tokens * dim
    return linear + attention


def patch_embed_flops(config: ViTConfig, patches: int | None = None) -> int:
    """The patch embedding of `patches` patches (default the whole grid)."""
    patches = config.grid**2 if patches is None else patches
    return 2 * patches * config.dim * config.channels * config.patch_size**2


def vit_flops(config: ViTConfig, patches: int | None = None, depth: int | None = None) -> int:
    """A ViT that embeds the whole grid and runs `depth` blocks on `patches` + prefix tokens."""
    patches = config.grid**2 if patches is None else patches
    depth = config.depth if depth is None else depth
    tokens = patches + config.num_prefix
    return patch_embed_flops(config) + depth * block_flops(tokens, config)


def head_flops(dim: int, outputs: int, tokens: int = 1) -> int:
    return 2 * tokens * dim * outputs


def lookwhere_flops(
    selector: ViTConfig, extractor: ViTConfig, k: int, subgrid: int, num_classes: int
) -> int:
    """Selector (low-res ViT + per-patch MLP head) + extractor (whole-grid patch embedding, every
    block on `k` + prefix tokens) + the classification head."""
    low = selector.grid**2
    selector_head = head_flops(selector.dim, 4 * selector.dim, low) + head_flops(
        4 * selector.dim, subgrid**2, low
    )
    return (
        vit_flops(selector)
        + selector_head
        + vit_flops(extractor, patches=k)
        + head_flops(extractor.dim, num_classes)
    )


def dense_flops(config: ViTConfig, num_classes: int) -> int:
    """The dense ViT classifier."""
    return vit_flops(config) + head_flops(config.dim, num_classes)


def measure_time(
    fn: Callable[[], object],
    *,
    device: str | torch.device = "cpu",
    warmup: int = 2,
    repeat: int = 7,
) -> float:
    """Median seconds of `fn()` without gradients (`kernels_common.bench.measure`: CUDA events on
    a GPU, `perf_counter` elsewhere)."""
    from kernels_common.bench import measure

    def call() -> None:
        with torch.no_grad():
            fn()

    return measure(call, device=device, warmup=warmup, repeat=repeat, memory=False).median_s
