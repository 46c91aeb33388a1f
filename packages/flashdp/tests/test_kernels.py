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


def per_example_oracle(x, grad_output, bound, scale):
    """Materialised per-example gradients in float64 from the same (possibly 16-bit) values:
    norms², Σ_b c_b P_b with c_b = min(1, C / (‖scale·P_b‖ + 1e-6)), and bias gradients."""
    per_example = scale * torch.einsum("bto,bti->boi", grad_output.double(), x.double())
    norm2 = per_example.square().sum((1, 2))
    coef = (bound / (norm2.sqrt() + 1e-6)).clamp(max=1.0)
    summed = (coef[:, None, None] * per_example).sum(0)
    return norm2, summed, scale * grad_output.double().sum(1)


def store_clip(backend, x, grad_output, bound, scale, chunk):
    from flashdp.clipping import clip_coefficients
    from flashdp.ops import linear_weight_store_clip_op

    def coefficients(norm2):
        return clip_coefficients(norm2 * scale**2, bound) * scale

    norm2, summed, bias = linear_weight_store_clip_op(
        x, grad_output, coefficients, chunk, True, backend=backend
    )
    return norm2 * scale**2, summed, bias * scale


# (B, T, D_in, D_out, chunk): not multiples of any tile, batch 1, one token, chunks of 1, of
# part of the batch (3 of 5: a last, shorter chunk) and of all of it
STORE_CASES = [(1, 1, 5, 3, 1), (5, 17, 33, 18, 3), (4, 40, 7, 35, 4), (3, 9, 70, 6, 1)]


