"""gate_usage on hand-built networks with known answers, and the discretization gap."""

from __future__ import annotations

import pytest
import torch

from dlgn_gumbel import GATE_NAMES, LogicNet, accuracy, discretization_gap, gate_usage

AND, XOR, A, B, ZERO, ONE, NOT_A = 1, 6, 3, 5, 0, 15, 12


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
