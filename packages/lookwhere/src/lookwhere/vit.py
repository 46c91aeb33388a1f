"""The ViT pieces LookWhere is built from, on plain PyTorch (SDPA).

The layout is DINOv2-with-registers: a patch embedding, learned position embeddings for the patch
grid (bicubically resized for other resolutions), a CLS token and register tokens in front of the
patches (no position embedding on those), pre-norm blocks with LayerScale, a final LayerNorm.
Blocks run on any subset of the patch tokens, with an optional key mask, and can hand back the
pre-softmax attention logits averaged over heads (the teacher's attention map).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ViTConfig:
    """Shape of a ViT: width, depth, heads, patch and image size, registers, channels.

    Attributes:
        dim: Token width.
        depth: Number of blocks.
        heads: Attention heads; `dim` must be a multiple.
        patch_size: Side of a square patch, in pixels.
        image_size: Side of the square input the position embeddings are learned for.
        num_registers: Register tokens after the CLS token (DINOv2-reg uses 4).
        mlp_ratio: MLP hidden width over `dim`.
        channels: Input channels.
        layer_scale: Initial LayerScale value (DINOv2: 1e-5; 1.0 is a plain residual ViT).
        eps: LayerNorm epsilon (DINOv2: 1e-6).
        pos_antialias: Antialias when the position embeddings are resized to a smaller grid
            (timm and transformers' `Dinov2WithRegistersModel` do; transformers' `Dinov2Model`
            and the anchor's `interpolate_pos_encoding` do not).
    """

    dim: int = 64
    depth: int = 4
    heads: int = 4
    patch_size: int = 8
    image_size: int = 112
    num_registers: int = 4
    mlp_ratio: float = 4.0
    channels: int = 3
    layer_scale: float = 1.0
    eps: float = 1e-6
    pos_antialias: bool = False

    def __post_init__(self) -> None:
        for name in ("dim", "depth", "heads", "patch_size", "image_size", "channels"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ViTConfig.{name} must be a positive int, got {value!r}")
        if self.num_registers < 0:
            raise ValueError(f"ViTConfig.num_registers must be >= 0, got {self.num_registers}")
        if self.dim % self.heads:
            raise ValueError(f"ViTConfig.dim {self.dim} is not a multiple of heads {self.heads}")
        if self.image_size % self.patch_size:
            raise ValueError(
                f"ViTConfig.image_size {self.image_size} is not a multiple of patch_size "
                f"{self.patch_size}"
            )
        if self.mlp_ratio <= 0:
            raise ValueError(f"ViTConfig.mlp_ratio must be > 0, got {self.mlp_ratio}")

    @property
    def grid(self) -> int:
        """Patches per side at `image_size`."""
        return self.image_size // self.patch_size

    @property
    def hidden(self) -> int:
        """MLP hidden width."""
        return int(self.dim * self.mlp_ratio)

    @property
    def num_prefix(self) -> int:
        """CLS plus register tokens."""
        return 1 + self.num_registers

    def replace(self, **changes) -> ViTConfig:
        """A copy with some fields changed."""
        return ViTConfig(**{**asdict(self), **changes})

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict."""
        return asdict(self)


def check_images(
    images: torch.Tensor, channels: int, patch_size: int, what: str = "images"
) -> None:
    """A ValueError unless `images` is `(B, channels, H, W)`, `H` and `W` multiples of the patch."""
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"{what} must be a (B, C, H, W) tensor, got {shape}")
    if images.shape[1] != channels:
        raise ValueError(f"{what} have {images.shape[1]} channels; the model takes {channels}")
    height, width = images.shape[-2:]
    if height % patch_size or width % patch_size:
        raise ValueError(
            f"{what} are {height}x{width}, not a multiple of the patch size {patch_size}"
        )
    if not images.is_floating_point():
        raise ValueError(f"{what} must be floating point, got {images.dtype}")


