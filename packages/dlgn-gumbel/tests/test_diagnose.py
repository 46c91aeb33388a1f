"""The gradient-agreement diagnostic against a direct computation, and its closed-form cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dlgn_gumbel import LogicNet, gradient_agreement


def _net_and_batch(**kwargs):
    net = LogicNet(12, [30, 24, 20], 2, tau=2.0, seed=1, backend="reference", **kwargs)
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(16, 12, generator=gen) > 0.5).float()
    y = torch.randint(0, 2, (16,), generator=gen)
    return net, x, y


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("noise", ["shared", "per_example"])
def test_gradient_agreement_against_a_direct_computation(noise):
    """The cosines recomputed with numpy from gradients taken one by one: the softmax gradient
    of a softmax copy of the network, and each draw under its documented seed (float64
    cosines of float32 gradients: 1e-9)."""
    net, x, y = _net_and_batch(relaxation="gumbel", noise=noise)
    state = torch.random.get_rng_state()
    result = gradient_agreement(net, x, y, draws=5, seed=40)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG is untouched

    def grads(model):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        return [g.double().numpy().ravel() for g in torch.autograd.grad(
            loss, [layer.weights for layer in model.layers])]  # fmt: skip

    soft_net, _, _ = _net_and_batch(relaxation="softmax")
    soft_net.load_state_dict(net.state_dict())
    soft = grads(soft_net.train())
    draws = []
    for d in range(5):
        torch.manual_seed(40 + d)
        draws.append(grads(net.train()))
    assert len(result.layers) == 3
    for i, row in enumerate(result.layers):
        layer_draws = [draw[i] for draw in draws]
        mean = np.mean(layer_draws, axis=0)
        assert row.cos_draw_softmax == pytest.approx(
            np.mean([_cos(g, soft[i]) for g in layer_draws]), abs=1e-9
        )
        assert row.cos_draw_mean == pytest.approx(
            np.mean([_cos(g, mean) for g in layer_draws]), abs=1e-9
        )
        assert row.cos_mean_softmax == pytest.approx(_cos(mean, soft[i]), abs=1e-9)
    assert result.noise == noise
    assert net.layers[0].relaxation == "gumbel"  # the network's settings are restored


def test_softmax_draws_agree_exactly():
    """Without noise every draw is the softmax gradient: every cosine is 1."""
    net, x, y = _net_and_batch()
    result = gradient_agreement(net, x, y, draws=3, relaxation="softmax")
    for row in result.layers:
        for value in (row.cos_draw_softmax, row.cos_draw_mean, row.cos_mean_softmax):
            assert value == pytest.approx(1.0, abs=1e-12)


def test_pure_noise_reference_and_table():
    net, x, y = _net_and_batch(relaxation="gumbel")
    result = gradient_agreement(net, x, y, draws=4)
    assert result.pure_noise_reference == pytest.approx(1 / math.sqrt(4))
    table = result.to_markdown()
    assert "cos(draw, mean of 4)" in table
    assert table.count("\n") == 2 + 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"draws": 1}, "draws must be an int >= 2"),
        ({"relaxation": "tanh"}, "relaxation must be one of"),
        ({"noise": "batch"}, "noise must be one of"),
        ({"relaxation": "softmax", "noise": "per_example"}, "not 'softmax'"),
    ],
)
def test_bad_input(kwargs, match):
    net, x, y = _net_and_batch()
    with pytest.raises(ValueError, match=match):
        gradient_agreement(net, x, y, **kwargs)
    with pytest.raises(ValueError, match="must be non-empty and agree"):
        gradient_agreement(net, x, y[:3])
