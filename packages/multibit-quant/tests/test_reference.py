"""The PyTorch quantizers against closed forms written out here (float64 where it matters)."""

from __future__ import annotations

import math

import pytest
import torch

from multibit_quant import fake_quant_activation, fake_quant_weight
from multibit_quant.reference import bias_correct, lsq_grad_scale, lsq_range

BITS = [2, 3, 4, 5, 6, 7, 8]


def quantize_weight(w, bits, method="dorefa", step=None, correction=None):
    return fake_quant_weight(w, bits, method, step, correction, backend="reference")


@pytest.mark.parametrize("bits", BITS)
def test_dorefa_levels_closed_form(bits):
    """Every value is E·(2j/n − 1) for j = round((tanh(w)/max|tanh| + 1)/2·n), E = mean|w|."""
    w = torch.randn(5, 40, generator=torch.Generator().manual_seed(bits), dtype=torch.float64)
    n = 2**bits - 1
    t = torch.tanh(w)
    u = t / t.abs().amax(1, keepdim=True)
    j = torch.round((u + 1) / 2 * n)
    expected = w.abs().mean(1, keepdim=True) * (2 * j / n - 1)
    got = quantize_weight(w.float(), bits).double()
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)  # float32 vs float64
    assert all(len(row.unique()) <= 2**bits for row in got)
    # the peak of every row maps to ±E exactly: the outermost level
    peak = w.abs().argmax(1)
    scale = w.abs().mean(1)
    torch.testing.assert_close(got[range(5), peak].abs(), scale, rtol=1e-6, atol=0)


@pytest.mark.parametrize("bits", BITS)
def test_lsq_grid_clamping_and_half_to_even(bits):
    q_n, q_p = lsq_range(bits)
    assert (q_n, q_p) == (2 ** (bits - 1), 2 ** (bits - 1) - 1)
    step = torch.tensor([0.5])
    # exact halves round to even; values past the range clamp to its ends
    w = torch.tensor([[0.25, 0.75, -0.25, -0.75, 1.25, 100.0, -100.0, 0.0]])
    got = quantize_weight(w, bits, "lsq", step) / 0.5
    expected = torch.tensor([0.0, 2.0, 0.0, -2.0, 2.0, q_p, -q_n, 0.0]).clamp(-q_n, q_p)
    torch.testing.assert_close(got, expected.unsqueeze(0), rtol=0, atol=0)


def test_dorefa_straight_through_gradient_by_hand():
    """Without correction, d(E·u)/dw: E(1 − t²)/M off the peak; at the peak also
    −E·sign(t)(1 − t²)/M²·Σ_i g_i t_i (the max is differentiated; E is not)."""
    w = torch.tensor([[0.3, -1.2, 0.7, 0.1]], dtype=torch.float64)
    g = torch.tensor([[0.5, -1.0, 2.0, 0.25]], dtype=torch.float64)
    leaf = w.float().requires_grad_(True)
    quantize_weight(leaf, 4).backward(g.float())
    t = torch.tanh(w)
    peak, scale = t.abs().max(), w.abs().mean()
    expected = g * scale * (1 - t**2) / peak
    expected[0, 1] += -scale * torch.sign(t[0, 1]) * (1 - t[0, 1] ** 2) / peak**2 * (g * t).sum()
    torch.testing.assert_close(leaf.grad.double(), expected, rtol=1e-5, atol=1e-7)


