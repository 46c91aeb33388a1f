"""Sensitivity audit: removing any one example moves the pre-noise gradient sum by at most C_l per
parameter (per-layer clipping) and by at most C in total (both modes), with adversarial examples
whose raw gradients are ~10⁶ times the bound.

The pre-noise sum is read as ``.grad * expected_batch_size`` with noise 0 (the denominator is
fixed, so it does not depend on the batch). The bound holds up to float32 rounding of the norms:
relative slack 1e-5.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flashdp

SLACK = 1 + 1e-5


def model_and_batch():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Embedding(13, 8), nn.LayerNorm(8), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 13)
    )
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 13, (6, 5), generator=generator)
    targets = torch.randint(0, 13, (6, 5), generator=generator)
    scales = torch.ones(6)
    scales[[1, 4]] = 1e6  # adversarial examples with huge gradients
    return model, tokens, targets, scales


def pre_noise_sums(model, clipping, tokens, targets, scales, keep):
    private = flashdp.make_private(
        model,
        max_grad_norm=2.0,
        noise_multiplier=0.0,
        clipping=clipping,
        expected_batch_size=10,
        loss_reduction="sum",
        backend="reference",
    )
    logits = private(tokens[keep])
    per_token = nn.functional.cross_entropy(
        logits.reshape(-1, 13), targets[keep].reshape(-1), reduction="none"
    ).view(len(keep), -1)
    (per_token.sum(1) * scales[keep]).sum().backward()
    sums = {name: p.grad * 10 for name, p in private.named_parameters()}
    for p in private.parameters():
        p.grad = None
    return sums, dict(flashdp.get_controller(private).config.layer_norms)


@pytest.mark.parametrize("clipping", ["per_layer", "flat"])
def test_removing_one_example_is_bounded(clipping):
    import copy

    model, tokens, targets, scales = model_and_batch()
    everyone = list(range(6))
    full, bounds = pre_noise_sums(copy.deepcopy(model), clipping, tokens, targets, scales, everyone)
    for removed in everyone:
        keep = [i for i in everyone if i != removed]
        partial, _ = pre_noise_sums(copy.deepcopy(model), clipping, tokens, targets, scales, keep)
        diffs = {name: (full[name] - partial[name]).norm() for name in full}
        total = torch.stack(list(diffs.values())).norm()
        assert total <= 2.0 * SLACK, f"removing example {removed}: total change {total}"
        if clipping == "per_layer":
            for name, diff in diffs.items():
                assert diff <= bounds[name] * SLACK, f"{name}: {diff} > C_l = {bounds[name]}"
        if removed in (1, 4):  # the adversarial examples are clipped right at the bound
            assert total >= 0.99 * 2.0
            if clipping == "per_layer":
                assert all(diffs[name] >= 0.99 * bound for name, bound in bounds.items())


# An example whose rows nearly cancel: the per-example gradient is ~1e-3 of its rows' products,
# which the float32 Gram form ⟨XXᵀ, GGᵀ⟩ cannot resolve. The remaining slack is the float32
# rounding of the cancelling sum itself (relative 2⁻²⁴ of the rows, amplified ~1e3).
CANCELLING_SLACK = 1 + 1e-3


def cancelling_rows(generator, width):
    base = torch.randn(width, generator=generator)
    nearby = base + 1e-3 * torch.randn(width, generator=generator)
    return base, nearby


@pytest.mark.parametrize("seed", range(4))
def test_cancelling_rows_cannot_escape_the_bound_linear(seed):
    generator = torch.Generator().manual_seed(seed)
    width = 64  # T·(D_in + D_out) <= D_in·D_out: the reference takes the Gram form
    v, v_nearby = cancelling_rows(generator, width)
    u = 1e6 * torch.randn(width, generator=generator)
    private = flashdp.make_private(
        nn.Linear(width, width, bias=False),
        max_grad_norm=1.0,
        noise_multiplier=0.0,
        expected_batch_size=1,
        loss_reduction="sum",
        backend="reference",
    )
    out = private(torch.stack([v, v_nearby])[None])  # one example, two rows
    (out[0, 0] @ u - out[0, 1] @ u).backward()  # output-gradient rows u and -u
    assert private.weight.grad.norm() <= 1.0 * CANCELLING_SLACK


@pytest.mark.parametrize("seed", range(4))
def test_cancelling_rows_cannot_escape_the_bound_embedding(seed):
    generator = torch.Generator().manual_seed(seed)
    width = 32
    u, u_nearby = cancelling_rows(generator, width)
    private = flashdp.make_private(
        nn.Embedding(5, width),
        max_grad_norm=1.0,
        noise_multiplier=0.0,
        expected_batch_size=1,
        loss_reduction="sum",
        backend="reference",
    )
    out = private(torch.tensor([[3, 3]]))  # one example, the same token twice
    (1e6 * (out[0, 0] @ u - out[0, 1] @ u_nearby)).backward()
    assert private.weight.grad.norm() <= 1.0 * CANCELLING_SLACK
