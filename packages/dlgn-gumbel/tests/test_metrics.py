"""gate_usage on hand-built networks with known answers, and the discretization gap."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlgn_gumbel import GATE_NAMES, LogicLayer, LogicNet, accuracy, discretization_gap, gate_usage

AND, XOR, A, B, ZERO, ONE, NOT_A, NOT_B = 1, 6, 3, 5, 0, 15, 12, 10


def _hand_built(gates_per_layer, inputs_per_layer, in_dim, classes=1):
    sizes = [len(g) for g in gates_per_layer]
    net = LogicNet(in_dim, sizes, classes, tau=1.0, seed=0, backend="reference")
    with torch.no_grad():
        for layer, gates, (ia, ib) in zip(
            net.layers, gates_per_layer, inputs_per_layer, strict=True
        ):
            layer.weights.zero_()
            layer.weights[torch.arange(len(gates)), torch.tensor(gates)] = 1.0
            layer.idx_a.copy_(torch.tensor(ia))
            layer.idx_b.copy_(torch.tensor(ib))
    return net


def test_gate_usage_known_network():
    # layer 0 (4 neurons on 4 inputs): AND(0,1), XOR(2,3), A(0,1)=pass-through, ONE(2,3)
    # layer 1 (2 outputs): A(n0, n1) reads only n0; NOT_A(n2, n3) reads only n2
    net = _hand_built(
        [[AND, XOR, A, ONE], [A, NOT_A]],
        [([0, 2, 0, 2], [1, 3, 1, 3]), ([0, 2], [1, 3])],
        in_dim=4,
    )
    usage = gate_usage(net)
    assert usage.total == 6
    # A, ONE in layer 0; A, NOT_A in layer 1
    assert usage.pass_through_or_constant == 4
    # n1 (XOR) and n3 (ONE) are read by no gate that depends on them
    assert usage.per_layer_dead == (2, 0)
    assert usage.dead == 2
    # unused = {n1 dead, n2 pass-through, n3 constant+dead, out0, out1 pass-through}
    assert usage.unused == 5
    assert usage.gate_counts["A"] == 2
    assert usage.gate_counts["A xor B"] == 1
    assert sum(usage.gate_counts.values()) == 6
    assert set(usage.gate_counts) == set(GATE_NAMES)


def test_gate_usage_fully_used_network():
    net = _hand_built(
        [[AND, XOR, AND, XOR], [XOR, AND]],
        [([0, 1, 2, 3], [1, 2, 3, 0]), ([0, 2], [1, 3])],
        in_dim=4,
    )
    usage = gate_usage(net)
    assert (usage.dead, usage.pass_through_or_constant, usage.unused) == (0, 0, 0)


def test_gate_usage_dead_chain_propagates():
    # the output ignores its input B (gate A): n1 is dead and so is everything only n1 reads
    net = _hand_built(
        [[AND, AND, XOR], [AND, XOR], [A]],
        [([0, 2, 0], [1, 3, 1]), ([0, 1], [2, 2]), ([0], [1])],
        in_dim=4,
    )
    usage = gate_usage(net)
    # layer 2: A reads n0 of layer 1 only -> layer-1 n1 dead; layer-1 n0 AND(l0 n0, l0 n2)
    # -> layer-0 n1 dead
    assert usage.per_layer_dead == (1, 1, 0)


def test_gate_usage_splits_constant_pass_through_and_negation():
    # layer 0: ZERO, ONE (constants), A, B (pass-through), NOT_A, NOT_B (negation), AND, XOR
    net = _hand_built(
        [[ZERO, ONE, A, B, NOT_A, NOT_B, AND, XOR], [AND, XOR, AND, XOR]],
        [(list(range(8)), [1, 2, 3, 4, 5, 6, 7, 0]), ([0, 2, 4, 6], [1, 3, 5, 7])],
        in_dim=8,
        classes=2,
    )
    usage = gate_usage(net)
    assert (usage.constant, usage.pass_through, usage.negation) == (2, 2, 2)
    assert usage.pass_through_or_constant == 6
    assert usage.dead == 0  # every layer-0 neuron feeds an AND or XOR of layer 1
    assert usage.unused == 6


def test_gate_distribution_statistics_against_numpy():
    """Entropy (bits) and the uncollapsed count, from logits set by hand: a neuron with one
    dominant logit, one uniform, one split evenly between three gates, and random ones."""
    net = LogicNet(6, [5, 4], 2, tau=1.0, seed=0, backend="reference")
    with torch.no_grad():
        w = net.layers[0].weights
        w[0] = 0.0
        w[0, 7] = 20.0  # collapsed: p = e^20 / (e^20 + 15)
        w[1] = 0.0  # uniform: 4 bits
        w[2] = -40.0
        w[2, 1] = w[2, 6] = w[2, 9] = 0.0  # three gates at 1/3: log2(3) bits
    probs = [torch.softmax(layer.weights.detach().double(), 1).numpy() for layer in net.layers]
    entropy = [-(p * np.log2(p)).sum(1) for p in probs]
    assert entropy[0][1] == pytest.approx(4.0, abs=1e-12)
    assert entropy[0][2] == pytest.approx(np.log2(3), abs=1e-9)
    usage = gate_usage(net, collapse_threshold=0.5)
    # the layers' probabilities are float32 softmaxes (relative error ~1e-7 each): 1e-6
    assert usage.mean_entropy_bits == pytest.approx(np.concatenate(entropy).mean(), rel=1e-6)
    expected = tuple(int((p.max(1) < 0.5).sum()) for p in probs)
    assert usage.per_layer_uncollapsed == expected
    assert usage.uncollapsed == sum(expected)
    # at 0.3 the neuron split in thirds counts as collapsed, the uniform one still does not
    low = gate_usage(net, collapse_threshold=0.3)
    assert low.per_layer_uncollapsed[0] == int((probs[0].max(1) < 0.3).sum())
    with pytest.raises(ValueError, match="collapse_threshold"):
        gate_usage(net, collapse_threshold=0.0)


def test_gumbel_samples_follow_the_gate_distribution():
    """The Gumbel-max theorem behind ``gate_distribution``: argmax(w + g) ~ softmax(w). 40,000
    draws of 4 neurons: the frequencies' standard error is <= 0.0025, the bound is 4 of them."""
    layer = LogicLayer(4, 4, relaxation="gumbel", seed=0, backend="reference").train()
    torch.manual_seed(0)
    draws = torch.stack([layer.gate_weights().argmax(1) for _ in range(40_000)])
    freq = torch.nn.functional.one_hot(draws, 16).double().mean(0)
    expected = layer.gate_distribution().detach().double()
    assert (freq - expected).abs().max() < 0.01


