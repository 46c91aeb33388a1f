"""Jet-Nemotron: gated delta rule and dynamic-convolution kernels, the JetBlock, and hybrid
Hugging Face language models built from a pretrained full-attention model.

Importing this package imports neither Triton nor transformers: the Triton kernels load on their
first call, and the Hugging Face model classes (``HybridConfig``, ``HybridForCausalLM``,
``from_pretrained_llama``, ...) on first access.
"""

from __future__ import annotations

import importlib
from importlib import metadata as _metadata
from typing import Any

from jet_nemotron.data import TokenRows, text_rows
from jet_nemotron.distill import DistillConfig, DistillHistory, distill, heldout_loss
from jet_nemotron.modules.dynamic_conv import DynamicShortConvolution
from jet_nemotron.modules.jet_block import JetBlock, JetBlockConfig, JetBlockState
from jet_nemotron.modules.norm import GatedRMSNorm
from jet_nemotron.ops.dynamic_conv import dynamic_causal_conv, dynamic_causal_conv_step
from jet_nemotron.ops.gated_delta import (
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
    naive_recurrent_gated_delta_rule,
)
from jet_nemotron.ops.gated_linear import chunk_gla, fused_recurrent_gla, naive_recurrent_gla
from jet_nemotron.probe import passkey_accuracy, passkey_trial

_MODELS = {
    "HybridCache": "jet_nemotron.models.cache",
    "HybridConfig": "jet_nemotron.models.configuration",
    "HybridForCausalLM": "jet_nemotron.models.modeling",
    "HybridModel": "jet_nemotron.models.modeling",
    "HybridPreTrainedModel": "jet_nemotron.models.modeling",
    "from_pretrained_llama": "jet_nemotron.models.convert",
}

try:
    __version__ = _metadata.version("jet-nemotron")
except _metadata.PackageNotFoundError:  # imported from a source tree (PYTHONPATH), not installed
    __version__ = "0.0.0+source"


def __getattr__(name: str) -> Any:
    """The Hugging Face classes, imported on first access (transformers is heavy)."""
    if name in _MODELS:
        value = getattr(importlib.import_module(_MODELS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jet_nemotron' has no attribute {name!r}")


__all__ = [
    "DistillConfig",
    "DistillHistory",
    "DynamicShortConvolution",
    "GatedRMSNorm",
    "HybridCache",
    "HybridConfig",
    "HybridForCausalLM",
    "HybridModel",
    "HybridPreTrainedModel",
    "JetBlock",
    "JetBlockConfig",
    "JetBlockState",
    "TokenRows",
    "__version__",
    "chunk_gated_delta_rule",
    "chunk_gla",
    "distill",
    "dynamic_causal_conv",
    "dynamic_causal_conv_step",
    "from_pretrained_llama",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gla",
    "heldout_loss",
    "naive_recurrent_gated_delta_rule",
    "naive_recurrent_gla",
    "passkey_accuracy",
    "passkey_trial",
    "text_rows",
]
