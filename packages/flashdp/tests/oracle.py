"""The brute-force oracle of the clipping tests: per-example gradients materialised with
torch.func, clipped explicitly.

Tolerance: float32 with 1e-5 relative to the largest entry (sums of a few hundred products
reordered between the two computations; observed errors are ~1e-7).
"""

from __future__ import annotations

import torch
from torch.func import functional_call, grad, vmap

RTOL = 1e-5


def brute_force(model, loss_fn, inputs, targets, clipping, max_grad_norm, layer_norms=None):
    """Σ_b clip(g_b) / B from materialised per-example gradients of the original model."""
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def example_loss(p, x, y):
        out = functional_call(model, {**p, **buffers}, (x[None],))
        return loss_fn(out, y[None])

    per_example = vmap(grad(example_loss), in_dims=(None, 0, 0))(params, inputs, targets)
    batch = inputs.shape[0]
    flat_norms = torch.stack([g.flatten(1).norm(dim=1) for g in per_example.values()]).norm(dim=0)
    out = {}
    for name, g in per_example.items():
        if clipping == "flat":
            norms, bound = flat_norms, max_grad_norm
        else:
            norms = g.flatten(1).norm(dim=1)
            bound = layer_norms[name] if layer_norms else max_grad_norm / len(per_example) ** 0.5
        coef = (bound / (norms + 1e-6)).clamp(max=1.0)
        out[name] = (g * coef.view(-1, *[1] * (g.dim() - 1))).sum(0) / batch
    return out


def assert_matches(private, expected):
    got = {k: p.grad for k, p in private.named_parameters() if p.requires_grad}
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        scale = value.abs().max().clamp_min(1e-12)
        error = (got[name] - value).abs().max() / scale
        assert error <= RTOL, f"{name}: relative error {error:.2e}"
