"""The multi-step LIF against its difference equation and SpikingJelly 2.0's LIFNode; tdBN against
a hand computation and SpikingJelly's ThresholdDependentBatchNorm2d."""

from __future__ import annotations

import math

import pytest
import torch

from spikesr.neuron import LIF, TDBN_ALPHA, SeqConv2d, TDBatchNorm, make_neuron, spike


def lif_reference(x: torch.Tensor, v_th: float, tau: float) -> torch.Tensor:
    """The difference equation, one element at a time, in float64 Python numbers."""
    t_steps = x.shape[0]
    flat = x.reshape(t_steps, -1).tolist()
    out = torch.zeros(t_steps, len(flat[0]), dtype=torch.float64)
    for i in range(len(flat[0])):
        v = 0.0
        for t in range(t_steps):
            h = v + (0.0 - v) / tau + flat[t][i]
            s = 1.0 if h >= v_th else 0.0
            out[t, i] = s
            v = 0.0 if s else h
    return out.view(x.shape)


@pytest.mark.parametrize("tau", [2.0, 3.5])
def test_lif_matches_difference_equation(tau):
    torch.manual_seed(0)
    x = torch.randn(6, 2, 3, 4, 5, dtype=torch.float64) * 0.3
    assert torch.equal(LIF(0.15, tau)(x), lif_reference(x, 0.15, tau))


def test_lif_holds_subthreshold_charge_and_fires_once_integrated():
    # 0.1 per step under v_th 0.15, tau 2: H = 0.1, then 0.05 + 0.1 = 0.15 -> a spike at t = 1
    x = torch.full((3, 1), 0.1, dtype=torch.float64)
    assert LIF(0.15, 2.0)(x).flatten().tolist() == [0.0, 1.0, 0.0]


def test_surrogate_gradient_is_sigmoid_derivative():
    x = torch.linspace(-1, 1, 11, dtype=torch.float64, requires_grad=True)
    spike(x, 4.0).sum().backward()
    s = torch.sigmoid(4 * x.detach())
    torch.testing.assert_close(x.grad, 4 * s * (1 - s), rtol=0, atol=1e-15)


def test_lif_is_stateless():
    lif = LIF()
    x = torch.rand(4, 2, 8)
    assert torch.equal(lif(x), lif(x))


def test_lif_refuses_bad_tau():
    with pytest.raises(ValueError, match="tau must be > 1"):
        LIF(tau=1.0)


def _spikingjelly():
    return pytest.importorskip("spikingjelly.activation_based.neuron", reason="peer not installed")


def test_lif_equals_spikingjelly_values_and_gradients():
    sj = _spikingjelly()
    torch.manual_seed(1)
    x = (torch.randn(5, 3, 4, 6, 6) * 0.4).requires_grad_()
    ref_node = sj.LIFNode(tau=2.0, v_threshold=0.15, decay_input=False, step_mode="m")
    ours = LIF(0.15, 2.0)(x)
    theirs = ref_node(x)
    assert torch.equal(ours, theirs)
    weights = torch.randn_like(ours)
    (g_ours,) = torch.autograd.grad((ours * weights).sum(), x)
    (g_theirs,) = torch.autograd.grad((theirs * weights).sum(), x)
    # the same float32 operations in the same order: equal to rounding of the backward sums
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-5, atol=1e-6)


def test_spikingjelly_neuron_factory_gives_the_same_spikes():
    _spikingjelly()
    x = torch.randn(4, 2, 3, 5, 5) * 0.3
    node = make_neuron("spikingjelly", 0.15, 2.0)
    assert torch.equal(node(x), LIF(0.15, 2.0)(x))


def test_tdbn_matches_hand_computation():
    torch.manual_seed(2)
    t, b, c = 3, 4, 5
    x = torch.randn(t, b, c, 6, 7, dtype=torch.float64) * 2 + 1
    bn = TDBatchNorm(c, v_th=0.15).double().train()
    out = bn(x)
    mean = x.mean(dim=(0, 1, 3, 4), keepdim=True)
    var = x.var(dim=(0, 1, 3, 4), unbiased=False, keepdim=True)
    # the scale starts at alpha * v_th (stored in float32 before .double(): its rounding, 6e-8)
    assert math.isclose(TDBN_ALPHA, 2**-0.5)
    torch.testing.assert_close(bn.weight, torch.full((c,), 2**-0.5 * 0.15, dtype=torch.float64),
                               rtol=1e-7, atol=0)  # fmt: skip
    expected = bn.weight.view(1, 1, c, 1, 1) * (x - mean) / torch.sqrt(var + 1e-5)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    # running statistics use the unbiased variance over all T * B * H * W values
    n = t * b * 6 * 7
    torch.testing.assert_close(bn.running_var, 0.9 + 0.1 * var.flatten() * n / (n - 1))


def test_tdbn_equals_spikingjelly():
    pytest.importorskip("spikingjelly.activation_based.layer", reason="peer not installed")
    from spikingjelly.activation_based.layer import ThresholdDependentBatchNorm2d

    torch.manual_seed(3)
    x = torch.randn(4, 2, 6, 5, 5)
    theirs = ThresholdDependentBatchNorm2d(alpha=TDBN_ALPHA, v_th=0.15, num_features=6)
    ours = TDBatchNorm(6, 0.15)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-6, atol=1e-6)


def test_seq_conv_is_the_conv_of_every_step():
    torch.manual_seed(4)
    conv = SeqConv2d(3, 4, 3, padding=1)
    x = torch.randn(3, 2, 3, 8, 8)
    out = conv(x)
    for t in range(3):
        torch.testing.assert_close(out[t], torch.nn.functional.conv2d(x[t], conv.weight, conv.bias,
                                                                      padding=1))  # fmt: skip


def test_unknown_neuron_is_refused():
    with pytest.raises(ValueError, match="neuron must be one of"):
        make_neuron("izhikevich", 0.15, 2.0)
