"""The fused logic layer (vectorized CPU path and Triton kernel) against the 16-term reference.

Tolerances (float32): outputs atol 1e-5 (16 weighted terms of magnitude <= 1 reordered into 4);
gradients atol 1e-5, rtol 1e-5 (input gradients sum at most a few dozen such terms per column).
"""

from __future__ import annotations

import functools

import pytest
import torch

from dlgn_gumbel import gate_coefficients, logic_layer, logic_layer_reference16
from kernels_common.testing import Tolerance, assert_kernel_matches, device_for_backend

OUT_TOL = Tolerance(atol=1e-5, rtol=1e-5)
GRAD_TOL = Tolerance(atol=1e-5, rtol=1e-5)
# (batch, in_dim, out_dim): batch 1; sizes that are not multiples of the 32x64 tiles; more
# neurons than inputs (columns scattered into by several neurons); a single neuron
CASES = [(1, 5, 3), (37, 33, 70), (65, 8, 129), (3, 200, 1)]


def make_inputs(batch, in_dim, out_dim, *, binary=False, per_example=False, device="cpu"):
    def make(gen):
        x = torch.rand(in_dim, batch, generator=gen)
        if binary:
            x = (x > 0.5).float()
        idx = torch.randint(0, in_dim, (2, out_dim), generator=gen).to(device)
        shape = (out_dim, batch, 16) if per_example else (out_dim, 16)
        return {
            "x": x.to(device).requires_grad_(True),
            "idx_a": idx[0],
            "idx_b": idx[1],
            "weights": torch.softmax(2 * torch.randn(shape, generator=gen), -1)
            .to(device)
            .requires_grad_(True),
        }

    return make


def fused(x, idx_a, idx_b, weights, *, backend):
    coeffs = gate_coefficients(weights)
    if coeffs.dim() == 3:  # per-example gates: (N, B, 4) -> the op's (N, 4, B)
        coeffs = coeffs.transpose(1, 2).contiguous()
    return logic_layer(x, idx_a, idx_b, coeffs, backend=backend)


# per_example: every output element has its own mixture (noise="per_example", coeffs (N, 4, B))
@pytest.mark.parametrize("per_example", [False, True], ids=["shared", "per-example"])
@pytest.mark.parametrize("shape", CASES)
def test_cpu_fast_path_matches_16_term_reference(shape, per_example):
    assert_kernel_matches(
        logic_layer_reference16,
        functools.partial(fused, backend="reference"),
        make_inputs(*shape, per_example=per_example),
        tolerances=OUT_TOL,
        grad_tolerances=GRAD_TOL,
    )


@pytest.mark.parametrize("per_example", [False, True], ids=["shared", "per-example"])
@pytest.mark.parametrize("shape", CASES)
def test_triton_kernel_matches_16_term_reference(shape, per_example, triton_backend):
    device = device_for_backend(triton_backend)
    assert_kernel_matches(
        logic_layer_reference16,
        functools.partial(fused, backend=triton_backend),
        make_inputs(*shape, per_example=per_example, device=device),
        tolerances=OUT_TOL,
        grad_tolerances=GRAD_TOL,
    )


def test_triton_kernel_binary_inputs_and_one_hot_gates_are_exact(triton_backend):
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(12, 40, generator=gen) > 0.5).float()
    idx_a, idx_b = torch.randint(0, 12, (2, 77), generator=gen)
    weights = torch.nn.functional.one_hot(torch.randint(0, 16, (77,), generator=gen), 16).float()
    expected = logic_layer_reference16(x, idx_a, idx_b, weights)
    device = device_for_backend(triton_backend)
    args = (t.to(device) for t in (x, idx_a, idx_b, weights))
    got = fused(*args, backend=triton_backend)
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"x": torch.rand(3)}, ValueError, "2-D"),
        ({"x": torch.rand(4, 3, dtype=torch.float64)}, TypeError, "float32"),
        ({"coeffs": torch.rand(5, 3)}, ValueError, r"\(N, 4\)"),
        ({"coeffs": torch.rand(5, 4, 2)}, ValueError, r"batch=3"),
        ({"idx_a": torch.full((5,), 4)}, ValueError, r"\[0, 4\)"),
        ({"idx_b": torch.zeros(5)}, TypeError, "int32 or int64"),
    ],
)
def test_bad_input(kwargs, error, match):
    args = {
        "x": torch.rand(4, 3),
        "idx_a": torch.zeros(5, dtype=torch.long),
        "idx_b": torch.zeros(5, dtype=torch.long),
        "coeffs": torch.rand(5, 4),
    }
    args.update(kwargs)
    with pytest.raises(error, match=match):
        logic_layer(**args, backend="reference")
