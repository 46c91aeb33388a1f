"""Noise: the documented standard deviation σ·C/B, added exactly once per logical batch."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import flashdp


def linear_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 30), nn.Tanh(), nn.Linear(30, 20))


def released(model, batches, *, sigma, accumulate, seed=0, expected=None):
    private = flashdp.make_private(
        copy.deepcopy(model),
        max_grad_norm=1.5,
        noise_multiplier=sigma,
        expected_batch_size=expected,
        loss_reduction="sum",
        generator=torch.Generator().manual_seed(seed),
        backend="reference",
    )
    controller = flashdp.get_controller(private)
    if accumulate:
        with controller.accumulate():
            for x in batches:
                private(x).square().sum().backward()
    else:
        private(torch.cat(batches)).square().sum().backward()
    assert controller.steps == 1
    return {name: p.grad.clone() for name, p in private.named_parameters()}


def noise_only(model, batches, sigma, accumulate, seed):
    noisy = released(model, batches, sigma=sigma, accumulate=accumulate, seed=seed)
    clean = released(model, batches, sigma=0.0, accumulate=accumulate, seed=seed)
    return torch.cat([(noisy[k] - clean[k]).flatten() for k in noisy])


# 6·30 + 30 + 30·20 + 20 = 830 noise coordinates per release, 4 releases: 3320 samples. The
# sample standard deviation of n Gaussians has relative standard error 1/√(2n) = 1.2%; 5% is
# four standard errors, and a second noise draw per micro-batch (accumulation bug) would show
# up as √3 = +73%.
STD_TOLERANCE = 0.05


@pytest.mark.parametrize("accumulate", [False, True], ids=["one-batch", "three-micro-batches"])
def test_noise_std_and_once_per_logical_batch(accumulate):
    model = linear_model()
    generator = torch.Generator().manual_seed(5)
    batches = [torch.randn(4, 6, generator=generator) for _ in range(3)]
    noise = torch.cat([noise_only(model, batches, 0.8, accumulate, seed) for seed in range(4)])
    expected_std = 0.8 * 1.5 / 12  # σ·C / B, B = 12 examples
    assert noise.std().item() == pytest.approx(expected_std, rel=STD_TOLERANCE)
    assert noise.mean().abs().item() < 4 * expected_std / math.sqrt(noise.numel())


def test_accumulation_equals_one_batch_without_noise():
    model = linear_model()
    generator = torch.Generator().manual_seed(6)
    batches = [torch.randn(n, 6, generator=generator) for n in (3, 1, 5)]
    whole = released(model, batches, sigma=0.0, accumulate=False)
    pieces = released(model, batches, sigma=0.0, accumulate=True)
    for name in whole:
        torch.testing.assert_close(pieces[name], whole[name], rtol=1e-5, atol=1e-7)


def test_expected_batch_size_is_the_denominator():
    model = linear_model()
    batches = [torch.randn(4, 6, generator=torch.Generator().manual_seed(1))]
    actual = released(model, batches, sigma=0.0, accumulate=False)
    fixed = released(model, batches, sigma=0.0, accumulate=False, expected=10)
    for name in actual:
        torch.testing.assert_close(fixed[name] * 10, actual[name] * 4)


def test_empty_logical_batch_releases_pure_noise():
    private = flashdp.make_private(
        linear_model(),
        max_grad_norm=1.0,
        noise_multiplier=2.0,
        expected_batch_size=50,
        sample_rate=0.01,
        generator=torch.Generator().manual_seed(0),
    )
    controller = flashdp.get_controller(private)
    with controller.accumulate():
        pass  # Poisson sampling drew no example
    noise = torch.cat([p.grad.flatten() for p in private.parameters()])
    assert noise.std().item() == pytest.approx(2.0 / 50, rel=0.1)  # 830 samples: 2.5% s.e.
    assert controller.steps == 1
    assert controller.epsilon(1e-5) == pytest.approx(flashdp.get_epsilon(2.0, 0.01, 1, 1e-5))


def test_empty_batch_without_expected_size_is_refused():
    private = flashdp.make_private(linear_model(), max_grad_norm=1.0, noise_multiplier=1.0)
    controller = flashdp.get_controller(private)
    with pytest.raises(ValueError, match="expected_batch_size"), controller.accumulate():
        pass
    assert all(p.grad is None for p in private.parameters())


def test_release_adds_to_existing_grad_and_counts_steps():
    private = flashdp.make_private(
        linear_model(), max_grad_norm=1.0, noise_multiplier=0.0, backend="reference"
    )
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(2))
    private(x).sum().backward()
    first = [p.grad.clone() for p in private.parameters()]
    private(x).sum().backward()
    for p, g in zip(private.parameters(), first, strict=True):
        torch.testing.assert_close(p.grad, 2 * g)
    assert flashdp.get_controller(private).steps == 2


class _FailOnce(torch.autograd.Function):
    """Identity whose backward raises the first time (a backward that fails midway)."""

    failed = False

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if not _FailOnce.failed:
            _FailOnce.failed = True
            raise RuntimeError("backward failed midway")
        return grad


@pytest.mark.parametrize("accumulate", [False, True], ids=["plain", "in-accumulate"])
def test_failed_backward_leaves_nothing_behind(accumulate):
    """The layers a failed backward reached before raising must not leak into a later release."""
    _FailOnce.failed = False
    model = linear_model()
    private = flashdp.make_private(
        copy.deepcopy(model),
        max_grad_norm=1.0,
        noise_multiplier=0.0,
        expected_batch_size=4,
        loss_reduction="sum",
        backend="reference",
    )
    controller = flashdp.get_controller(private)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(3))

    def failing_then_retried():
        with pytest.raises(RuntimeError, match="failed midway"):
            private[2](_FailOnce.apply(private[1](private[0](x)))).square().sum().backward()
        private[0](x).square().sum().backward()  # only the first layer: a disjoint pass

    if accumulate:
        with pytest.raises(RuntimeError, match="discarded"), controller.accumulate():
            failing_then_retried()
        assert all(p.grad is None for p in private.parameters())
        assert controller.steps == 0
        return
    failing_then_retried()
    assert controller.steps == 1
    # the second pass did not reach the last layer: with noise 0 its gradient is exactly zero
    assert torch.count_nonzero(private[2].weight.grad) == 0
    assert torch.count_nonzero(private[2].bias.grad) == 0
    assert torch.count_nonzero(private[0].weight.grad) > 0
