"""quantize(), the switchable layers, switchable BatchNorm and checkpoints."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from multibit_quant import (
    MultiBitModel,
    QuantConfig,
    QuantConv2d,
    QuantLinear,
    SwitchBatchNorm2d,
    load_checkpoint,
    preact_resnet20,
    quantize,
    save_checkpoint,
    small_vit,
    switch_batchnorm,
)
from multibit_quant.layers import nearest_bits
from multibit_quant.reference import fake_quant_activation_reference, fake_quant_weight_reference


def tiny_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Conv2d(4, 6, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(6 * 8 * 8, 12),
        nn.Tanh(),
        nn.Linear(12, 3),
    )


def test_quantize_wraps_all_but_first_and_last_sharing_parameters():
    net = tiny_net()
    originals = dict(net.named_parameters())
    model = quantize(net, bits=[2, 4, 8])
    kinds = [type(m) for m in net if isinstance(m, nn.Conv2d | nn.Linear)]
    assert kinds == [nn.Conv2d, QuantConv2d, QuantLinear, nn.Linear]
    for name, parameter in net.named_parameters():
        if name in originals:
            assert parameter is originals[name]  # the same tensors, trained in place
    assert set(originals) <= set(dict(net.named_parameters()))
    assert model.bits == 8
    assert all(layer.bits == 8 for layer in model.quant_layers())


def test_layer_forward_equals_the_quantizers_composed_by_hand():
    model = quantize(tiny_net(), bits=[2, 4, 8])
    conv = model.model[3]
    x = F.relu(torch.randn(2, 4, 8, 8))
    for bits in (2, 3, 8):
        model.set_bits(bits)
        w = fake_quant_weight_reference(
            conv.weight.reshape(6, -1), bits, "dorefa", None, "mean_var"
        )
        xq = fake_quant_activation_reference(x, bits, "clamp", None, False)
        expected = F.conv2d(xq, w.view_as(conv.weight), conv.bias, padding=1)
        torch.testing.assert_close(conv(x), expected, rtol=0, atol=0)


def test_full_precision_is_the_original_network():
    net = tiny_net()
    x = torch.randn(3, 1, 8, 8)
    expected = net.eval()(x)
    model = quantize(net, bits=[4, 32]).eval()
    with model.bits_as(32):
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    assert model.bits == 32  # the highest trained bit-width is the default


def test_set_bits_switches_every_layer_and_bits_as_restores():
    model = switch_batchnorm(quantize(preact_resnet20(width=4), bits=[2, 4, 8]))
    with model.bits_as(3):
        switched = [
            m.bits for m in model.modules() if isinstance(m, QuantConv2d | SwitchBatchNorm2d)
        ]
        assert set(switched) == {3}
    assert {layer.bits for layer in model.quant_layers()} == {8}
    with pytest.raises(ValueError, match="bits"):
        model.set_bits(9)
    with pytest.raises(ValueError, match="bits"):
        model.set_bits(1)


def test_switch_batchnorm_keeps_one_norm_per_trained_bit_width():
    model = switch_batchnorm(quantize(tiny_net(), bits=[2, 8]))
    norm = model.model[1]
    assert isinstance(norm, SwitchBatchNorm2d)
    assert set(norm.norms) == {"2", "8"}
    model.train()
    x = torch.randn(4, 1, 8, 8)
    with model.bits_as(2):
        model(x)
    assert not torch.equal(norm.norms["2"].running_mean, norm.norms["8"].running_mean)
    assert nearest_bits(5, (2, 8)) == 8
    assert nearest_bits(4, (2, 8)) == 2
    assert nearest_bits(5, (4, 6)) == 6  # a tie goes to the higher bit-width


def test_activation_sign_is_decided_at_the_first_forward():
    vit = quantize(small_vit(dim=16, depth=1, heads=2), bits=[4])
    resnet = quantize(preact_resnet20(width=4), bits=[4])
    vit(torch.randn(2, 1, 28, 28))
    resnet(torch.randn(2, 1, 28, 28))
    assert {int(layer.act_sign) for layer in vit.quant_layers()} == {1}  # after LayerNorm
    assert {int(layer.act_sign) for layer in resnet.quant_layers()} == {0}  # after ReLU
    forced = quantize(tiny_net(), bits=[4], config=QuantConfig(signed_activations=True))
    assert {int(layer.act_sign) for layer in forced.quant_layers()} == {1}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_quantize_creates_its_state_on_the_model_device(dtype):
    """A model already on an accelerator (the meta device stands in: no values, any device
    check applies) gets its LSQ steps and sign buffer on that device, the steps in its dtype,
    and runs a forward there."""
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    config = QuantConfig(weight="lsq", activation="lsq")
    model = quantize(net.to(device="meta", dtype=dtype), bits=[2, 4], config=config)
    layer = model.quant_layers()[0]
    state = dict(layer.named_parameters()) | dict(layer.named_buffers())
    assert {name: t.device.type for name, t in state.items()} == dict.fromkeys(state, "meta")
    assert {layer.act_steps[b].dtype for b in ("2", "4")} == {dtype}
    # meta tensors have no values: skip the data-dependent step init and sign detection
    layer._act_ready, layer._signed = True, False
    assert model(torch.randn(3, 4, device="meta", dtype=dtype)).shape == (3, 2)


def test_lsq_untrained_bit_width_keeps_the_nearest_clipping_range():
    config = QuantConfig(weight="lsq", activation="lsq")
    model = quantize(tiny_net(), bits=[2, 8], config=config)
    model(torch.randn(2, 1, 8, 8))  # initialises the activation steps
    layer = model.model[3]
    assert set(layer.weight_steps) == {"2", "8"}
    assert set(layer.act_steps) == {"2", "8"}
    # 5 bits: nearest trained is 8 (|5 - 2| = |5 - 8|, the higher wins); range Q_p·s is kept
    for steps, signed in ((layer.weight_steps, True), (layer.act_steps, False)):
        q_p = {b: (2 ** (b - 1) - 1 if signed else 2**b - 1) for b in (5, 8)}
        expected = steps["8"].detach() * q_p[8] / q_p[5]
        torch.testing.assert_close(layer._step(steps, 5, signed), expected)
    assert all(float(s.detach()) > 0 for s in layer.act_steps.values())


def test_checkpoint_round_trip(tmp_path):
    for config, per_bit in ((QuantConfig(), False), (QuantConfig("lsq", "lsq"), True)):
        model = quantize(preact_resnet20(width=4), bits=[2, 4], config=config)
        if per_bit:
            switch_batchnorm(model)
        model.train()
        model(torch.randn(8, 1, 28, 28))
        model.eval()
        architecture = {
            "name": "resnet20",
            "num_classes": 10,
            "in_channels": 1,
            "kwargs": {"width": 4},
        }
        save_checkpoint(model, tmp_path / str(per_bit), architecture)
        loaded, meta = load_checkpoint(tmp_path / str(per_bit))
        assert meta["per_bit_batchnorm"] is per_bit
        x = torch.randn(3, 1, 28, 28)
        for bits in (2, 3, 4):
            with model.bits_as(bits), loaded.bits_as(bits):
                torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_bad_quantize_calls(tmp_path):
    with pytest.raises(ValueError, match="no Conv2d/Linear layer left"):
        quantize(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)), bits=[4])
    with pytest.raises(ValueError, match="at least one bit-width"):
        quantize(tiny_net(), bits=[])
    with pytest.raises(ValueError, match="2 to 8"):
        quantize(tiny_net(), bits=[4, 16])
    with pytest.raises(ValueError, match="exclude names"):
        quantize(tiny_net(), bits=[4], exclude=["nope"])
    with pytest.raises(ValueError, match="weight must be one of"):
        QuantConfig(weight="pact")
    with pytest.raises(ValueError, match="correction must be one of"):
        QuantConfig(correction="median")
    with pytest.raises(FileNotFoundError, match="not a multibit-quant checkpoint"):
        load_checkpoint(tmp_path)
    assert isinstance(quantize(tiny_net(), bits=4), MultiBitModel)


def test_bias_correction_aligns_pre_batchnorm_statistics_across_bit_widths():
    """The mechanism behind one shared BatchNorm: with correction, the per-channel mean and
    standard deviation of a conv's outputs at 2-8 bits stay close to the full-precision ones
    (same weights, same input; a fixed seed), summed relative deviations over 6 bit-widths."""
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 32, 3, padding=1, bias=False)
    x = F.relu(torch.randn(64, 16, 8, 8))
    reference = F.conv2d(x, conv.weight, padding=1).detach()
    gaps = {}
    for correction in (None, "mean_var"):
        config = QuantConfig(correction=correction, quantize_activations=False)
        layer = QuantConv2d.from_module(conv, (2, 4, 8), config)
        gap = 0.0
        for bits in (2, 3, 4, 5, 6, 8):
            layer.bits = bits
            with torch.no_grad():
                out = layer(x)
            for stat in (lambda t: t.mean((0, 2, 3)), lambda t: t.std((0, 2, 3))):
                gap += ((stat(out) - stat(reference)).abs() / stat(reference).abs().mean()).mean()
        gaps[correction] = float(gap)
    # measured: 5.93 without, 0.076 with: the bound leaves an 8x margin
    assert gaps["mean_var"] < 0.1 * gaps[None], gaps


def test_lsq_activation_step_gradient_does_not_depend_on_the_batch_size():
    """LSQ scales the step gradient by 1/sqrt(N_F·Q_p) with N_F the features of one example:
    a batch repeated twice (same mean loss) gives the same step gradient."""
    layer = QuantLinear.from_module(nn.Linear(6, 3), (4,), QuantConfig("lsq", "lsq"))
    x = torch.rand(5, 6)
    grads = []
    for batch in (x, torch.cat([x, x])):
        layer.act_steps["4"].data.fill_(0.07)
        layer._act_ready = True
        layer.zero_grad()
        layer(batch).square().mean().backward()
        grads.append(layer.act_steps["4"].grad.clone())
    # a batch-size dependence would be a factor sqrt(2); float32 sums that cancel differ ~1e-4
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-3, atol=0)


def test_bit_settings_must_be_integers():
    import numpy as np

    model = quantize(tiny_net(), bits=[np.int64(4), 32])
    assert model.trained_bits == (4, 32)
    with pytest.raises(ValueError, match="bits"):
        model.set_bits(32.0)
    with pytest.raises(ValueError, match="bits"):
        model.set_bits(True)


def test_damaged_checkpoints_are_refused(tmp_path):
    model = quantize(preact_resnet20(width=4), bits=[4])
    save_checkpoint(model, tmp_path, {"name": "resnet20", "num_classes": 10, "in_channels": 1,
                                      "kwargs": {"width": 4}})  # fmt: skip
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 20)
    with pytest.raises(ValueError, match="not a readable multibit-quant checkpoint"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text('{"format_version": 1}')
    with pytest.raises(ValueError, match="lacks"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ValueError, match="truncated"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("format_version = 1")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_checkpoint(tmp_path)
