"""How much each layer's attention matters: the held-out loss when it alone is ablated."""

from __future__ import annotations

import torch
from torch import nn

from jet_nemotron.distill import heldout_loss


@torch.no_grad()
def attention_importance(model: nn.Module, rows: torch.Tensor) -> dict[int, float]:
    """Loss increase (nats/token) on ``rows (N, L)`` when layer ``i``'s attention output is
    replaced by zeros, for every layer of a Hugging Face Llama-style causal LM
    (``model.model.layers[i].self_attn``)."""
    base = heldout_loss(model, rows)
    importance = {}
    for index, layer in enumerate(model.model.layers):

        def zero(module, args, output):
            return (torch.zeros_like(output[0]), *output[1:])

        handle = layer.self_attn.register_forward_hook(zero)
        try:
            importance[index] = heldout_loss(model, rows) - base
        finally:
            handle.remove()
    return importance
