"""Connections, GroupSum, ThermometerEncoder, grad_factor, LogicNet, and their bad inputs."""

from __future__ import annotations

import pytest
import torch

from dlgn_gumbel import GroupSum, LogicLayer, LogicNet, ThermometerEncoder, make_connections


@pytest.mark.parametrize(("in_dim", "out_dim"), [(10, 5), (10, 40), (3, 3), (784, 1000)])
def test_unique_connections(in_dim, out_dim):
    a, b = make_connections(in_dim, out_dim, "unique", torch.Generator().manual_seed(0))
    assert (a != b).all()
    assert set(a.tolist()) | set(b.tolist()) == set(range(in_dim))  # every input read
    pairs = {(min(x, y), max(x, y)) for x, y in zip(a.tolist(), b.tolist(), strict=True)}
    assert len(pairs) == min(out_dim, in_dim * (in_dim - 1) // 2)


def test_random_connections_follow_difflogic_coverage():
    a, b = make_connections(100, 60, "random", torch.Generator().manual_seed(0))
    assert set(a.tolist()) | set(b.tolist()) == set(range(100))  # 2 * out >= in: all read
    counts = torch.bincount(torch.cat([a, b]), minlength=100)
    assert counts.min() >= 1
    assert counts.max() <= 2


def test_unique_needs_wide_enough_layer():
    with pytest.raises(ValueError, match=r"out_dim \* 2 >= in_dim"):
        LogicLayer(10, 4, connections="unique")
    with pytest.raises(ValueError, match="connections"):
        LogicLayer(10, 4, connections="dense")


def test_group_sum_closed_form():
    x = torch.arange(12.0).reshape(2, 6)
    out = GroupSum(3, tau=2.0)(x)
    assert torch.equal(out, torch.tensor([[0.5, 2.5, 4.5], [6.5, 8.5, 10.5]]))
    with pytest.raises(ValueError, match="divisible by 4"):
        GroupSum(4)(x)


def test_thermometer():
    enc = ThermometerEncoder.uniform(3)
    assert torch.allclose(enc.thresholds, torch.tensor([0.25, 0.5, 0.75]))
    x = torch.tensor([[[0.0, 0.3], [0.6, 1.0]]])
    expected = torch.tensor([[0, 0, 0, 1, 0, 0, 1, 1, 0, 1, 1, 1]]).float()
    assert torch.equal(enc(x), expected)
    with pytest.raises(ValueError, match="strictly increasing"):
        ThermometerEncoder([0.5, 0.2])


def test_grad_factor_scales_input_gradient():
    x = torch.rand(4, 6, generator=torch.Generator().manual_seed(0))
    grads = []
    for factor in (1.0, 2.0):
        layer = LogicLayer(6, 8, grad_factor=factor, seed=1, backend="reference").train()
        xi = x.clone().requires_grad_(True)
        layer(xi).sum().backward()
        grads.append(xi.grad)
    torch.testing.assert_close(grads[1], 2 * grads[0], rtol=0, atol=0)


def test_layer_matches_reference_in_batch_major_api():
    from dlgn_gumbel import logic_layer_reference16

    layer = LogicLayer(9, 13, seed=0, backend="reference").train()
    x = torch.rand(5, 9, generator=torch.Generator().manual_seed(0))
    expected = logic_layer_reference16(
        x.t(), layer.idx_a, layer.idx_b, torch.softmax(layer.weights, 1)
    ).t()
    # 16 vs 4 float32 terms of magnitude <= 1: 2e-6
    torch.testing.assert_close(layer(x), expected, atol=2e-6, rtol=0)


def test_logic_net_bad_input():
    with pytest.raises(ValueError, match="divisible by num_classes"):
        LogicNet(10, [20, 15], num_classes=10)
    with pytest.raises(ValueError, match="relaxation"):
        LogicNet(10, [20], num_classes=10, relaxation="sigmoid")
    net = LogicNet(10, [20], num_classes=10, backend="reference")
    with pytest.raises(ValueError, match=r"\(batch, 10\)"):
        net(torch.rand(3, 11))
    with pytest.raises(ValueError, match="in_dim"):
        LogicLayer(0, 3)