@pytest.mark.parametrize("case", STORE_CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_store_clip_matches_materialised_per_example_gradients(case, dtype, backend, request):
    """Kernels A and B (and their PyTorch reference): norms, clipped sum and bias gradients of
    every chunking equal float64 per-example gradients of the same values. 16-bit inputs: each
    product of two bf16 values is exact in fp32, so the fp32 tolerance of this module holds."""
    backend = request.getfixturevalue("triton_backend") if backend == "triton" else backend
    device = device_for_backend(backend)
    batch, tokens, d_in, d_out, chunk = case
    generator = torch.Generator().manual_seed(sum(case))
    x = torch.randn(batch, tokens, d_in, generator=generator).to(dtype)
    grad_output = torch.randn(batch, tokens, d_out, generator=generator).to(dtype)
    bound, scale = 2.0, float(batch)
    expected = per_example_oracle(x, grad_output, bound, scale)
    got = store_clip(backend, x.to(device), grad_output.to(device), bound, scale, chunk)
    for name, value, reference_value in zip(("norm2", "sum", "bias"), got, expected, strict=True):
        assert value.dtype == torch.float32, name
        torch.testing.assert_close(
            value.cpu().double(), reference_value, atol=1e-4, rtol=1e-5, msg=name
        )


def test_store_clip_reads_strided_and_transposed_inputs(triton_backend):
    """The kernels take strides: a transposed activation and a gradient sliced out of a wider
    tensor give the result of their contiguous copies, bit for bit."""
    device = device_for_backend(triton_backend)
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(3, 21, 11, generator=generator).to(device).transpose(1, 2)  # (3, 11, 21)
    grad_output = torch.randn(3, 11, 30, generator=generator).to(device)[:, :, 4:17]
    assert not x.is_contiguous()
    assert not grad_output.is_contiguous()
    strided = store_clip(triton_backend, x, grad_output, 0.5, 1.0, 2)
    copied = store_clip(triton_backend, x.contiguous(), grad_output.contiguous(), 0.5, 1.0, 2)
    for got, expected in zip(strided, copied, strict=True):
        assert torch.equal(got, expected)
    norm2 = linear_weight_norm2_op(x, grad_output, backend=triton_backend)
    assert torch.equal(
        norm2,
        linear_weight_norm2_op(x.contiguous(), grad_output.contiguous(), backend=triton_backend),
    )


def test_released_per_example_gradient_is_within_its_bound(triton_backend):
    """With stored per-example gradients, what is released for an example is exactly the
    gradient whose norm was measured, scaled: its norm is ≤ C_l up to fp32 rounding of one
    norm (~1e-7 relative), even for an example whose rows cancel (the Gram form's weakness)."""
    device = device_for_backend(triton_backend)
    generator = torch.Generator().manual_seed(7)
    rows = torch.randn(1, 8, 24, generator=generator)
    x = torch.cat([rows, rows], dim=1) * 30.0
    grad_output = torch.randn(1, 8, 16, generator=generator)
    grad_output = torch.cat([grad_output, -grad_output * (1 - 1e-3)], dim=1) * 30.0
    for backend in ("reference", triton_backend):
        dev = "cpu" if backend == "reference" else device
        _, summed, _ = store_clip(backend, x.to(dev), grad_output.to(dev), 0.25, 1.0, 1)
        assert summed.double().norm() <= 0.25 * (1 + 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_two_pass_kernels_take_16_bit_inputs(dtype, triton_backend):
    """The recompute kernels (norm², then Σ_b c_b P_b) on 16-bit or fp32 inputs equal the float64
    per-example gradients of the same values (fp32 accumulation in both)."""
    device = device_for_backend(triton_backend)
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(3, 19, 13, generator=generator).to(dtype)
    grad_output = torch.randn(3, 19, 22, generator=generator).to(dtype)
    coef = torch.rand(3, generator=generator)
    per_example = torch.einsum("bto,bti->boi", grad_output.double(), x.double())
    norm2 = linear_weight_norm2_op(x.to(device), grad_output.to(device), backend=triton_backend)
    summed = linear_weight_clipped_sum_op(
        x.to(device), grad_output.to(device), coef.to(device), backend=triton_backend
    )
    torch.testing.assert_close(
        norm2.cpu().double(), per_example.square().sum((1, 2)), atol=1e-4, rtol=1e-5
    )
    torch.testing.assert_close(
        summed.cpu().double(),
        (coef.double()[:, None, None] * per_example).sum(0),
        atol=1e-4,
        rtol=1e-5,
    )


def test_every_autotune_config_matches(triton_backend, monkeypatch):
    """The autotuner keeps one config under the interpreter; here each config runs in turn (one
    at a time, so no timing), since layouts such as the partial norms' rows depend on the tiles.
    Three examples (a row stride to get right), widths spanning several tiles of every config."""
    from flashdp import kernels

    device = device_for_backend(triton_backend)
    generator = torch.Generator().manual_seed(13)
    x = torch.randn(3, 9, 70, generator=generator)
    grad_output = torch.randn(3, 9, 140, generator=generator)
    coef = torch.rand(3, generator=generator)
    norm2, summed, bias = per_example_oracle(x, grad_output, 2.0, 3.0)
    per_example = torch.einsum("bto,bti->boi", grad_output.double(), x.double())
    tuned = {
        kernels._norm2_kernel: kernels._CONFIGS,
        kernels._clipped_sum_kernel: kernels._CLIPPED_SUM_CONFIGS,
        kernels._store_kernel: kernels._CONFIGS,
        kernels._weighted_sum_kernel: kernels._SUM_CONFIGS,
    }
    for index in range(len(kernels._CONFIGS)):
        for kernel, configs in tuned.items():
            monkeypatch.setattr(kernel, "configs", [configs[index % len(configs)]])
            monkeypatch.setattr(kernel, "cache", {})
        x_, g_ = x.to(device), grad_output.to(device)
        got = store_clip(triton_backend, x_, g_, 2.0, 3.0, 2)
        for name, value, expected in zip(("norm2", "sum", "bias"), got, (norm2, summed, bias),
                                         strict=True):  # fmt: skip
            torch.testing.assert_close(
                value.cpu().double(), expected, atol=1e-4, rtol=1e-5, msg=f"{index} {name}"
            )
        two_pass = (
            linear_weight_norm2_op(x_, g_, backend=triton_backend),
            linear_weight_clipped_sum_op(x_, g_, coef.to(device), backend=triton_backend),
        )
        references = (
            per_example.square().sum((1, 2)),
            (coef.double()[:, None, None] * per_example).sum(0),
        )
        for value, expected in zip(two_pass, references, strict=True):
            torch.testing.assert_close(value.cpu().double(), expected, atol=1e-4, rtol=1e-5)