def resize_pos_embed(
    pos_embed: torch.Tensor, grid: tuple[int, int], antialias: bool = False
) -> torch.Tensor:
    """Position embeddings `(1, h*w, D)` of a square grid, bicubically resized to `grid`.

    The DINOv2 / timm convention: the embeddings are laid out as an image, resized with
    `F.interpolate(mode="bicubic", align_corners=False)` in float32, and flattened back row-major.
    A grid of the same size is returned unchanged.
    """
    count, dim = pos_embed.shape[1], pos_embed.shape[2]
    side = math.isqrt(count)
    if side * side != count:
        raise ValueError(f"position embeddings for {count} patches are not a square grid")
    if (side, side) == tuple(grid):
        return pos_embed
    image = pos_embed.reshape(1, side, side, dim).permute(0, 3, 1, 2).float()
    image = F.interpolate(
        image, size=tuple(grid), mode="bicubic", align_corners=False, antialias=antialias
    )
    return image.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], dim).to(pos_embed.dtype)


class PatchEmbed(nn.Module):
    """Non-overlapping `patch_size` patches -> `dim` tokens, row-major, by a strided convolution."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.patch_size = config.patch_size
        self.channels = config.channels
        self.proj = nn.Conv2d(config.channels, config.dim, config.patch_size, config.patch_size)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        check_images(images, self.channels, self.patch_size)
        return self.proj(images).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    """Multi-head self-attention through SDPA; optionally also the head-averaged logits."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.heads = config.heads
        self.head_dim = config.dim // config.heads
        self.qkv = nn.Linear(config.dim, 3 * config.dim)
        self.proj = nn.Linear(config.dim, config.dim)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, length, _ = x.shape
        qkv = self.qkv(x).reshape(batch, length, 3, self.heads, self.head_dim)
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, heads, L, head_dim)

    def forward(
        self,
        x: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        return_logits: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`x (B, L, D)`, `key_mask (B, L)` bool (True = may be attended to).

        Returns the output and, when asked, the pre-softmax logits `q k^T / sqrt(d)` averaged
        over heads, `(B, L, L)`, before any masking (as the teacher's map is defined).
        """
        q, k, v = self._split(x)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        batch, _, length, _ = out.shape
        out = self.proj(out.transpose(1, 2).reshape(batch, length, -1))
        if not return_logits:
            return out, None
        logits = (q @ k.transpose(-2, -1)) * self.head_dim**-0.5
        return out, logits.mean(dim=1)


class LayerScale(nn.Module):
    """Per-channel learned scale of a residual branch (DINOv2's LayerScale)."""

    def __init__(self, dim: int, init: float):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm transformer block: `x + ls1(attn(norm1 x))`, then `x + ls2(mlp(norm2 x))`."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.dim, eps=config.eps)
        self.attn = Attention(config)
        self.ls1 = LayerScale(config.dim, config.layer_scale)
        self.norm2 = nn.LayerNorm(config.dim, eps=config.eps)
        self.fc1 = nn.Linear(config.dim, config.hidden)
        self.fc2 = nn.Linear(config.hidden, config.dim)
        self.ls2 = LayerScale(config.dim, config.layer_scale)

    def forward(
        self,
        x: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        return_logits: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, logits = self.attn(self.norm1(x), key_mask, return_logits)
        x = x + self.ls1(out)
        x = x + self.ls2(self.fc2(F.gelu(self.fc1(self.norm2(x)))))
        return x, logits


@dataclass
class ViTOutput:
    """What a ViT hands back.

    Attributes:
        cls: Normed CLS token `(B, D)`.
        registers: Normed register tokens `(B, R, D)`.
        patches: Normed patch tokens `(B, N, D)` (the tokens it ran on, in input order).
        attention: When asked, the last block's pre-softmax attention logits averaged over heads
            and over patch queries, at patch keys: `(B, N)` (the teacher's attention map).
    """

    cls: torch.Tensor
    registers: torch.Tensor
    patches: torch.Tensor
    attention: torch.Tensor | None = None


class ViT(nn.Module):
    """A DINOv2-with-registers style ViT that can run on a subset of its patch tokens."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbed(config)
        self.pos_embed = nn.Parameter(torch.zeros(1, config.grid**2, config.dim))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim))
        self.register_tokens = nn.Parameter(torch.zeros(1, config.num_registers, config.dim))
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.depth))
        self.norm = nn.LayerNorm(config.dim, eps=config.eps)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Truncated-normal(0.02) tokens, position embeddings and linear weights, zero biases."""
        for tensor in (self.pos_embed, self.cls_token, self.register_tokens):
            nn.init.trunc_normal_(tensor, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Patch tokens plus position embeddings `(B, N, D)` at the images' own grid."""
        tokens = self.patch_embed(images)
        grid = (
            images.shape[-2] // self.config.patch_size,
            images.shape[-1] // self.config.patch_size,
        )
        return tokens + resize_pos_embed(self.pos_embed, grid, self.config.pos_antialias)

    def prefix(self, batch: int) -> torch.Tensor:
        """The learned CLS and register tokens `(B, 1 + R, D)`."""
        return torch.cat(
            [self.cls_token.expand(batch, -1, -1), self.register_tokens.expand(batch, -1, -1)],
            dim=1,
        )

    def run_blocks(
        self,
        tokens: torch.Tensor,
        num_prefix: int,
        key_mask: torch.Tensor | None = None,
        return_attention: bool = False,
        depth: int | None = None,
    ) -> ViTOutput:
        """Blocks `[:depth]` and the final norm over `prefix + patch` tokens `(B, P + N, D)`.

        `key_mask (B, P + N)` bool hides keys (True = visible). With `return_attention`, the last
        block run also reports its attention map over the patch keys.
        """
        blocks = self.blocks if depth is None else self.blocks[:depth]
        x, logits = tokens, None
        for index, block in enumerate(blocks):
            last = index == len(blocks) - 1
            x, logits = block(x, key_mask, return_attention and last)
        x = self.norm(x)
        attention = None
        if return_attention:
            # average over patch queries, keep patch keys
            attention = logits[:, num_prefix:, num_prefix:].mean(dim=1)
        return ViTOutput(
            cls=x[:, 0],
            registers=x[:, 1:num_prefix],
            patches=x[:, num_prefix:],
            attention=attention,
        )

    def forward(self, images: torch.Tensor, return_attention: bool = False) -> ViTOutput:
        """The dense ViT on every patch of `images`."""
        tokens = self.embed(images)
        tokens = torch.cat([self.prefix(tokens.shape[0]), tokens], dim=1)
        return self.run_blocks(tokens, self.config.num_prefix, return_attention=return_attention)


def vit_at_resolution(vit: ViT, image_size: int, depth: int | None = None) -> ViT:
    """A new ViT with `vit`'s weights (its first `depth` blocks) for `image_size` images: the
    position embeddings resized to the new grid once, here."""
    depth = vit.config.depth if depth is None else depth
    if not 1 <= depth <= vit.config.depth:
        raise ValueError(f"depth {depth} must be in [1, {vit.config.depth}]")
    config = vit.config.replace(image_size=image_size, depth=depth)
    state = {
        key: value
        for key, value in vit.state_dict().items()
        if not key.startswith("blocks.") or int(key.split(".")[1]) < depth
    }
    state["pos_embed"] = resize_pos_embed(
        state["pos_embed"], (config.grid, config.grid), config.pos_antialias
    )
    out = ViT(config).to(vit.pos_embed.device)
    out.load_state_dict(state)
    return out


def downsample(images: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear resize to `size x size`, antialiased when shrinking (as `jax.image.resize`).

    16-bit inputs are resized in float32 and cast back (the antialiased kernel has no bf16 CPU
    implementation, and float32 weights are the more exact anyway); float64 stays float64.
    """
    work = images if images.dtype == torch.float64 else images.float()
    out = F.interpolate(
        work, size=(size, size), mode="bilinear", align_corners=False, antialias=True
    )
    return out.to(images.dtype)
