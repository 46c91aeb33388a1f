"""Cross-bit gradient alignment: the angle between the gradients that two bit-widths' child
models send to the shared full-precision weights on the same batch. The paper justifies
bit-wise coresets with it (angles below 28°: what one child model learns transfers to the
others, so each can train on its own subset)."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from multibit_quant.data import ImageData
from multibit_quant.model import MultiBitModel


def _flat_gradient(model: MultiBitModel, x: torch.Tensor, y: torch.Tensor, bits: int):
    weights = [layer.weight for layer in model.quant_layers()]
    with model.bits_as(bits):
        loss = F.cross_entropy(model(x), y)
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, weights)])


def gradient_alignment(
    model: MultiBitModel,
    data: ImageData,
    bits: tuple[int, ...] | list[int],
    batches: int = 4,
    batch_size: int = 128,
    seed: int = 0,
) -> dict[tuple[int, int], float]:
    """Mean angle in degrees, over ``batches`` random batches, between the quantized layers'
    weight gradients at every pair of ``bits`` (train mode, as in training; BatchNorm running
    statistics are restored afterwards)."""
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    was_training = model.training
    model.train()
    sums = dict.fromkeys(itertools.combinations(sorted(bits), 2), 0.0)
    try:
        for _ in range(batches):
            index = torch.randint(len(data), (batch_size,), generator=generator)
            x, y = data.images[index].to(device), data.labels[index].to(device)
            grads = {b: _flat_gradient(model, x, y, b) for b in sorted(bits)}
            for a, b in sums:
                cosine = F.cosine_similarity(grads[a], grads[b], dim=0).clamp(-1.0, 1.0)
                sums[(a, b)] += math.degrees(math.acos(float(cosine)))
    finally:
        model.load_state_dict(saved)
        model.train(was_training)
    return {pair: total / batches for pair, total in sums.items()}
