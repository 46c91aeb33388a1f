"""The worked example op through every backend, under the shared kernel test contract."""

from __future__ import annotations

import functools

import pytest
import torch

from kernels_common import Backend, assert_kernel_matches, resolve_backend
from kernels_common.swiglu import swiglu, swiglu_reference


def silu_times(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Independent oracle: the closed form a * sigmoid(a) * b in float64."""
    a64, b64 = a.double(), b.double()
    return (a64 * torch.sigmoid(a64) * b64).to(a.dtype)


def make_inputs(shape, dtype=torch.float32, device="cpu", contiguous=True):
    def make(generator: torch.Generator) -> dict[str, torch.Tensor]:
        a = 3 * torch.randn(shape, generator=generator)
        b = torch.randn(shape, generator=generator)
        if not contiguous:
            a, b = a.transpose(0, -1), b.transpose(0, -1)
        return {
            "a": a.to(device, dtype).requires_grad_(),
            "b": b.to(device, dtype).requires_grad_(),
        }

    return make


SHAPES = [(1,), (7, 3), (5, 1025), (2, 3, 4097)]  # tails that are not a multiple of any block


@pytest.mark.parametrize("shape", SHAPES)
def test_reference_equals_closed_form(shape):
    assert_kernel_matches(
        silu_times, functools.partial(swiglu, backend="reference"), make_inputs(shape)
    )


def device_of(backend: Backend) -> str:
    return "cuda" if backend is Backend.TRITON else "cpu"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_kernel_matches_the_reference(triton_backend, shape, dtype):
    device = device_of(triton_backend)
    # Automatic dispatch picks the kernel: the interpreter on the CPU, compiled Triton on CUDA.
    assert resolve_backend(None, [torch.ones(1, device=device)]) is triton_backend
    report = assert_kernel_matches(
        functools.partial(swiglu, backend="reference"),
        swiglu,
        make_inputs(shape, dtype, device),
    )
    assert {c.name for c in report.comparisons} == {"out", "grad[a]", "grad[b]"}


def test_triton_kernel_handles_non_contiguous_and_empty_inputs(triton_backend):
    device = device_of(triton_backend)
    assert_kernel_matches(
        swiglu_reference,
        functools.partial(swiglu, backend=triton_backend),
        make_inputs((6, 5, 3), device=device, contiguous=False),
    )
    empty = torch.empty(0, 4, device=device, requires_grad=True)
    out = swiglu(empty, empty, backend=triton_backend)
    out.sum().backward()
    assert out.shape == (0, 4)
    assert empty.grad.shape == (0, 4)


def test_bad_inputs_are_refused_with_clear_messages():
    a = torch.randn(4, 3)
    with pytest.raises(ValueError, match=r"same shape, got \(4, 3\) and \(3, 4\)"):
        swiglu(a, a.T)
    with pytest.raises(TypeError, match=r"same dtype"):
        swiglu(a, a.half())
    with pytest.raises(TypeError, match=r"b must be float32, float16 or bfloat16, got torch.int64"):
        swiglu(a, a.long())
    with pytest.raises(TypeError, match=r"a must be a torch.Tensor, got list"):
        swiglu([1.0], a)
    with pytest.raises(ValueError, match=r"same device"):
        swiglu(a, a.to("meta"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_kernel_on_a_large_cuda_tensor(dtype):
    """Many blocks, a ragged tail, and the autotuner choosing among all its configs."""
    assert resolve_backend(None, [torch.ones(1, device="cuda")]) is Backend.TRITON
    assert_kernel_matches(
        functools.partial(swiglu, backend="reference"),
        functools.partial(swiglu, backend="triton"),
        make_inputs((4096, 8192 + 17), dtype, device="cuda"),
    )
