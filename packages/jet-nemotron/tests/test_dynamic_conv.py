"""Dynamic causal convolution: the reference against an explicit loop and finite differences, the
Triton kernels (forward, backward, decode step) against the reference, decoding and state
passing against one pass, and bad input.

Tolerances: float64 paths agree to ``1e-12`` (sums of at most ``W`` products in another order).
The float32 kernels are compared with the float64 reference at ``atol = rtol = 1e-5``: each
output or gradient element is a sum of at most ``W <= 8`` products of O(1) values accumulated in
float32 (error below ``W · 2^-24 · Σ|terms|``, a few 1e-6 here). In bfloat16 both sides round the
same float32 sum, taken in another order, so they may land one bf16 ulp (``2^-7`` relative) apart.
"""

from __future__ import annotations

import functools

import pytest
import torch

from jet_nemotron.ops.dynamic_conv import dynamic_causal_conv, dynamic_causal_conv_step
from kernels_common.testing import Tolerance, assert_kernel_matches, device_for_backend

EXACT = {"atol": 1e-12, "rtol": 1e-12}
FLOAT32_TOL = Tolerance(atol=1e-5, rtol=1e-5)
BF16_TOL = Tolerance(atol=1e-5, rtol=2**-7)


def make_inputs(B, T, D, W, *, state=True, dtype=torch.float32, device="cpu", seed=0):
    """Seeded x ``(B, T, D)``, kernels ``(B, T, D, W)`` and state ``(B, D, W)`` (or ``None``),
    all requiring grad."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype).requires_grad_()

    return {
        "x": randn(B, T, D),
        "kernels": randn(B, T, D, W),
        "conv_state": randn(B, D, W) if state else None,
    }


def loop_convolution(x, kernels, conv_state):
    """``y_t = Σ_w x_{t-W+1+w} K_t[:, w]`` by a loop over t and w, the past read from the state's
    column ``W + s`` for a position ``s < 0``; and the last W inputs of [state, x]."""
    B, T, D, W = kernels.shape
    y = torch.zeros(B, T, D, dtype=x.dtype)
    for t in range(T):
        for w in range(W):
            s = t - W + 1 + w
            if s >= 0:
                y[:, t] += x[:, s] * kernels[:, t, :, w]
            elif conv_state is not None:
                y[:, t] += conv_state[:, :, W + s] * kernels[:, t, :, w]
    past = torch.zeros(B, D, W, dtype=x.dtype) if conv_state is None else conv_state
    history = [past[:, :, j] for j in range(W)] + [x[:, t] for t in range(T)]
    return y, torch.stack(history[-W:], dim=-1)


def conv(backend, x, kernels, conv_state):
    return dynamic_causal_conv(
        x, kernels, conv_state=conv_state, output_final_state=True, backend=backend
    )


@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("T", [3, 9])
@pytest.mark.parametrize("state", [False, True])
def test_reference_matches_a_loop(W, T, state):
    inputs = make_inputs(2, T, 5, W, state=state, dtype=torch.float64)
    y, final = conv("reference", **inputs)
    y_loop, final_loop = loop_convolution(**inputs)
    torch.testing.assert_close(y, y_loop, **EXACT)
    torch.testing.assert_close(final, final_loop, **EXACT)


def test_reference_gradients_match_finite_differences():
    inputs = make_inputs(2, 5, 3, 4, dtype=torch.float64)
    assert torch.autograd.gradcheck(functools.partial(conv, "reference"), tuple(inputs.values()))
    step_inputs = (inputs["x"][:, 0], inputs["kernels"][:, 0], inputs["conv_state"])
    step = functools.partial(dynamic_causal_conv_step, backend="reference")
    assert torch.autograd.gradcheck(step, step_inputs)


# (B, T, D, W, state): T = 1, T not a multiple of the time tile (16, 8 for W = 8), several time
# tiles, D below / at / above one 64-wide tile (5, 64, 100; 60 odd-sized), W a power of two or not
CASES = [
    (1, 1, 5, 4, True),
    (2, 1, 100, 2, False),
    (2, 7, 64, 4, False),
    (1, 7, 60, 3, True),
    (2, 7, 100, 8, True),
    (2, 70, 100, 4, True),
    (1, 70, 5, 2, True),
    (1, 70, 64, 5, False),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernels_match_the_reference(triton_backend, case):
    *sizes, state = case
    device = device_for_backend(triton_backend)
    report = assert_kernel_matches(
        functools.partial(conv, "reference"),
        functools.partial(conv, triton_backend),
        make_inputs(*sizes, state=state, device=device),
        reference_dtype=torch.float64,
        tolerances=FLOAT32_TOL,
    )
    expected = {"out[0]", "grad[x]", "grad[kernels]"} | ({"grad[conv_state]"} if state else set())
    assert expected <= {c.name for c in report.comparisons}


def test_kernels_in_bfloat16(triton_backend):
    # without the final state: its gradient would be added to dx after each side rounded its own
    # part, and a one-ulp difference in a part survives when the two cancel
    device = device_for_backend(triton_backend)
    assert_kernel_matches(
        functools.partial(dynamic_causal_conv, backend="reference"),
        functools.partial(dynamic_causal_conv, backend=triton_backend),
        make_inputs(2, 19, 60, 4, dtype=torch.bfloat16, device=device),
        reference_dtype=None,
        tolerances=BF16_TOL,
    )


def test_kernel_gradients_match_finite_differences(triton_backend):
    inputs = make_inputs(1, 5, 3, 3, dtype=torch.float64, device=device_for_backend(triton_backend))
    assert torch.autograd.gradcheck(functools.partial(conv, triton_backend), tuple(inputs.values()))


@pytest.mark.parametrize(("B", "D", "W"), [(1, 5, 2), (2, 100, 4), (3, 64, 8)])
def test_step_kernel_matches_the_reference(triton_backend, B, D, W):
    inputs = make_inputs(B, 1, D, W, device=device_for_backend(triton_backend))
    step_inputs = {
        "x": inputs["x"].detach()[:, 0].requires_grad_(),
        "kernels": inputs["kernels"].detach()[:, 0].requires_grad_(),
        "conv_state": inputs["conv_state"],
    }
    report = assert_kernel_matches(
        functools.partial(dynamic_causal_conv_step, backend="reference"),
        functools.partial(dynamic_causal_conv_step, backend=triton_backend),
        step_inputs,
        reference_dtype=torch.float64,
        tolerances=FLOAT32_TOL,
    )
    assert {"out[0]", "out[1]", "grad[conv_state]"} <= {c.name for c in report.comparisons}


def assert_same_function(first, second, inputs):
    """``first`` and ``second`` give the same outputs and input gradients (float64, 1e-12)."""
    results = []
    for fn in (first, second):
        outputs = fn(**inputs)
        gen = torch.Generator().manual_seed(1)
        grads = [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) for o in outputs]
        leaves = [v for v in inputs.values() if v is not None]
        results.append((outputs, torch.autograd.grad(outputs, leaves, grads)))
    for a, b in zip(*results, strict=True):
        for tensor_a, tensor_b in zip(a, b, strict=True):
            torch.testing.assert_close(tensor_a, tensor_b, **EXACT)


def decode(backend, x, kernels, conv_state):
    """Token by token from ``conv_state`` (zeros if ``None``): outputs and the last state."""
    B, T, D, W = kernels.shape
    state = x.new_zeros(B, D, W) if conv_state is None else conv_state
    outputs = []
    for t in range(T):
        y, state = dynamic_causal_conv_step(x[:, t], kernels[:, t], state, backend=backend)
        outputs.append(y)
    return torch.stack(outputs, dim=1), state


def in_two_parts(backend, split, x, kernels, conv_state):
    y_first, state = conv(backend, x[:, :split], kernels[:, :split], conv_state)
    y_second, state = conv(backend, x[:, split:], kernels[:, split:], state)
    return torch.cat([y_first, y_second], dim=1), state


@pytest.fixture(params=["reference", "triton"])
def backend(request):
    """The reference, and the Triton backend of this run (skipped where it cannot run)."""
    if request.param == "reference":
        return "reference"
    return request.getfixturevalue("triton_backend")


@pytest.mark.parametrize("state", [False, True])
def test_decoding_token_by_token_equals_one_pass(backend, state):
    device = device_for_backend(backend)
    inputs = make_inputs(2, 6, 7, 4, state=state, dtype=torch.float64, device=device)
    assert_same_function(
        functools.partial(conv, backend), functools.partial(decode, backend), inputs
    )


@pytest.mark.parametrize("split", [1, 2, 5])
def test_passing_the_state_between_two_parts_equals_one_pass(backend, split):
    device = device_for_backend(backend)
    inputs = make_inputs(2, 7, 7, 4, dtype=torch.float64, device=device)
    assert_same_function(
        functools.partial(conv, backend), functools.partial(in_two_parts, backend, split), inputs
    )


def test_step_leaves_the_state_unchanged():
    state = torch.randn(2, 5, 4)
    before = state.clone()
    _, new_state = dynamic_causal_conv_step(torch.randn(2, 5), torch.randn(2, 5, 4), state)
    assert torch.equal(state, before)
    assert torch.equal(new_state[..., :-1], before[..., 1:])


x, k, s = torch.zeros(2, 3, 5), torch.zeros(2, 3, 5, 4), torch.zeros(2, 5, 4)
BAD_CONV = [
    ((x.numpy(), k, None), TypeError, "x must be a torch.Tensor"),
    ((x[0], k, None), ValueError, r"x must have shape \(B, T, D\)"),
    ((x, k[..., 0], None), ValueError, r"kernels must have shape \(B, T, D, W\)"),
    ((x, k, s[0]), ValueError, r"conv_state must have shape \(B, D, W\)"),
    ((x, k[:1], None), ValueError, r"kernels must have shape .* x's \(2, 3, 5\)"),
    ((x, k[:, :, :4], None), ValueError, r"kernels must have shape .* got \(2, 3, 4, 4\)"),
    ((x, k[..., :1], None), ValueError, r"kernel width W = 1 must be in \[2, 8\]"),
    ((x, torch.zeros(2, 3, 5, 9), None), ValueError, r"W = 9 must be in \[2, 8\]"),
    ((x, k, s[..., :3]), ValueError, r"conv_state must have shape \(B, D, W\) = \(2, 5, 4\)"),
    ((x, k, s[:1]), ValueError, r"= \(2, 5, 4\) to match x and kernels, got \(1, 5, 4\)"),
    ((x, k, s[:, :4]), ValueError, r"got \(2, 4, 4\)"),
    ((x.double(), k, None), TypeError, "kernels has dtype torch.float32 but x has torch.float64"),
    ((x, k, s.half()), TypeError, "conv_state has dtype torch.float16 but x has torch.float32"),
    ((x.int(), k.int(), None), TypeError, "x has dtype torch.int32; allowed: float32"),
    ((x, k.to("meta"), None), ValueError, "kernels is on meta but x is on cpu"),
    ((x[:, :0], k[:, :0], None), ValueError, "must not be empty"),
]


@pytest.mark.parametrize(("args", "error", "message"), BAD_CONV, ids=[m for *_, m in BAD_CONV])
def test_bad_convolution_input(args, error, message):
    with pytest.raises(error, match=message):
        dynamic_causal_conv(args[0], args[1], conv_state=args[2], backend="reference")


BAD_STEP = [
    ((x[:, 0], k[:, 0], None), TypeError, "conv_state must be a torch.Tensor"),
    ((x, k[:, 0], s), ValueError, r"x must have shape \(B, D\)"),
    ((x[:, 0], k, s), ValueError, r"kernels must have shape \(B, D, W\)"),
    ((x[:, 0], k[:, 0, :4], s), ValueError, r"with \(B, D\) = x's \(2, 5\)"),
    ((x[:, 0], k[:, 0], s[..., :2]), ValueError, r"conv_state must have shape .* = \(2, 5, 4\)"),
    ((x[:, 0], k[:, 0], s.double()), TypeError, "conv_state has dtype torch.float64"),
]


@pytest.mark.parametrize(("args", "error", "message"), BAD_STEP, ids=[m for *_, m in BAD_STEP])
def test_bad_step_input(args, error, message):
    with pytest.raises(error, match=message):
        dynamic_causal_conv_step(*args, backend="reference")
