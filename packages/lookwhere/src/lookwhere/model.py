"""LookWhere: a low-resolution selector says where to look, a high-resolution extractor sees only
there.

The selector runs a truncated ViT on a bilinearly downsampled image and predicts, per low-res
patch, an `s x s` sub-grid of saliency logits, resized to the high-resolution patch grid. The
extractor patch-embeds the whole high-resolution image, keeps the top-k tokens of the selector map,
prepends the selector's normed CLS and register tokens, and runs all its blocks on those tokens
only. Classification reads the CLS token; dense prediction fills the grid from the kept tokens by
inverse-distance weighting over the 5 nearest (the anchor's upsampler).
"""

from __future__ import annotations

import copy
import math
import operator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lookwhere.vit import ViT, ViTOutput, check_images, downsample, vit_at_resolution

IDW_NEIGHBOURS = 5
IDW_EPS = 1e-8


def check_k(k: int, num_patches: int) -> int:
    """`k` as an int in `[1, num_patches]`, or a ValueError that says what was wrong."""
    if isinstance(k, bool):
        raise ValueError(f"k must be an int, got {k!r}")
    try:
        k = operator.index(k)
    except TypeError:
        raise ValueError(f"k must be an int, got {k!r}") from None
    if not 1 <= k <= num_patches:
        raise ValueError(f"k = {k} must be in [1, {num_patches}], the patches in the grid")
    return k


def topk_indices(saliency: torch.Tensor, k: int) -> torch.Tensor:
    """The `k` most salient patch indices `(B, k)`, most salient first."""
    check_k(k, saliency.shape[-1])
    return torch.topk(saliency, k, dim=-1, sorted=True).indices


def check_indices(indices: torch.Tensor, batch: int, num_patches: int) -> None:
    """A ValueError unless `indices` is an integer `(batch, k)` tensor of patch positions."""
    if not isinstance(indices, torch.Tensor) or indices.dim() != 2 or indices.shape[0] != batch:
        shape = (
            tuple(indices.shape) if isinstance(indices, torch.Tensor) else type(indices).__name__
        )
        raise ValueError(f"indices must be a (B, k) tensor with B = {batch}, got {shape}")
    if indices.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"indices must be int64 or int32, got {indices.dtype}")
    if indices.numel() and not (int(indices.min()) >= 0 and int(indices.max()) < num_patches):
        raise ValueError(f"indices must be patch positions in [0, {num_patches})")


def check_valid(valid: torch.Tensor, indices: torch.Tensor) -> None:
    """A ValueError unless `valid` is a bool mask shaped as `indices (B, k)`, one flag a slot."""
    if not isinstance(valid, torch.Tensor) or valid.shape != indices.shape:
        shape = tuple(valid.shape) if isinstance(valid, torch.Tensor) else type(valid).__name__
        raise ValueError(f"valid must be a {tuple(indices.shape)} mask like indices, got {shape}")
    if valid.dtype != torch.bool:
        raise ValueError(f"valid must be a bool mask (True = the slot counts), got {valid.dtype}")


