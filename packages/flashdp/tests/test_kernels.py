"""The Triton kernels (interpreter on the CPU, compiled on a GPU) equal the PyTorch reference.

Tolerance: float32 with atol 1e-4 and rtol 1e-5: both sides accumulate O(T·D) products in fp32
in different orders (tiles of 16-32, atomics across tiles for the norms).
"""

from __future__ import annotations

import pytest
import torch

from flashdp import reference
from flashdp.ops import linear_weight_clipped_sum_op, linear_weight_norm2_op
from kernels_common import Tolerance, assert_kernel_matches
from kernels_common.testing import device_for_backend

TOLERANCE = Tolerance(atol=1e-4, rtol=1e-5)

# (B, T, D_in, D_out): not multiples of the blocks, batch 1, one token, odd widths
SHAPES = [(1, 1, 5, 3), (3, 17, 33, 18), (2, 40, 7, 35)]


def inputs(shape, device):
    batch, tokens, d_in, d_out = shape

    def make(generator):
        return {
            "x": torch.randn(batch, tokens, d_in, generator=generator).to(device),
            "grad_output": torch.randn(batch, tokens, d_out, generator=generator).to(device),
            "coef": torch.rand(batch, generator=generator).to(device),
        }

    return make


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_norm2_kernel(shape, triton_backend):
    assert_kernel_matches(
        lambda x, grad_output, coef: reference.linear_weight_norm2(x, grad_output),
        lambda x, grad_output, coef: linear_weight_norm2_op(x, grad_output, backend=triton_backend),
        inputs(shape, device_for_backend(triton_backend)),
        check_grad=False,
        tolerances=TOLERANCE,
    )


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_clipped_sum_kernel(shape, triton_backend):
    assert_kernel_matches(
        reference.linear_weight_clipped_sum,
        lambda x, grad_output, coef: linear_weight_clipped_sum_op(
            x, grad_output, coef, backend=triton_backend
        ),
        inputs(shape, device_for_backend(triton_backend)),
        check_grad=False,
        tolerances=TOLERANCE,
    )


def test_model_with_kernels_matches_reference(triton_backend):
    """A private model whose linear layers run the kernels releases the reference's gradients."""
    import flashdp

    grads = {}
    device = device_for_backend(triton_backend)
    for backend in ("reference", triton_backend):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.Tanh(), torch.nn.Linear(9, 4))
        private = flashdp.make_private(
            model.to(device), max_grad_norm=0.5, noise_multiplier=0.0, backend=backend
        )
        x = torch.randn(3, 5, 6, generator=torch.Generator().manual_seed(1)).to(device)
        private(x).square().mean().backward()
        grads[backend] = [p.grad.cpu() for p in private.parameters()]
    for got, expected in zip(grads[triton_backend], grads["reference"], strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