def test_discretization_gap_matches_its_definition():
    net = LogicNet(30, [200, 100], 5, tau=4.0, seed=0, backend="reference")
    g = torch.Generator().manual_seed(0)
    x, y = (
        (torch.rand(300, 30, generator=g) > 0.5).float(),
        torch.randint(0, 5, (300,), generator=g),
    )
    gap = discretization_gap(net, x, y, batch_size=128)
    net.eval()
    with torch.no_grad():
        discrete = (net(x).argmax(1) == y).sum().item() / 300
        net.train()
        soft = (net(x).argmax(1) == y).sum().item() / 300  # softmax: deterministic
    assert gap.discrete_accuracy == pytest.approx(discrete, abs=1e-12)
    assert gap.train_accuracy == pytest.approx(soft, abs=1e-12)
    assert gap.gap == pytest.approx(soft - discrete, abs=1e-12)
    assert net.training  # mode restored


def test_accuracy_bad_input():
    net = LogicNet(4, [10], 2, seed=0, backend="reference")
    with pytest.raises(ValueError, match="same non-zero length"):
        accuracy(net, torch.zeros(3, 4), torch.zeros(2, dtype=torch.long), train_mode=False)
    # a non-positive batch size used to skip every batch and report accuracy 0
    with pytest.raises(ValueError, match="batch_size"):
        accuracy(net, torch.zeros(3, 4), torch.zeros(3, dtype=torch.long), train_mode=False,
                 batch_size=-1)  # fmt: skip
