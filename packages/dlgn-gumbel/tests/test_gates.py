"""The 16 gates: truth tables, relaxations, the affine form, and the Gumbel straight-through."""

from __future__ import annotations

import itertools

import pytest
import torch

from dlgn_gumbel import (
    GATE_COEFFS,
    GATE_NAMES,
    LogicLayer,
    gate_coefficients,
    logic_layer_reference16,
    relaxed_gate,
)

# an independent statement of each Boolean function, by its name
BOOLEAN = {
    "0": lambda a, b: False,
    "A and B": lambda a, b: a and b,
    "A and not B": lambda a, b: a and not b,
    "A": lambda a, b: a,
    "not A and B": lambda a, b: (not a) and b,
    "B": lambda a, b: b,
    "A xor B": lambda a, b: a != b,
    "A or B": lambda a, b: a or b,
    "not (A or B)": lambda a, b: not (a or b),
    "not (A xor B)": lambda a, b: a == b,
    "not B": lambda a, b: not b,
    "A or not B": lambda a, b: a or not b,
    "not A": lambda a, b: not a,
    "not A or B": lambda a, b: (not a) or b,
    "not (A and B)": lambda a, b: not (a and b),
    "1": lambda a, b: True,
}


@pytest.mark.parametrize("gate", range(16))
def test_relaxed_gate_equals_truth_table_on_binary_inputs(gate):
    for a, b in itertools.product((0.0, 1.0), repeat=2):
        expected = float(BOOLEAN[GATE_NAMES[gate]](bool(a), bool(b)))
        value = relaxed_gate(gate, torch.tensor(a), torch.tensor(b))
        assert value.item() == expected, (GATE_NAMES[gate], a, b)
        # and the affine coefficients give the same value
        c0, c1, c2, c3 = GATE_COEFFS[gate].tolist()
        assert c0 + c1 * a + c2 * b + c3 * a * b == expected


@pytest.mark.parametrize("gate", range(16))
def test_affine_form_equals_relaxation_on_real_inputs(gate):
    """Both are polynomials in a, b: equal up to float32 rounding of a few O(1) terms (1e-6)."""
    g = torch.Generator().manual_seed(gate)
    a, b = torch.rand(200, generator=g), torch.rand(200, generator=g)
    c0, c1, c2, c3 = GATE_COEFFS[gate]
    torch.testing.assert_close(
        c0 + c1 * a + c2 * b + c3 * a * b, relaxed_gate(gate, a, b), atol=1e-6, rtol=0
    )


