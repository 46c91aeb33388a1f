"""FlashDP: per-layer DP-SGD with per-example clipping fused into each layer's backward.

``make_private(model, ...)`` swaps the model's trainable layers (``nn.Linear``, ``nn.Embedding``,
``nn.LayerNorm``, ``nn.RMSNorm``, GPT-2 ``Conv1D``) for DP layers whose backward clips every
example's gradient without materialising per-example gradients, and whose ``.grad`` receives
Gaussian noise once per logical batch; an RDP accountant of the Poisson-subsampled Gaussian
mechanism reports ε. Modules whose trainable parameters no fused layer covers (adapters) are
refused, or, with ``fallback="vmap"``, clipped from per-example gradients computed under
``torch.func.vmap``.

Importing this package never imports Triton or initialises CUDA.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from flashdp.accountant import (
    DEFAULT_ORDERS,
    RDPAccountant,
    compute_rdp,
    get_epsilon,
    get_noise_multiplier,
    rdp_to_epsilon,
)
from flashdp.config import PrivacyConfig
from flashdp.controller import DPController
from flashdp.engine import PrivacyEngine
from flashdp.layers import DPConv1D, DPEmbedding, DPLayer, DPLayerNorm, DPLinear, DPRMSNorm
from flashdp.private import get_controller, make_private
from flashdp.sampling import DistributedPoissonSampler, PoissonLoader, PoissonSampler

try:
    __version__ = _metadata.version("flashdp")
except _metadata.PackageNotFoundError:  # imported from a source tree (PYTHONPATH), not installed
    __version__ = "0.0.0+source"

__all__ = [
    "DEFAULT_ORDERS",
    "DPController",
    "DPConv1D",
    "DPEmbedding",
    "DPLayer",
    "DPLayerNorm",
    "DPLinear",
    "DPRMSNorm",
    "DistributedPoissonSampler",
    "PoissonLoader",
    "PoissonSampler",
    "PrivacyConfig",
    "PrivacyEngine",
    "RDPAccountant",
    "__version__",
    "compute_rdp",
    "get_controller",
    "get_epsilon",
    "get_noise_multiplier",
    "make_private",
    "rdp_to_epsilon",
]
