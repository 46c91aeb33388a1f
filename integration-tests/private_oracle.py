"""Shared by the private fine-tuning tests: the brute-force per-example clipping oracle.

The oracle materialises every example's gradient with ``torch.func.vmap(grad(...))`` over the
loss of the whole, unmodified model (``functional_call`` with the trainable parameters), then
clips it explicitly: per parameter tensor to C_l = C/√L, or as a whole to C, with Opacus'
``min(1, bound / (‖g‖ + 1e-6))``; the released gradient is the sum divided by ``divide_by``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.func import functional_call, grad, vmap


def per_example_gradients(
    model: torch.nn.Module, example_loss: Callable, *inputs: torch.Tensor
) -> dict[str, torch.Tensor]:
    """``{name: (B, *shape)}`` for the trainable parameters; ``example_loss(model_call, *xs)``
    gets a callable running the model functionally and one example's inputs (batch of one)."""
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    frozen = {k: v.detach() for k, v in model.named_parameters() if not v.requires_grad}
    buffers = dict(model.named_buffers())

    def loss(p, *xs):
        def call(*args, **kwargs):
            return functional_call(model, {**frozen, **buffers, **p}, args, kwargs)

        return example_loss(call, *(x[None] for x in xs))

    return vmap(grad(loss), in_dims=(None, *([0] * len(inputs))))(params, *inputs)


def clip_and_sum(
    grads: dict[str, torch.Tensor], clipping: str, max_grad_norm: float, divide_by: float
) -> dict[str, torch.Tensor]:
    """Σ_b clip(g_b) / divide_by, per-layer (C_l = C/√L) or flat."""
    norms = {name: g.flatten(1).norm(dim=1) for name, g in grads.items()}
    total = torch.stack(list(norms.values())).norm(dim=0)
    out = {}
    for name, g in grads.items():
        if clipping == "flat":
            norm, bound = total, max_grad_norm
        else:
            norm, bound = norms[name], max_grad_norm / len(grads) ** 0.5
        coef = (bound / (norm + 1e-6)).clamp(max=1.0)
        out[name] = (g * coef.view(-1, *[1] * (g.dim() - 1))).sum(0) / divide_by
    return out


def total_norms(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each example's whole-gradient L2 norm, ``(B,)``."""
    return torch.stack([g.flatten(1).norm(dim=1) for g in grads.values()]).norm(dim=0)


def relative_error(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    """max over all entries of |got - expected|, divided by the largest |expected| entry of the
    whole gradient (entries that are differences of much larger terms, such as a two-expert
    router's bias gradient, carry the rounding error of those terms, not of their own size)."""
    assert got.keys() == expected.keys(), (sorted(got), sorted(expected))
    error = max(float((got[k] - v).abs().max()) for k, v in expected.items())
    return error / max(float(v.abs().max()) for v in expected.values())
