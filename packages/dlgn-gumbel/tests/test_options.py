"""The authors' settings as options: residual init, difflogic's connections, the threshold-major
thermometer layout, per-example Gumbel noise and the Dirichlet relaxation."""

from __future__ import annotations

import pytest
import torch

from dlgn_gumbel import (
    LogicLayer,
    LogicNet,
    ThermometerEncoder,
    difflogic_connections,
    logic_layer_reference16,
)


def _difflogic_pairs(in_dim: int, count: int) -> list[tuple[int, int]]:
    """The pair sequence of difflogic's ``get_unique_connections``, restated as plain loops:
    (0, 1), (2, 3), ...; then (1, 2), (3, 4), ...; then (i, i + d) for d = 2, 3, ..."""
    pairs = [(i, i + 1) for i in range(0, in_dim - 1, 2)]
    pairs += [(i, i + 1) for i in range(1, in_dim - 1, 2)]
    offset = 2
    while len(pairs) < count:
        pairs += [(i, i + offset) for i in range(in_dim - offset)]
        offset += 1
    return pairs[:count]


@pytest.mark.parametrize(("in_dim", "out_dim"), [(4, 2), (7, 6), (8, 8), (9, 20), (10, 45)])
def test_difflogic_connections_are_the_authors_pairs_in_random_order(in_dim, out_dim):
    a, b = difflogic_connections(in_dim, out_dim, torch.Generator().manual_seed(0))
    got = sorted(zip(a.tolist(), b.tolist(), strict=True))
    assert got == sorted(_difflogic_pairs(in_dim, out_dim))
    assert set(a.tolist()) | set(b.tolist()) == set(range(in_dim))  # every input read


def test_difflogic_connections_shuffle_the_neurons_by_seed():
    first = difflogic_connections(64, 200, torch.Generator().manual_seed(0))
    again = difflogic_connections(64, 200, torch.Generator().manual_seed(0))
    other = difflogic_connections(64, 200, torch.Generator().manual_seed(1))
    assert all(torch.equal(x, y) for x, y in zip(first, again, strict=True))
    assert not torch.equal(first[0], other[0])
    assert sorted(first[0].tolist()) == sorted(other[0].tolist())  # same pairs, other order


def test_difflogic_connections_bad_sizes():
    with pytest.raises(ValueError, match=r"out_dim \* 2 >= in_dim"):
        difflogic_connections(10, 4, torch.Generator())
    with pytest.raises(ValueError, match="exceeds the 3 pairs"):
        difflogic_connections(3, 4, torch.Generator())
    with pytest.raises(ValueError, match="connections must be one of"):
        LogicLayer(4, 4, connections="adjacent")


def test_threshold_major_layout_is_a_permutation_of_the_feature_major_code():
    x = torch.rand(5, 3, 4, generator=torch.Generator().manual_seed(0))
    feature = ThermometerEncoder.uniform(31)(x)
    threshold = ThermometerEncoder.uniform(31, layout="threshold")(x)
    pixels, thresholds = 12, 31
    for f in range(pixels):
        for j in range(thresholds):
            assert torch.equal(threshold[:, j * pixels + f], feature[:, f * thresholds + j])
    # the paper's code: torch.cat([(img > (j + 1) / 32) for j in range(31)]), flattened
    paper = torch.cat([(x > (j + 1) / 32).reshape(5, -1) for j in range(31)], dim=1).float()
    assert torch.equal(threshold, paper)
    with pytest.raises(ValueError, match="layout must be one of"):
        ThermometerEncoder([0.5], layout="pixel")


def test_residual_init_puts_sigma_on_gate_a_exactly():
    layer = LogicLayer(8, 6, init="residual", init_sigma=5.0, seed=0)
    expected = torch.zeros(6, 16)
    expected[:, 3] = 5.0  # gate 3 is "A" (difflogic's order)
    assert torch.equal(layer.weights.detach(), expected)
    # the connections do not depend on the init: a paired comparison with randn
    plain = LogicLayer(8, 6, seed=0)
    assert torch.equal(layer.idx_a, plain.idx_a)
    assert torch.equal(layer.idx_b, plain.idx_b)
    # discretized, every neuron passes its first input through
    bits = (torch.rand(4, 8, generator=torch.Generator().manual_seed(1)) > 0.5).float()
    assert torch.equal(layer.eval()(bits), bits[:, layer.idx_a])
    with pytest.raises(ValueError, match="init must be one of"):
        LogicLayer(8, 6, init="dirichlet")
    with pytest.raises(ValueError, match="init_sigma must be finite"):
        LogicLayer(8, 6, init="residual", init_sigma=float("inf"))


