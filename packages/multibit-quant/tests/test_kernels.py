"""The Triton fake-quant kernels (interpreter on the CPU, compiled on a GPU) equal the reference.

Outputs and gradients in float32. Tolerance: atol 2e-6, rtol 2e-5. Both sides reduce each row
(K values) or each tensor in a different order for the means, standard deviations and the step
gradient; the measured worst case is about 4e-6 relative, on the LSQ step gradient (a sum of K
products that cancel). Codes must match: DoReFa inputs keep their codes away from rounding
boundaries (the kernel's tanh may differ from torch's by an ulp there; see ``helpers``).
"""

from __future__ import annotations

import pytest
import torch
from helpers import dorefa_weight_away_from_boundaries

from kernels_common import Tolerance, assert_kernel_matches
from kernels_common.testing import device_for_backend
from multibit_quant import fake_quant_activation, fake_quant_weight
from multibit_quant.reference import fake_quant_activation_reference, fake_quant_weight_reference

TOLERANCE = Tolerance(atol=2e-6, rtol=2e-5)
# (C, K): one element, one row, odd sizes, K over the 1024-wide block (three chunks)
SHAPES = [(1, 1), (1, 7), (3, 17), (5, 75), (2, 2100)]


def weight_inputs(shape, method, bits, device):
    rows, cols = shape

    def make(generator):
        if method == "dorefa":
            weight = dorefa_weight_away_from_boundaries(rows, cols, bits, generator)
            step = None
        else:
            weight = torch.randn(rows, cols, generator=generator) * 0.1
            step = (torch.rand(rows, generator=generator) * 0.05 + 0.01).to(device)
            step.requires_grad_(True)
        return {"weight": weight.to(device).requires_grad_(True), "step": step}

    return make


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("method", ["dorefa", "lsq"])
@pytest.mark.parametrize("correction", [None, "mean", "mean_var"])
@pytest.mark.parametrize("bits", [2, 5, 8])
def test_weight_kernel(shape, method, correction, bits, triton_backend):
    assert_kernel_matches(
        lambda weight, step: fake_quant_weight_reference(weight, bits, method, step, correction),
        lambda weight, step: fake_quant_weight(
            weight, bits, method, step, correction, backend=triton_backend
        ),
        weight_inputs(shape, method, bits, device_for_backend(triton_backend)),
        tolerances=TOLERANCE,
    )


def test_weight_kernel_tied_peaks_and_constant_rows(triton_backend):
    """Two elements at the row's peak share its gradient; a constant row and a row quantized to
    one value (the degenerate corrections) stay finite and match."""
    device = device_for_backend(triton_backend)
    weight = torch.tensor(
        [[0.8, -0.8, 0.2, 0.1], [0.3, 0.3, 0.3, 0.3], [0.01, 0.02, -0.01, 0.015]]
    ).to(device)
    for method, step in (("dorefa", None), ("lsq", torch.tensor([0.5, 0.5, 1.0]).to(device))):
        for correction in (None, "mean", "mean_var"):
            report = assert_kernel_matches(
                lambda weight, step, m=method, c=correction: fake_quant_weight_reference(
                    weight, 3, m, step, c
                ),
                lambda weight, step, m=method, c=correction: fake_quant_weight(
                    weight, 3, m, step, c, backend=triton_backend
                ),
                {
                    "weight": weight.clone().requires_grad_(True),
                    "step": None if step is None else step.clone().requires_grad_(True),
                },
                tolerances=TOLERANCE,
            )
            assert report.ok


@pytest.mark.parametrize("shape", [(1,), (3, 5, 7), (2, 1500), (4, 8, 9, 9)], ids=str)
@pytest.mark.parametrize("method", ["clamp", "lsq"])
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("bits", [2, 8])
def test_activation_kernel(shape, method, signed, bits, triton_backend):
    device = device_for_backend(triton_backend)

    def make(generator):
        x = torch.randn(*shape, generator=generator) * 0.8
        step = torch.tensor([0.1], device=device).requires_grad_(True) if method == "lsq" else None
        return {"x": x.to(device).requires_grad_(True), "step": step}

    assert_kernel_matches(
        lambda x, step: fake_quant_activation_reference(x, bits, method, step, signed),
        lambda x, step: fake_quant_activation(
            x, bits, method, step, signed, backend=triton_backend
        ),
        make,
        tolerances=TOLERANCE,
    )


@pytest.mark.parametrize("spread", [1e-3, 1e-5])
def test_dorefa_kernel_on_small_weights(spread, triton_backend):
    """Weights of std 1e-3 to 1e-5 (tanh(w) ≈ w): the kernel's tanh keeps its relative accuracy
    there (an exp-based tanh cancels and moves codes)."""
    device = device_for_backend(triton_backend)
    generator = torch.Generator().manual_seed(7)
    weight = dorefa_weight_away_from_boundaries(16, 200, 8, generator)
    weight = (weight / weight.abs().amax(1, keepdim=True) * spread * 3).to(device)
    codes = {}
    for backend in ("reference", triton_backend):
        out = fake_quant_weight(weight, 8, "dorefa", None, None, backend=backend).cpu()
        scale = weight.cpu().abs().mean(1, keepdim=True)
        codes[str(backend)] = torch.round((out / scale + 1) / 2 * 255)
    assert torch.equal(*codes.values())


def test_dorefa_kernel_saturated_rows_tie_at_the_peak(triton_backend):
    """Weights from 10 up, where tanh is exactly 1 in float32 for both: every such element is a
    tied peak and shares the peak's gradient equally."""
    device = device_for_backend(triton_backend)
    weight = torch.tensor([[12.0, -10.5, 0.3, -0.2, 11.0], [0.5, -0.25, 0.1, 0.05, 0.4]])
    assert_kernel_matches(
        lambda weight: fake_quant_weight_reference(weight, 4, "dorefa", None, "mean_var"),
        lambda weight: fake_quant_weight(
            weight, 4, "dorefa", None, "mean_var", backend=triton_backend
        ),
        {"weight": weight.to(device).requires_grad_(True)},
        tolerances=TOLERANCE,
    )


def test_float64_runs_the_reference_only(triton_backend):
    weight = torch.randn(3, 9, dtype=torch.float64)
    assert fake_quant_weight(weight, 4).dtype == torch.float64  # automatic: the reference
    with pytest.raises(TypeError, match="float64 inputs run on the reference backend only"):
        fake_quant_weight(weight, 4, backend=triton_backend)


def test_half_precision_inputs(triton_backend):
    """float16 weights: the kernel computes in float32 and stores float16, like the reference."""
    device = device_for_backend(triton_backend)
    generator = torch.Generator().manual_seed(3)
    weight = dorefa_weight_away_from_boundaries(4, 33, 4, generator).half().to(device)
    reference = fake_quant_weight_reference(weight, 4, "dorefa", None, "mean_var")
    kernel = fake_quant_weight(weight, 4, "dorefa", None, "mean_var", backend=triton_backend)
    assert kernel.dtype == torch.float16
    torch.testing.assert_close(kernel.float(), reference.float(), rtol=1e-3, atol=1e-5)
