"""SpikeSR: a spiking super-resolution network built from spiking attention blocks (SAB).

The layout follows the anchor's code (``model_archs/spikesr.py`` and ``func.py``):

    x (B, 3, h, w) repeated over T steps -> conv3x3 (head)
      -> m residual groups of n SABs, each group closed by LIF -> conv1x1 -> tdBN, plus its input
      -> + head features -> mean over T -> feature refinement -> conv3x3 -> pixel shuffle (x s)

A SAB is ``LIF -> conv -> tdBN(v_th) -> LIF -> conv -> tdBN(0.2 v_th)`` plus a ``conv -> tdBN``
shortcut, then attention, then the block's input added back. The attention is
``GELU(HDA(u) + DSA(u))``:

* hybrid-dimension attention (HDA): the spatial mean of ``u`` as ``(B, T, C)``, a 1-D conv
  across time steps times a 1-D conv across channels, a sigmoid gate on ``u``;
* deformable similarity attention (DSA), per time step: the map is cut into overlapping
  ``16 x 16`` patches (stride 14); each patch is matched to its most similar other patch
  (Gumbel-softmax, hard, in training; argmax in eval); three pre-norm attention layers over the
  patch's pixels, the first a cross-attention whose query is a modulated deformable conv of the
  patch and whose keys and values are the matched patch; the patches are reassembled and added
  back through a conv.

What differs from the anchor, each a fix: the state of SpikingJelly neurons is reset on every
call and every layer is multi-step without setting a step mode by hand; eval-mode matching
gathers within each image (the anchor indexes across the batch); the deformable conv takes any
patch size (the anchor hard-codes 16); any number of time steps (the anchor repeats 4).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from spikesr import patches
from spikesr.dcn import DeformableConv2d
from spikesr.energy import add_macs
from spikesr.neuron import NEURONS, SeqConv2d, TDBatchNorm, make_neuron, reset_states

SCALES = (2, 4)


@dataclass(frozen=True)
class SpikeSRConfig:
    """Shape of a SpikeSR network. The defaults are the anchor's code: 2.24M parameters at ``x4``
    (the anchor's code counts 3.09M: it also builds two deformable convs per DSA that it never
    uses). The paper's 1.04M corresponds to a width near 33 in the anchor's count, near 40 in ours.

    Attributes:
        scale: upscaling factor, 2 or 4.
        width: feature channels.
        groups: residual groups (m).
        blocks: SABs per group (n).
        time_steps: T, the number of times the input is repeated.
        neuron: "lif" (ours), "spikingjelly" (SpikingJelly's LIFNode, same maths), or "relu" (the
            ANN twin: the same network with ReLU in place of every LIF).
        v_threshold: LIF threshold, also the tdBN's ``v_th``.
        tau: LIF membrane time constant.
        hda: use the hybrid-dimension attention (False: the "without HDA" ablation).
        dsa: use the deformable similarity attention (False: the "without DSA" ablation).
        patch_size: DSA patch side, in low-resolution pixels.
        patch_step: DSA patch stride (anchor: patch_size - 2).
        qk_dim: DSA query / key width.
        mlp_dim: DSA feed-forward width.
        dsa_layers: attention layers per DSA (the first is the deformable cross-attention).
        time_kernel: HDA's kernel size across time steps (anchor: 1).
        channel_kernel: HDA's kernel size across channels (anchor: 1).
    """

    scale: int = 4
    width: int = 64
    groups: int = 4
    blocks: int = 2
    time_steps: int = 4
    neuron: str = "lif"
    v_threshold: float = 0.15
    tau: float = 2.0
    hda: bool = True
    dsa: bool = True
    patch_size: int = 16
    patch_step: int = 14
    qk_dim: int = 32
    mlp_dim: int = 100
    dsa_layers: int = 3
    time_kernel: int = 1
    channel_kernel: int = 1

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, got {self.scale}")
        if self.neuron not in NEURONS:
            raise ValueError(f"neuron must be one of {NEURONS}, got {self.neuron!r}")
        if self.width < 16:
            raise ValueError(
                f"width must be >= 16 (the refinement block divides it by 16), got {self.width}"
            )
        for name in ("groups", "blocks", "time_steps", "qk_dim", "mlp_dim", "dsa_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.patch_step <= self.patch_size:
            raise ValueError(
                f"patch_step must be in [1, patch_size={self.patch_size}], got {self.patch_step}"
            )
        if self.v_threshold <= 0 or self.tau <= 1:
            raise ValueError(
                f"need v_threshold > 0 and tau > 1, got {self.v_threshold}, {self.tau}"
            )
        for name in ("time_kernel", "channel_kernel"):
            if getattr(self, name) < 1 or getattr(self, name) % 2 == 0:
                raise ValueError(f"{name} must be odd and >= 1, got {getattr(self, name)}")

    def to_dict(self) -> dict:
        return asdict(self)


# -- deformable similarity attention ------------------------------------------------------------


def match_patches(crops: torch.Tensor, norm: nn.LayerNorm, *, hard_gumbel: bool) -> torch.Tensor:
    """For each patch of ``crops (B, N, C, p, p)``, its most similar other patch of the same image.

    Similarity: scaled dot products of the layer-normed patch means, the patch itself excluded
    (-100 on the diagonal, as the anchor). Training picks by a hard Gumbel-softmax (straight-
    through gradients); eval by argmax.
    """
    b, n, c, h, w = crops.shape
    q = norm(crops.mean(dim=(-2, -1)))  # (B, N, C)
    logits = q @ q.transpose(-1, -2) * c**-0.5
    logits = logits - 100 * torch.eye(n, device=crops.device, dtype=crops.dtype)
    if hard_gumbel:
        choice = F.gumbel_softmax(logits, tau=1.0, hard=True, dim=-1)
        return (choice @ crops.reshape(b, n, -1)).view(b, n, c, h, w)
    index = logits.argmax(dim=-1)  # (B, N), within each image
    return torch.gather(crops, 1, index.view(b, n, 1, 1, 1).expand(b, n, c, h, w))


class PatchAttention(nn.Module):
    """Single-head attention over a patch's pixels; with ``support``, a cross-attention whose
    query is a modulated deformable conv of the patch."""

    def __init__(self, dim: int, qk_dim: int, patch: int, deformable: bool):
        super().__init__()
        self.patch, self.scale = patch, qk_dim**-0.5
        self.to_q = nn.Linear(dim, qk_dim, bias=False)
        self.to_k = nn.Linear(dim, qk_dim, bias=False)
        self.to_v = nn.Linear(dim, dim, bias=False)
        self.dcn = DeformableConv2d(dim, dim) if deformable else None

    def forward(self, x: torch.Tensor, support: torch.Tensor | None = None) -> torch.Tensor:
        if support is None:
            q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        else:
            image = x.transpose(1, 2).unflatten(2, (self.patch, -1))  # (b, d, p, p)
            query = self.dcn(image).flatten(2).transpose(1, 2)
            q, k, v = self.to_q(query), self.to_k(support), self.to_v(support)
        m, n, _ = q.shape
        add_macs(m * n * n * (q.shape[-1] + v.shape[-1]))  # q k^T and attention x v
        return F.scaled_dot_product_attention(q, k, v, scale=self.scale)


class DeformableSimilarityAttention(nn.Module):
    """The DSA (the anchor's ``GPA``): patch matching, attention layers, reassembly, conv."""

    def __init__(self, config: SpikeSRConfig):
        super().__init__()
        dim, p = config.width, config.patch_size
        self.patch, self.step = p, config.patch_step
        self.match_norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(
            nn.ModuleList([
                nn.LayerNorm(dim),
                PatchAttention(dim, config.qk_dim, p, deformable=i == 0),
                nn.LayerNorm(dim),
                nn.Sequential(
                    nn.Linear(dim, config.mlp_dim), nn.GELU(), nn.Linear(config.mlp_dim, dim)
                ),
            ])
            for i in range(config.dsa_layers)
        )  # fmt: skip
        self.mid_conv = nn.Conv2d(dim, dim, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        crops = patches.divide(x, self.patch, self.step)  # (b, n, c, p, p)
        support = match_patches(crops, self.match_norm, hard_gumbel=self.training)
        n = crops.shape[1]
        tokens = crops.flatten(3).flatten(0, 1).transpose(1, 2)  # (b n, p p, c)
        support = support.flatten(3).flatten(0, 1).transpose(1, 2)
        for i, (norm1, attn, norm2, ffn) in enumerate(self.layers):
            tokens = attn(norm1(tokens), support if i == 0 else None) + tokens
            tokens = ffn(norm2(tokens)) + tokens
        crops = tokens.transpose(1, 2).reshape(b, n, c, self.patch, self.patch)
        return x + self.mid_conv(patches.reverse(crops, h, w, self.step))


# -- spiking attention block --------------------------------------------------------------------


class HybridDimensionAttention(nn.Module):
    """The HDA gate: ``sigmoid(conv_time(m) * conv_channel(m))``, ``m`` the spatial mean (TCJA)."""

    def __init__(self, config: SpikeSRConfig):
        super().__init__()
        t, c = config.time_steps, config.width
        self.conv_t = nn.Conv1d(t, t, config.time_kernel, padding="same", bias=False)
        self.conv_c = nn.Conv1d(c, c, config.channel_kernel, padding="same", bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x (T, B, C, H, W)`` -> the gated ``x``."""
        m = x.mean(dim=(3, 4)).transpose(0, 1)  # (B, T, C)
        gate = torch.sigmoid(self.conv_c(m.transpose(1, 2)).transpose(1, 2) * self.conv_t(m))
        return x * gate.transpose(0, 1)[..., None, None]


class SpikingAttentionBlock(nn.Module):
    """A SAB: spiking residual branch + tdBN shortcut, ``GELU(HDA + DSA)``, input added back."""

    def __init__(self, config: SpikeSRConfig):
        super().__init__()
        c, vth = config.width, config.v_threshold

        def neuron() -> nn.Module:
            return make_neuron(config.neuron, vth, config.tau)

        self.residual = nn.Sequential(
            neuron(), SeqConv2d(c, c, 3, padding=1, bias=False), TDBatchNorm(c, vth),
            neuron(), SeqConv2d(c, c, 3, padding=1, bias=False), TDBatchNorm(c, 0.2 * vth),
        )  # fmt: skip
        self.shortcut = nn.Sequential(
            SeqConv2d(c, c, 3, padding=1, bias=False), TDBatchNorm(c, vth)
        )
        self.hda = HybridDimensionAttention(config) if config.hda else None
        self.dsa = DeformableSimilarityAttention(config) if config.dsa else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.residual(x) + self.shortcut(x)
        parts = []
        if self.hda is not None:
            parts.append(self.hda(u))
        if self.dsa is not None:
            parts.append(self.dsa(u.flatten(0, 1)).unflatten(0, u.shape[:2]))
        out = sum(parts) if parts else u
        return F.gelu(out) + x


class ResidualGroup(nn.Module):
    """n SABs, then LIF -> conv1x1 -> tdBN, plus the group's input."""

    def __init__(self, config: SpikeSRConfig):
        super().__init__()
        c = config.width
        self.body = nn.Sequential(*(SpikingAttentionBlock(config) for _ in range(config.blocks)))
        self.fuse = nn.Sequential(
            make_neuron(config.neuron, config.v_threshold, config.tau),
            SeqConv2d(c, c, 1), TDBatchNorm(c, config.v_threshold),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fuse(self.body(x)) + x


class FeatureRefinement(nn.Module):
    """The anchor's refinement: ``(1 - t) a + t x``, a channel gate ``a``, a spatial gate ``t``."""

    def __init__(self, channels: int, reduction: int = 16):
        super().__init__()
        self.ca = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Conv2d(channels, channels // reduction, 1), nn.ReLU(),
            nn.Conv2d(channels // reduction, channels, 1), nn.Sigmoid(),
        )  # fmt: skip
        self.sa = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.Conv2d(channels, channels // 8, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels // 8, channels, 3, padding=1), nn.Sigmoid(),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, t = self.ca(x), self.sa(x)
        return (1 - t) * a + t * x


class SpikeSR(nn.Module):
    """The SpikeSR network: ``(B, 3, h, w)`` in [0, 1] -> ``(B, 3, s h, s w)``."""

    def __init__(self, config: SpikeSRConfig | None = None, **overrides):
        super().__init__()
        base = {} if config is None else config.to_dict()
        config = SpikeSRConfig(**(base | overrides))
        self.config = config
        c = config.width
        self.head = SeqConv2d(3, c, 3, padding=1, bias=False)
        self.body = nn.Sequential(*(ResidualGroup(config) for _ in range(config.groups)))
        self.refinement = FeatureRefinement(c)
        self.tail = nn.Sequential(
            nn.Conv2d(c, 3 * config.scale**2, 3, padding=1), nn.PixelShuffle(config.scale)
        )

    @property
    def min_size(self) -> int:
        """The smallest low-resolution side the DSA accepts (its patch size)."""
        return self.config.patch_size if self.config.dsa else 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(x, self.min_size)
        reset_states(self)  # SpikingJelly neurons keep a membrane state; ours keep none
        seq = self.head(x.unsqueeze(0).expand(self.config.time_steps, *x.shape))
        features = (self.body(seq) + seq).mean(0)
        return self.tail(self.refinement(features))


def check_input(x: torch.Tensor, min_size: int = 1) -> None:
    """A clear error for what the networks cannot take: not ``(B, 3, H, W)``, or too small."""
    if not torch.is_tensor(x) or x.dim() != 4:
        raise ValueError(
            f"expected images of shape (B, 3, H, W), got {getattr(x, 'shape', type(x))}"
        )
    if x.shape[1] != 3:
        raise ValueError(
            f"expected RGB images with 3 channels, got {x.shape[1]} "
            "(repeat a grayscale image over 3 channels first)"
        )
    if not x.is_floating_point():
        raise ValueError(f"expected floating-point images in [0, 1], got {x.dtype}")
    if min(x.shape[-2:]) < min_size:
        raise ValueError(
            f"the low-resolution input is {x.shape[-2]}x{x.shape[-1]}; the DSA needs at least "
            f"{min_size}x{min_size} (its patch size)"
        )


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
