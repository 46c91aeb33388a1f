"""The baselines LookWhere is measured against, each a ViT + linear head on CLS:

* :class:`DenseClassifier` -- the full high-resolution ViT (every patch);
* :class:`LowResClassifier` -- the same ViT on a downsampled image (antialiased bilinear);
* :class:`RandomTokenClassifier` -- `k` patches drawn uniformly at random (per image);
* :class:`EViTClassifier` -- EViT (Liang et al., 2022): at 1/4, 1/2 and 3/4 depth, between
  attention and MLP, keep the patch tokens the CLS token attends to most (a `keep_rate` of them)
  and fuse the rest into one token, their sum weighted by that attention (as the official code);
* :class:`ToMeClassifier` -- token merging (Bolya et al., 2023): in every block, between attention
  and MLP, bipartite soft matching on the keys (mean over heads, cosine) merges `r` patch tokens
  into their most similar partners by size-weighted averaging, with proportional attention
  (`log size` added to the logits). CLS and registers are never merged.

Token reduction methods pay for every token first and prune later; LookWhere never computes the
tokens it does not keep.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lookwhere.model import check_k, gather_tokens
from lookwhere.vit import Block, ViT, check_images, downsample, vit_at_resolution


class DenseClassifier(nn.Module):
    """A ViT on every patch of the full image, classified from CLS."""

    def __init__(self, vit: ViT, num_classes: int):
        super().__init__()
        self.vit = vit
        self.head = nn.Linear(vit.config.dim, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.vit(images).cls)


class LowResClassifier(DenseClassifier):
    """The ViT on the image resized (bilinear, antialiased) to `size`; position embeddings are
    resized once, here, to the low-resolution grid."""

    def __init__(self, vit: ViT, num_classes: int, size: int):
        if size % vit.config.patch_size:
            raise ValueError(f"size {size} is not a multiple of the patch {vit.config.patch_size}")
        super().__init__(vit_at_resolution(vit, size), num_classes)
        self.size = size

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        check_images(images, self.vit.config.channels, 1)
        return super().forward(downsample(images, self.size))


class RandomTokenClassifier(DenseClassifier):
    """The ViT on `k` patches drawn uniformly without replacement, per image."""

    def __init__(self, vit: ViT, num_classes: int, k: int):
        super().__init__(vit, num_classes)
        self.k = check_k(k, vit.config.grid**2)

    def forward(
        self, images: torch.Tensor, k: int | None = None, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        k = self.k if k is None else check_k(k, self.vit.config.grid**2)
        tokens = self.vit.embed(images)
        noise = torch.rand(tokens.shape[:2], generator=generator).to(tokens.device)  # CPU draws
        indices = noise.argsort(dim=1)[:, :k]
        tokens = torch.cat([self.vit.prefix(tokens.shape[0]), gather_tokens(tokens, indices)], 1)
        return self.head(self.vit.run_blocks(tokens, self.vit.config.num_prefix).cls)


def _attention_parts(block: Block, x: torch.Tensor, bias: torch.Tensor | None):
    """One block's attention half with an optional additive key bias `(B, L)`; returns the
    residual stream after attention and the head-averaged keys and queries' logits inputs."""
    attn = block.attn
    q, k, v = attn._split(block.norm1(x))
    mask = None if bias is None else bias[:, None, None, :].to(q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    batch, _, length, _ = out.shape
    x = x + block.ls1(attn.proj(out.transpose(1, 2).reshape(batch, length, -1)))
    return x, q, k


def _mlp_half(block: Block, x: torch.Tensor) -> torch.Tensor:
    return x + block.ls2(block.fc2(F.gelu(block.fc1(block.norm2(x)))))


def evit_locations(depth: int) -> list[int]:
    """EViT's reduction blocks: 1/4, 1/2 and 3/4 of the depth (4th, 7th, 10th of 12)."""
    return sorted({max(1, depth * j // 4) for j in (1, 2, 3)} - {depth})


class EViTClassifier(DenseClassifier):
    """EViT: attentive tokens kept, inattentive ones fused, at a few blocks."""

    def __init__(
        self, vit: ViT, num_classes: int, keep_rate: float, locations: list[int] | None = None
    ):
        super().__init__(vit, num_classes)
        self.keep_rate = self._check_rate(keep_rate)
        self.locations = evit_locations(vit.config.depth) if locations is None else list(locations)
        if any(not 0 <= i < vit.config.depth for i in self.locations):
            raise ValueError(
                f"locations {self.locations} must be block indices < {vit.config.depth}"
            )

    @staticmethod
    def _check_rate(rate: float) -> float:
        if not 0 < rate <= 1:
            raise ValueError(f"keep_rate must be in (0, 1], got {rate}")
        return float(rate)

    def forward(self, images: torch.Tensor, keep_rate: float | None = None) -> torch.Tensor:
        rate = self.keep_rate if keep_rate is None else self._check_rate(keep_rate)
        vit, prefix = self.vit, self.vit.config.num_prefix
        x = vit.embed(images)
        x = torch.cat([vit.prefix(x.shape[0]), x], dim=1)
        for index, block in enumerate(vit.blocks):
            if index not in self.locations or rate == 1:
                x, _ = block(x)
                continue
            x, q, k = _attention_parts(block, x, None)
            scale = block.attn.head_dim**-0.5
            cls_attn = torch.softmax((q[:, :, :1] @ k.transpose(-2, -1)) * scale, dim=-1)
            cls_attn = cls_attn.mean(dim=1)[:, 0, prefix:]  # (B, n) over non-prefix tokens
            tokens = x[:, prefix:]
            keep = math.ceil(rate * tokens.shape[1])
            if keep < tokens.shape[1]:
                order = cls_attn.argsort(dim=1, descending=True)
                kept = gather_tokens(tokens, order[:, :keep])
                rest = order[:, keep:]
                weight = torch.gather(cls_attn, 1, rest)[..., None]
                # the official code's fused token: the attention-weighted sum, not renormalised
                fused = (gather_tokens(tokens, rest) * weight).sum(1, keepdim=True)
                x = torch.cat([x[:, :prefix], kept, fused], dim=1)
            x = _mlp_half(block, x)
        return self.head(vit.norm(x)[:, 0])


def bipartite_merge(
    metric: torch.Tensor, tokens: torch.Tensor, size: torch.Tensor, r: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """ToMe's bipartite soft matching: merge `r` tokens of set A (even positions) into their most
    similar (cosine of `metric`) partner in set B (odd positions), size-weighted.

    Args:
        metric: `(B, n, d)` similarity features (the keys, mean over heads).
        tokens: `(B, n, D)` tokens to merge.
        size: `(B, n, 1)` how many original patches each token stands for.
        r: Tokens to remove (at most half, rounded down).

    Returns:
        The merged tokens and sizes, `(B, n - r, .)`: unmerged A tokens, then B.
    """
    r = min(r, tokens.shape[1] // 2)
    if r <= 0:
        return tokens, size
    metric = metric / metric.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    a, b = metric[:, ::2], metric[:, 1::2]
    best, partner = (a @ b.transpose(-2, -1)).max(dim=-1)
    order = best.argsort(dim=-1, descending=True)[..., None]
    unmerged, merged = order[:, r:], order[:, :r]
    target = partner[..., None].gather(1, merged)

    def merge(values: torch.Tensor) -> torch.Tensor:
        src, dst = values[:, ::2], values[:, 1::2]
        width = values.shape[-1]
        keep = src.gather(1, unmerged.expand(-1, -1, width))
        moved = src.gather(1, merged.expand(-1, -1, width))
        dst = dst.scatter_reduce(1, target.expand(-1, -1, width), moved, reduce="sum")
        return torch.cat([keep, dst], dim=1)

    weighted = merge(tokens * size)
    size = merge(size)
    return weighted / size, size


class ToMeClassifier(DenseClassifier):
    """Token merging: `r` patch tokens merged away in every block, proportional attention."""

    def __init__(self, vit: ViT, num_classes: int, r: int):
        super().__init__(vit, num_classes)
        self.r = self._check_r(r)

    @staticmethod
    def _check_r(r: int) -> int:
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise ValueError(f"r must be an int >= 0, got {r!r}")
        return r

    def forward(self, images: torch.Tensor, r: int | None = None) -> torch.Tensor:
        r = self.r if r is None else self._check_r(r)
        vit, prefix = self.vit, self.vit.config.num_prefix
        x = vit.embed(images)
        x = torch.cat([vit.prefix(x.shape[0]), x], dim=1)
        size = x.new_ones(x.shape[0], x.shape[1], 1)
        for block in vit.blocks:
            if r == 0:
                x, _ = block(x)
                continue
            x, _, k = _attention_parts(block, x, size[..., 0].log())
            metric = k.mean(dim=1)[:, prefix:]
            patches, patch_size = bipartite_merge(metric, x[:, prefix:], size[:, prefix:], r)
            x = torch.cat([x[:, :prefix], patches], dim=1)
            size = torch.cat([size[:, :prefix], patch_size], dim=1)
            x = _mlp_half(block, x)
        return self.head(vit.norm(x)[:, 0])


def tome_tokens(patches: int, depth: int, r: int) -> list[int]:
    """Patch tokens entering each block under ToMe with `r` merges per block."""
    counts = []
    for _ in range(depth):
        counts.append(patches)
        patches -= min(r, patches // 2)
    return counts