def test_dorefa_tied_peaks_share_the_gradient():
    w = torch.tensor([[0.8, -0.8, 0.2]])
    g = torch.tensor([[1.0, 0.0, 0.5]])
    leaf = w.clone().requires_grad_(True)
    quantize_weight(leaf, 3).backward(g)
    t = torch.tanh(w.double())
    peak, scale = t.abs().max(), w.double().abs().mean()
    share = -scale * (1 - peak**2) / peak**2 * (g.double() * t).sum() / 2
    expected = g.double() * scale * (1 - t**2) / peak
    expected[0, 0] += share
    expected[0, 1] -= share  # sign(t) = −1
    torch.testing.assert_close(leaf.grad.double(), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_lsq_gradients_by_hand(bits):
    """LSQ: dq/dw = 1 inside the range, 0 outside; dq/ds = round(v) − v inside, −Q_n / Q_p
    outside, times the gradient scale 1/sqrt(K·Q_p)."""
    generator = torch.Generator().manual_seed(bits)
    w = torch.randn(3, 11, generator=generator)
    g = torch.randn(3, 11, generator=generator)
    step = torch.tensor([0.3, 0.05, 0.8])
    leaf_w, leaf_s = w.clone().requires_grad_(True), step.clone().requires_grad_(True)
    quantize_weight(leaf_w, bits, "lsq", leaf_s).backward(g)
    q_n, q_p = lsq_range(bits)
    v = (w / step[:, None]).double()  # the float32 ratio the quantizer sees, then float64
    inside = (v >= -q_n) & (v <= q_p)
    # (g/s)·s in float32: within an ulp of g
    torch.testing.assert_close(leaf_w.grad, torch.where(inside, g, 0.0), rtol=2e-7, atol=0)
    local = torch.where(inside, torch.round(v) - v, v.clamp(-q_n, q_p))
    expected = (g.double() * local).sum(1) / math.sqrt(11 * q_p)
    # autograd forms round(v) − v in float32: an ulp of |v| ≤ 2^(b−1) per element, K = 11 of them
    bound = 11 * 2 ** (bits - 1) * 2**-23 * float(g.abs().max()) / math.sqrt(11 * q_p)
    torch.testing.assert_close(leaf_s.grad.double(), expected, rtol=1e-5, atol=2 * bound)
    assert lsq_grad_scale(11, bits) == pytest.approx(1 / math.sqrt(11 * q_p))


@pytest.mark.parametrize("signed", [False, True])
def test_clamp_activation_closed_form_and_gradient(signed):
    low, n = (-1.0, 3) if signed else (0.0, 7)
    x = torch.rand(400, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3 - 1.5
    x = x[((x * n) % 1 - 0.5).abs() > 1e-3]  # off the rounding boundaries, where float32 decides
    leaf = x.float().requires_grad_(True)
    out = fake_quant_activation(leaf, 3, "clamp", signed=signed, backend="reference")
    expected = torch.round(x.clamp(low, 1.0) * n) / n
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-7)
    out.sum().backward()
    inside = (x >= low) & (x <= 1.0)
    torch.testing.assert_close(leaf.grad.double(), inside.double(), rtol=0, atol=2e-7)


def test_lsq_activation_step_gradient_by_hand():
    x = torch.tensor([-0.4, 0.07, 0.33, 0.91, 5.0])  # none at a rounding boundary
    g = torch.tensor([1.0, -2.0, 0.5, 1.5, 1.0])
    step = torch.tensor([0.1], requires_grad=True)
    leaf = x.clone().requires_grad_(True)
    out = fake_quant_activation(leaf, 4, "lsq", step, signed=False, backend="reference")
    v = x.double() / 0.1
    codes = torch.round(v.clamp(0, 15))
    torch.testing.assert_close(out.double(), codes * 0.1, rtol=1e-6, atol=1e-7)
    out.backward(g)
    inside = (v >= 0) & (v <= 15)
    local = torch.where(inside, torch.round(v) - v, v.clamp(0, 15))
    expected = (g.double() * local).sum() / math.sqrt(5 * 15)
    torch.testing.assert_close(step.grad.double(), expected.reshape(1), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("method", ["dorefa", "lsq"])
@pytest.mark.parametrize("bits", BITS)
def test_bias_correction_restores_channel_mean_and_std(method, bits):
    generator = torch.Generator().manual_seed(bits)
    w = torch.randn(6, 75, generator=generator) * 0.2 + 0.05
    step = torch.full((6,), 0.2) if method == "lsq" else None
    for correction in ("mean", "mean_var"):
        q = quantize_weight(w, bits, method, step, correction)
        torch.testing.assert_close(q.mean(1), w.mean(1), rtol=0, atol=1e-6)
        if correction == "mean_var":
            std = lambda x: x.std(1, unbiased=False)  # noqa: E731
            torch.testing.assert_close(std(q), std(w), rtol=1e-5, atol=1e-7)
    plain = quantize_weight(w, bits, method, step, None)
    assert (plain.mean(1) - w.mean(1)).abs().max() > 1e-4  # the bias that is corrected


def test_bias_correction_of_degenerate_channels_is_finite():
    """A row whose quantized values are all equal keeps ratio 1 (it becomes mean(W)); a
    constant full-precision row has std 0. Neither gives NaN values or gradients."""
    w = torch.tensor([[0.01, 0.02, 0.015], [0.3, 0.3, 0.3]], requires_grad=True)
    q = fake_quant_weight(w, 2, "lsq", torch.tensor([1.0, 1.0]), "mean_var", backend="reference")
    torch.testing.assert_close(
        q.detach(), torch.tensor([[0.015] * 3, [0.3] * 3]), rtol=1e-6, atol=1e-7
    )
    q.square().sum().backward()
    assert torch.isfinite(w.grad).all()
    values = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    assert torch.isfinite(bias_correct(values, values, "mean_var")).all()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"bits": 1}, ValueError, "bits must be an integer from 2 to 8"),
        ({"bits": 9}, ValueError, "2 to 8"),
        ({"bits": 4.0}, ValueError, "2 to 8"),
        ({"bits": 4, "method": "pact"}, ValueError, "unknown weight method"),
        ({"bits": 4, "correction": "median"}, ValueError, "unknown correction"),
        ({"bits": 4, "method": "lsq"}, TypeError, "step must be a torch.Tensor"),
        ({"bits": 4, "method": "lsq", "step": torch.ones(3)}, ValueError, "step must have shape"),
        ({"bits": 4, "step": torch.ones(4)}, ValueError, "only used by method='lsq'"),
    ],
)
def test_bad_weight_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        fake_quant_weight(torch.randn(4, 3), **kwargs)