def gather_tokens(tokens: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """`tokens (B, N, D)` at `indices (B, k)` -> `(B, k, D)`."""
    if indices.dim() != 2 or indices.shape[0] != tokens.shape[0]:
        raise ValueError(
            f"indices must be (B, k) with B = {tokens.shape[0]}, got {tuple(indices.shape)}"
        )
    return torch.gather(tokens, 1, indices[..., None].expand(-1, -1, tokens.shape[-1]))


def scatter_tokens(values: torch.Tensor, indices: torch.Tensor, num_patches: int) -> torch.Tensor:
    """`values (B, k, D)` written at `indices (B, k)` of a zero grid `(B, num_patches, D)`."""
    out = values.new_zeros(values.shape[0], num_patches, values.shape[-1])
    return out.scatter(1, indices[..., None].expand(-1, -1, values.shape[-1]), values)


def idw_upsample(
    values: torch.Tensor,
    indices: torch.Tensor,
    grid: int,
    neighbours: int = IDW_NEIGHBOURS,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fill a `grid x grid` patch grid from kept tokens by inverse-distance weighting.

    Each cell takes the `neighbours` nearest kept tokens (Euclidean distance in patch units, ties
    in kept order), weighted by `1 / (d + 1e-8)` and normalised; a kept cell is, to within 1e-8
    relative, its own token. `valid (B, k)` bool excludes kept slots (per-step k in pre-training:
    their distance is infinite, as in the anchor's JAX code).

    Args:
        values: Kept tokens `(B, k, D)`.
        indices: Their row-major grid positions `(B, k)`.
        grid: Patches per side of the full grid.
        neighbours: Nearest kept tokens each cell averages, >= 1 (5 in the paper).
        valid: Optional mask of the kept slots that count.

    Returns:
        The filled grid, `(B, grid * grid, D)`, row-major.
    """
    if not isinstance(values, torch.Tensor) or values.dim() != 3:
        shape = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
        raise ValueError(f"values must be a (B, k, D) tensor, got {shape}")
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
        raise ValueError(f"grid must be a positive int (patches per side), got {grid!r}")
    check_indices(indices, values.shape[0], grid * grid)
    if values.shape[:2] != indices.shape:
        raise ValueError(
            f"values {tuple(values.shape)} must hold one token per index {tuple(indices.shape)}"
        )
    if isinstance(neighbours, bool) or not isinstance(neighbours, int) or neighbours < 1:
        raise ValueError(f"neighbours must be an int >= 1, got {neighbours!r}")
    batch, kept = indices.shape
    neighbours = min(neighbours, kept)
    # integer coordinates, distances in float64 / float32 without the |a|^2 + |b|^2 - 2ab
    # shortcut: exact whatever the values' dtype (bf16 coordinates would be off by units)
    exact = torch.float64 if values.dtype == torch.float64 else torch.float32
    cells = torch.arange(grid * grid, device=indices.device)
    cell_rc = torch.stack([cells // grid, cells % grid], dim=-1).to(exact)  # (G2, 2)
    kept_rc = torch.stack([indices // grid, indices % grid], dim=-1).to(exact)  # (B, k, 2)
    dist = torch.cdist(
        cell_rc.expand(batch, -1, -1), kept_rc, compute_mode="donot_use_mm_for_euclid_dist"
    )  # (B, G2, k)
    if valid is not None:
        check_valid(valid, indices)
        if not bool(valid.any(dim=1).all()):
            raise ValueError("every image needs at least one valid kept token")
        dist = dist.masked_fill(~valid[:, None, :], math.inf)  # weight 1 / inf = 0
    order = torch.sort(dist, dim=-1, stable=True).indices[..., :neighbours]  # (B, G2, n)
    near = torch.gather(dist, -1, order)
    weights = 1.0 / (near + IDW_EPS)
    weights = (weights / weights.sum(dim=-1, keepdim=True)).to(values.dtype)
    dim = values.shape[-1]
    picked = torch.gather(
        values[:, None].expand(-1, grid * grid, -1, -1),
        2,
        order[..., None].expand(-1, -1, -1, dim),
    )  # (B, G2, n, D)
    return (picked * weights[..., None]).sum(dim=2)


class SelectorHead(nn.Module):
    """Per-patch MLP `dim -> 4 dim -> s^2` (GELU)."""

    def __init__(self, dim: int, outputs: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


@dataclass
class SelectorOutput:
    """The selector's saliency map over the high-res grid `(B, G*G)` and its normed prefix."""

    saliency: torch.Tensor
    prefix: torch.Tensor
    patches: torch.Tensor


class Selector(nn.Module):
    """Low-resolution truncated ViT + per-patch head -> saliency logits on the high-res grid.

    Args:
        vit: The selector's ViT (its `image_size` is the low resolution it sees).
        high_grid: Patches per side of the extractor's high-resolution grid.
        subgrid: `s`, the head's sub-grid per low-res patch; default `ceil(high_grid / low_grid)`
            as in the anchor.
    """

    def __init__(self, vit: ViT, high_grid: int, subgrid: int | None = None):
        super().__init__()
        self.vit = vit
        self.high_grid = int(high_grid)
        self.low_grid = vit.config.grid
        self.subgrid = int(subgrid) if subgrid is not None else math.ceil(high_grid / self.low_grid)
        if self.subgrid < 1:
            raise ValueError(f"subgrid must be >= 1, got {subgrid}")
        self.head = SelectorHead(vit.config.dim, self.subgrid**2)

    @property
    def image_size(self) -> int:
        return self.vit.config.image_size

    def forward(self, images: torch.Tensor) -> SelectorOutput:
        """`images (B, C, H, W)` at high resolution (any size; resized bilinearly, antialiased
        when shrinking, as the anchor's JAX pre-training's `jax.image.resize`)."""
        check_images(images, self.vit.config.channels, 1)
        low = downsample(images, self.image_size)
        out = self.vit(low)
        s, g = self.subgrid, self.low_grid
        logits = self.head(out.patches)  # (B, g*g, s*s)
        logits = logits.reshape(-1, g, g, s, s).permute(0, 1, 3, 2, 4).reshape(-1, 1, g * s, g * s)
        if g * s != self.high_grid:
            logits = downsample(logits, self.high_grid)  # the anchor: 44 -> 37
        prefix = torch.cat([out.cls[:, None], out.registers], dim=1)
        return SelectorOutput(saliency=logits.flatten(1), prefix=prefix, patches=out.patches)


class Extractor(nn.Module):
    """A full-depth ViT that runs only on the selected tokens, after the selector's prefix."""

    def __init__(self, vit: ViT):
        super().__init__()
        self.vit = vit

    @property
    def grid(self) -> int:
        return self.vit.config.grid

    def forward(
        self,
        images: torch.Tensor,
        prefix: torch.Tensor,
        indices: torch.Tensor,
        valid: torch.Tensor | None = None,
    ) -> ViTOutput:
        """Patch-embed `images` at high resolution, keep `indices (B, k)`, run every block.

        `prefix (B, P, D)` is put in front of the kept tokens (the selector's CLS and registers);
        `valid (B, k)` bool hides kept slots as keys (the per-step k of pre-training).
        """
        config = self.vit.config
        check_images(images, config.channels, config.patch_size)
        if images.shape[-2:] != (config.image_size, config.image_size):
            raise ValueError(
                f"the extractor takes {config.image_size}x{config.image_size} images, got "
                f"{images.shape[-2]}x{images.shape[-1]}"
            )
        if prefix.dim() != 3 or prefix.shape[0] != images.shape[0]:
            raise ValueError(
                f"prefix must be (B, P, D) with B = {images.shape[0]}, got {tuple(prefix.shape)}"
            )
        check_indices(indices, images.shape[0], config.grid**2)
        if prefix.shape[-1] != config.dim:
            raise ValueError(
                f"prefix tokens are {prefix.shape[-1]} wide; the extractor is {config.dim}"
            )
        tokens = gather_tokens(self.vit.embed(images), indices)
        tokens = torch.cat([prefix, tokens], dim=1)
        mask = None
        if valid is not None:
            check_valid(valid, indices)
            mask = torch.cat([valid.new_ones(valid.shape[0], prefix.shape[1]), valid], dim=1)
        return self.vit.run_blocks(tokens, prefix.shape[1], key_mask=mask)


@dataclass
class LookWhereOutput:
    """Logits (`(B, classes)`, or `(B, classes, G, G)` for dense), the kept indices, the map."""

    logits: torch.Tensor
    indices: torch.Tensor
    saliency: torch.Tensor
    features: ViTOutput


class LookWhere(nn.Module):
    """Selector + extractor + a linear head, for classification or dense prediction.

    Args:
        selector: Says where to look.
        extractor: Sees there.
        num_classes: Head outputs; 0 gives features only (an identity head).
        k: Default number of high-res tokens to keep.
        dense: Predict per patch (IDW-5 upsampled to the full grid) instead of from CLS.
    """

    def __init__(
        self,
        selector: Selector,
        extractor: Extractor,
        num_classes: int,
        k: int,
        dense: bool = False,
    ):
        super().__init__()
        if selector.high_grid != extractor.grid:
            raise ValueError(
                f"the selector maps onto a {selector.high_grid}^2 grid; the extractor's is "
                f"{extractor.grid}^2"
            )
        if selector.vit.config.dim != extractor.vit.config.dim:
            raise ValueError(
                f"selector width {selector.vit.config.dim} != extractor width "
                f"{extractor.vit.config.dim}: the extractor reads the selector's CLS and registers"
            )
        self.selector = selector
        self.extractor = extractor
        self.k = check_k(k, extractor.grid**2)
        self.dense = dense
        dim = extractor.vit.config.dim
        self.head = nn.Linear(dim, num_classes) if num_classes else nn.Identity()

    def select(self, images: torch.Tensor, k: int) -> tuple[torch.Tensor, SelectorOutput]:
        """The frozen-selector step: saliency map and top-k indices (no gradient)."""
        with torch.no_grad():
            out = self.selector(images)
        return topk_indices(out.saliency, k), out

    def forward(self, images: torch.Tensor, k: int | None = None) -> LookWhereOutput:
        k = self.k if k is None else check_k(k, self.extractor.grid**2)
        indices, selected = self.select(images, k)
        features = self.extractor(images, selected.prefix, indices)
        if self.dense:
            grid = self.extractor.grid
            filled = idw_upsample(features.patches, indices, grid)
            logits = self.head(filled).transpose(1, 2).reshape(images.shape[0], -1, grid, grid)
        else:
            logits = self.head(features.cls)
        return LookWhereOutput(
            logits=logits, indices=indices, saliency=selected.saliency, features=features
        )


def selector_from_teacher(
    teacher: ViT, depth: int, image_size: int, high_grid: int, subgrid: int | None = None
) -> Selector:
    """A selector initialised from a teacher's first `depth` blocks (+ embeddings, final norm),
    its position embeddings bicubically resized to the low-resolution grid, and a new head."""
    if not 1 <= depth <= teacher.config.depth:
        raise ValueError(f"selector depth {depth} must be in [1, {teacher.config.depth}]")
    return Selector(vit_at_resolution(teacher, image_size, depth), high_grid, subgrid)


def extractor_from_teacher(teacher: ViT) -> Extractor:
    """An extractor initialised as a trainable copy of the teacher (whatever the teacher's own
    `requires_grad` flags)."""
    return Extractor(copy.deepcopy(teacher).requires_grad_(True))


def lookwhere_from_teacher(
    teacher: ViT,
    *,
    selector_depth: int,
    selector_size: int,
    num_classes: int = 0,
    k: int = 16,
    subgrid: int | None = None,
    dense: bool = False,
) -> LookWhere:
    """The pre-training initialisation: extractor = teacher, selector = its first blocks."""
    selector = selector_from_teacher(
        teacher, selector_depth, selector_size, teacher.config.grid, subgrid
    )
    return LookWhere(selector, extractor_from_teacher(teacher), num_classes, k, dense=dense)