def _train_copy_task(init: str) -> float:
    """Six Gumbel layers of 64 on a task whose answer is input bit 5; discretized accuracy after
    300 Adam steps."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(1024, 32, generator=gen) > 0.5).float()
    y = x[:, 5].long()
    net = LogicNet(
        32, [64] * 6, 2, tau=8.0, relaxation="gumbel", init=init, seed=0, backend="reference"
    )
    optim = torch.optim.Adam(net.parameters(), lr=0.05)
    torch.manual_seed(0)
    for _ in range(300):
        idx = torch.randint(0, 1024, (64,), generator=gen)
        loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
        optim.zero_grad()
        loss.backward()
        optim.step()
    return (net.eval()(x).argmax(1) == y).float().mean().item()


def test_residual_init_trains_a_deep_gumbel_network_where_randn_stays_at_chance():
    """The mechanism in miniature: with N(0, 1) logits every neuron draws a near-random gate at
    every step and the six-layer Gumbel network stays at chance (0.5); started as a pass-through
    (residual init) it learns the task. Over seeds 0-5 the two ended at 0.48-0.52 and
    0.995-1.0; the bounds leave wide margins."""
    assert _train_copy_task("residual") >= 0.95
    assert _train_copy_task("randn") <= 0.65


def _noise(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return -torch.log(-torch.log(torch.rand(shape)))


def test_per_example_noise_is_a_hard_gate_per_example_with_its_own_gradient():
    """Every example draws its own gate: the forward is exactly that one-hot gate per example,
    and the logit gradient is the sum over examples of each example's straight-through gradient
    through ``softmax(w + g_b)`` (a loop over examples as the oracle; float32: 1e-5)."""
    layer = LogicLayer(
        10, 24, relaxation="gumbel", noise="per_example", seed=3, backend="reference"
    ).train()
    gen = torch.Generator().manual_seed(1)
    x = (torch.rand(5, 10, generator=gen) > 0.5).float()
    grad_out = torch.randn(5, 24, generator=gen)
    torch.manual_seed(7)
    y = layer(x)
    (grad_w,) = torch.autograd.grad((torch.tanh(3 * y) * grad_out).sum(), layer.weights)

    noise = _noise((24, 5, 16), 7)  # drawn as (neurons, batch, gates)
    expected = torch.zeros_like(grad_w)
    for b in range(5):
        perturbed = layer.weights.detach() + noise[:, b]
        hard = torch.nn.functional.one_hot(perturbed.argmax(1), 16).float()
        hard.requires_grad_(True)
        y_b = logic_layer_reference16(x[b : b + 1].t(), layer.idx_a, layer.idx_b, hard).t()
        assert torch.equal(y[b : b + 1], y_b)  # binary in, exactly the sampled gate out
        (dl_dw,) = torch.autograd.grad((torch.tanh(3 * y_b) * grad_out[b]).sum(), hard)
        w = layer.weights.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(torch.softmax(w + noise[:, b], 1), w, grad_outputs=dl_dw)
        expected += g
    torch.testing.assert_close(grad_w, expected, atol=1e-5, rtol=1e-4)


def test_per_example_noise_needs_a_stochastic_relaxation():
    with pytest.raises(ValueError, match="draws no noise"):
        LogicLayer(8, 4, relaxation="softmax", noise="per_example")
    with pytest.raises(ValueError, match="draws no noise"):
        LogicNet(8, [10], 2, relaxation="softmax", noise="per_example")


def test_per_example_noise_differs_across_identical_examples():
    layer = LogicLayer(8, 400, relaxation="gumbel", noise="per_example", seed=0).train()
    x = (torch.rand(1, 8, generator=torch.Generator().manual_seed(0)) > 0.5).float()
    torch.manual_seed(0)
    y = layer(x.expand(6, 8).contiguous())
    assert ((y != y[0]).any(0)).sum() > 40  # shared noise would give identical rows


def test_dirichlet_relaxation_mixes_with_a_reparameterised_dirichlet_sample():
    """The authors' ``stochastic="dirichlet"``: ``Dirichlet(softplus(w)).rsample()`` as the gate
    weights of a soft mixture; same RNG state, same sample (float32 sums: 2e-6)."""
    layer = LogicLayer(9, 13, relaxation="dirichlet", seed=0, backend="reference").train()
    x = torch.rand(4, 9, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(5)
    y = layer(x)
    torch.manual_seed(5)
    sample = torch.distributions.Dirichlet(
        torch.nn.functional.softplus(layer.weights.detach())
    ).rsample()
    expected = logic_layer_reference16(x.t(), layer.idx_a, layer.idx_b, sample).t()
    torch.testing.assert_close(y, expected, atol=2e-6, rtol=0)
    y.sum().backward()
    assert layer.weights.grad.abs().sum() > 0  # reparameterised: the logits get a gradient