@pytest.mark.parametrize("bad", [0.0, -0.1, math.nan, math.inf])
def test_lsq_steps_must_be_finite_and_positive(bad):
    """A zero step divides by zero (NaN out), a negative one flips the grid: both refused, for
    the weight (any channel) and the activation quantizer."""
    message = f"step must be finite and positive .*got {bad:g} at index 1"
    with pytest.raises(ValueError, match=message):
        fake_quant_weight(torch.randn(2, 3), 4, "lsq", torch.tensor([0.1, bad]))
    with pytest.raises(ValueError, match=f"got {bad:g} at index 0"):
        fake_quant_activation(torch.randn(5), 4, "lsq", torch.tensor([bad]))


def test_layers_with_a_step_pushed_below_zero_still_quantize():
    """An optimizer step can push a layer's LSQ step below 0: the layer clamps it at 1e-8 and
    runs (the quantizers' step check does not refuse it)."""
    from multibit_quant import QuantConfig, quantize

    config = QuantConfig(weight="lsq", activation="lsq")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model = quantize(net, bits=[4], config=config)
    model(torch.randn(2, 3))  # initialises the activation steps
    layer = model.quant_layers()[0]
    with torch.no_grad():
        layer.weight_steps["4"].fill_(-1.0)
        layer.act_steps["4"].fill_(-1.0)
    assert torch.isfinite(model(torch.randn(2, 3))).all()


def test_straight_through_helpers_keep_values_exact():
    """``round`` and the gradient-scale identity give their forward values exactly (an
    ``x·s + (x − x·s)`` form is an ulp off for about 1% of steps)."""
    from multibit_quant.reference import scale_gradient, ste_round

    x = torch.rand(100_000, generator=torch.Generator().manual_seed(0)) * 0.1 + 1e-4
    assert torch.equal(scale_gradient(x, 0.0123), x)
    y = torch.randn(100_000, generator=torch.Generator().manual_seed(1)) * 40
    assert torch.equal(ste_round(y), torch.round(y))


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"weight must be a non-empty \(C, K\)"):
        fake_quant_weight(torch.randn(4, 3, 3), 4)
    with pytest.raises(ValueError, match="non-empty"):
        fake_quant_weight(torch.randn(4, 0), 4)
    with pytest.raises(TypeError, match="float32, float64, float16 or bfloat16"):
        fake_quant_weight(torch.ones(4, 3, dtype=torch.int32), 4)
    with pytest.raises(TypeError, match=r"must be a torch\.Tensor"):
        fake_quant_activation([1.0, 2.0], 4)
    with pytest.raises(ValueError, match="unknown activation method"):
        fake_quant_activation(torch.randn(3), 4, "dorefa")
    for method, step in (("clamp", None), ("lsq", torch.tensor([0.1]))):
        with pytest.raises(ValueError, match=r"x must be non-empty, got shape \(0, 4\)"):
            fake_quant_activation(torch.empty(0, 4), 4, method, step, backend="reference")
    with pytest.raises(ValueError, match="values sharing a step must be at least 1, got 0"):
        lsq_grad_scale(0, 4)