def test_softmax_mixture_equals_four_coefficient_form():
    """Sum of 16 weighted gates vs c0 + c1 a + c2 b + c3 ab with c = softmax(w) @ GATE_COEFFS;
    float32 sums of 16 terms <= 1 in magnitude: 2e-6."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(9, 7, generator=g)
    idx_a, idx_b = torch.randint(0, 9, (2, 11), generator=g)
    probs = torch.softmax(torch.randn(11, 16, generator=g), 1)
    mixture = logic_layer_reference16(x, idx_a, idx_b, probs)
    c = gate_coefficients(probs)
    a, b = x[idx_a], x[idx_b]
    c0, c1, c2, c3 = c[:, :, None].unbind(1)
    affine = c0 + c1 * a + c2 * b + c3 * a * b
    torch.testing.assert_close(affine, mixture, atol=2e-6, rtol=0)


def _gumbel_noise(shape, seed):
    torch.manual_seed(seed)
    return -torch.log(-torch.log(torch.rand(shape)))


@pytest.mark.parametrize("gumbel_tau", [1.0, 0.5])
def test_gumbel_forward_is_one_hot_and_gradient_is_the_soft_gradient(gumbel_tau):
    layer = LogicLayer(
        10, 24, relaxation="gumbel", gumbel_tau=gumbel_tau, seed=3, backend="reference"
    ).train()
    g = torch.Generator().manual_seed(1)
    x = torch.rand(5, 10, generator=g)
    grad_out = torch.randn(5, 24, generator=g)

    torch.manual_seed(123)
    weights = layer.gate_weights()
    # the forward weights are exactly one-hot (no rounding residue from the straight-through)
    assert ((weights == 0) | (weights == 1)).all()
    assert (weights.sum(1) == 1).all()

    torch.manual_seed(123)
    y = layer(x)
    loss = (torch.tanh(3 * y) * grad_out).sum()  # nonlinear, so dL/dweights depends on y
    (grad_w,) = torch.autograd.grad(loss, layer.weights)

    # oracle: same noise; the hard gate forward; gradient pushed through softmax((w + g) / tau)
    noise = _gumbel_noise((24, 16), 123)
    perturbed = layer.weights.detach() + noise
    hard = torch.nn.functional.one_hot(perturbed.argmax(1), 16).float().requires_grad_(True)
    assert torch.equal(weights.detach(), hard.detach())
    y_ref = logic_layer_reference16(x.t(), layer.idx_a, layer.idx_b, hard).t()
    assert torch.allclose(y, y_ref, atol=1e-6, rtol=0)
    (dl_dprobs,) = torch.autograd.grad((torch.tanh(3 * y_ref) * grad_out).sum(), hard)
    w = layer.weights.detach().clone().requires_grad_(True)
    soft = torch.softmax((w + noise) / gumbel_tau, 1)
    (expected,) = torch.autograd.grad(soft, w, grad_outputs=dl_dprobs)
    # two float32 paths through 16-term sums and a softmax Jacobian: 1e-5
    torch.testing.assert_close(grad_w, expected, atol=1e-5, rtol=1e-4)


def test_gumbel_noise_is_fresh_per_forward_and_shared_across_the_batch():
    layer = LogicLayer(8, 400, relaxation="gumbel", seed=0, backend="reference").train()
    x = (torch.rand(1, 8, generator=torch.Generator().manual_seed(0)) > 0.5).float()
    torch.manual_seed(0)
    y = layer(x.expand(6, 8).contiguous())
    # one gate per neuron for the whole batch: identical rows give identical outputs
    assert (y == y[0]).all()
    torch.manual_seed(1)
    first = layer.gate_weights().argmax(1)
    second = layer.gate_weights().argmax(1)
    # N(0,1) logits + fresh Gumbel noise: many of 400 neurons change their sampled gate
    assert (first != second).sum() > 40


def test_eval_mode_is_the_argmax_gate():
    layer = LogicLayer(6, 30, relaxation="softmax", seed=0, backend="reference").eval()
    x = (torch.rand(9, 6, generator=torch.Generator().manual_seed(2)) > 0.5).float()
    gates = layer.weights.argmax(1)
    expected = torch.stack(
        [
            torch.tensor(
                [
                    float(BOOLEAN[GATE_NAMES[int(gates[n])]](bool(r[ia]), bool(r[ib])))
                    for n, (ia, ib) in enumerate(zip(layer.idx_a, layer.idx_b, strict=True))
                ]
            )
            for r in x
        ]
    )
    assert torch.equal(layer(x), expected)


def test_gumbel_network_gradients_match_a_plain_straight_through_oracle():
    """A 3-layer Gumbel network against a batch-major re-statement of the paper's code path:
    ``weights = hard - soft.detach() + soft`` per layer (torch's ``gumbel_softmax(hard=True)``
    form) with the 16-term mixture, on the same noise. Checks the input gradients through hard
    gates across layers as well as the logit gradients. Float32, a few 16-term sums per layer:
    1e-5."""
    from dlgn_gumbel import LogicNet

    net = LogicNet(12, [40, 30, 20], 2, tau=2.0, relaxation="gumbel", seed=4, backend="reference")
    g = torch.Generator().manual_seed(9)
    x = torch.rand(7, 12, generator=g)
    y = torch.randint(0, 2, (7,), generator=g)

    torch.manual_seed(77)
    loss = torch.nn.functional.cross_entropy(net(x), y)
    grads = torch.autograd.grad(loss, [layer.weights for layer in net.layers])

    torch.manual_seed(77)  # the same noise, drawn layer by layer in the same order
    noises = [_gumbel_noise_draw((layer.out_dim, 16)) for layer in net.layers]
    ws = [layer.weights.detach().clone().requires_grad_(True) for layer in net.layers]
    h = x
    for layer, w, noise in zip(net.layers, ws, noises, strict=True):
        soft = torch.softmax(w + noise, dim=-1)
        hard = torch.nn.functional.one_hot(soft.argmax(-1), 16).float()
        weights = hard - soft.detach() + soft
        a, b = h[:, layer.idx_a], h[:, layer.idx_b]
        h = sum(weights[:, i] * relaxed_gate(i, a, b) for i in range(16))
    scores = h.reshape(7, 2, -1).sum(-1) / 2.0
    expected = torch.autograd.grad(torch.nn.functional.cross_entropy(scores, y), ws)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert any(grad.abs().sum() > 0 for grad in grads[:-1])  # gradient reached earlier layers


def _gumbel_noise_draw(shape):
    return -torch.log(-torch.log(torch.rand(shape)))
