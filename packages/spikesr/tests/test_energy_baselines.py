"""The energy meter against a hand count on tiny networks; the baselines' sizes in closed form."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from spikesr.baselines import EDSR, bicubic_upscale, edsr_parameters, edsr_width_for
from spikesr.energy import E_AC_PJ, E_MAC_PJ, EnergyMeter, add_macs, measure_energy
from spikesr.model import SpikeSR, parameter_count
from spikesr.neuron import LIF, SeqConv2d
from spikesr.resize import imresize


class Tiny(nn.Module):
    """conv (real input) -> LIF -> conv (spikes in) -> linear (real), plus 1000 functional MACs."""

    def __init__(self):
        super().__init__()
        self.conv1 = SeqConv2d(2, 3, 3, padding=1, bias=False)
        self.lif = LIF(0.15)
        self.conv2 = SeqConv2d(3, 4, 1, bias=False)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        spikes = self.lif(self.conv1(x))
        y = self.conv2(spikes)
        add_macs(1000)
        return self.fc(y.mean(dim=(3, 4))), spikes


def test_energy_matches_a_hand_count():
    torch.manual_seed(0)
    model = Tiny()
    x = torch.randn(2, 1, 2, 5, 6)  # T=2, B=1
    meter = EnergyMeter()
    with torch.no_grad(), meter.track(model):
        _, spikes = model(x)
    pixels = 2 * 5 * 6  # T x H x W
    conv1 = pixels * 3 * (2 * 9)  # outputs x fan-in: real input -> MACs
    conv2 = pixels * 4 * 3 * float(spikes.mean())  # spikes in -> ACs = MACs x firing rate
    fc = 2 * 5 * 4
    assert meter.macs == {"conv1": conv1, "attention": 1000.0, "fc": fc}
    assert meter.acs == pytest.approx({"conv2": conv2}, rel=1e-12)
    assert meter.rates["conv2"] == pytest.approx(float(spikes.mean()))
    assert 0 < meter.rates["conv2"] < 1
    expected = E_MAC_PJ * (conv1 + 1000 + fc) + E_AC_PJ * conv2
    assert meter.energy_pj == pytest.approx(expected, rel=1e-12)
    assert (E_AC_PJ, E_MAC_PJ) == (0.9, 4.6)


def test_no_counting_outside_a_meter_and_hooks_removed():
    model = Tiny()
    meter = EnergyMeter()
    with meter.track(model):
        pass
    model(torch.randn(2, 1, 2, 4, 4))  # hooks gone: nothing more is counted
    assert meter.macs == {}
    assert meter.acs == {}
    add_macs(5)  # outside a meter: a no-op


def test_spiking_network_accounts_for_every_layer_of_its_relu_twin():
    torch.manual_seed(1)
    x = torch.rand(1, 3, 16, 16)
    snn = measure_energy(SpikeSR(width=16, groups=1, blocks=1), x)
    ann = measure_energy(SpikeSR(width=16, groups=1, blocks=1, neuron="relu"), x)
    assert snn.acs
    assert not ann.acs
    # every spike-driven layer of the SNN is a MAC layer of the twin, the rest is shared
    assert snn.total_macs + sum(v / snn.rates[k] for k, v in snn.acs.items()) == pytest.approx(
        ann.total_macs, rel=1e-9
    )


def test_edsr_parameters_in_closed_form():
    for scale, width, blocks in ((2, 8, 3), (4, 14, 16), (4, 64, 16)):
        assert parameter_count(EDSR(scale, width, blocks)) == edsr_parameters(scale, width, blocks)
    # EDSR-baseline (16 x 64, x4): 1.52M in Lim et al.
    assert round(edsr_parameters(4, 64, 16) / 1e6, 2) == 1.52
    target = parameter_count(SpikeSR(width=16, groups=2, blocks=1))
    width = edsr_width_for(target, 4, 16)
    gaps = [abs(edsr_parameters(4, w, 16) - target) for w in (width - 1, width, width + 1)]
    assert gaps[1] == min(gaps)


def test_edsr_shapes_and_mean_shift():
    torch.manual_seed(2)
    model = EDSR(2, 8, 2)
    x = torch.rand(2, 3, 7, 9)
    assert model(x).shape == (2, 3, 14, 18)
    for module in model.modules():  # zero weights: the output is the DIV2K mean added back
        if isinstance(module, nn.Conv2d):
            nn.init.zeros_(module.weight), nn.init.zeros_(module.bias)
    torch.testing.assert_close(model(x), model.mean.expand(2, 3, 14, 18))
    with pytest.raises(ValueError, match="scale must be one of"):
        EDSR(3)


def test_bicubic_upscale_is_clipped_imresize():
    rng = np.random.default_rng(3)
    lr = rng.random((6, 5, 3))
    np.testing.assert_allclose(bicubic_upscale(lr, 2), np.clip(imresize(lr, 2), 0, 1), atol=1e-7)
    with pytest.raises(ValueError, match="scale must be one of"):
        bicubic_upscale(lr, 3)
    with pytest.raises(ValueError, match=r"LR image has values in \[0, 248\].*divide by 255"):
        bicubic_upscale(np.round(lr * 255), 2)
