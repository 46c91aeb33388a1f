"""The kernel test contract must catch what it exists to catch."""

from __future__ import annotations

import math
from typing import NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels_common import Tolerance, assert_kernel_matches, compare_tensors, poison_uninitialized
from kernels_common.swiglu import swiglu_reference


def inputs(generator: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "a": torch.randn(4, 9, generator=generator, requires_grad=True),
        "b": torch.randn(4, 9, generator=generator, requires_grad=True),
    }


class WrongGradSwiGLU(torch.autograd.Function):
    """Right forward; the gradient of ``a`` forgets the ``a * sigmoid'(a)`` term."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.nn.functional.silu(a) * b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return grad * b * torch.sigmoid(a), grad * torch.nn.functional.silu(a)


def test_correct_implementation_passes_and_reports_every_tensor():
    report = assert_kernel_matches(
        swiglu_reference, lambda a, b: torch.nn.functional.silu(a) * b, inputs
    )
    assert report.ok
    assert [c.name for c in report.comparisons] == ["out", "grad[a]", "grad[b]"]
    assert report["out"].max_abs_error < 1e-6


def test_a_wrong_gradient_is_caught_and_named():
    with pytest.raises(AssertionError) as caught:
        assert_kernel_matches(swiglu_reference, lambda a, b: WrongGradSwiGLU.apply(a, b), inputs)
    message = str(caught.value)
    assert "grad[a]" in message
    assert "FAIL" in message.split("grad[a]")[1].splitlines()[0]
    assert "FAIL" not in message.split("grad[b]")[1].splitlines()[0]


def test_a_wrong_output_is_caught():
    with pytest.raises(AssertionError, match=r"out .*FAIL"):
        assert_kernel_matches(
            swiglu_reference, lambda a, b: torch.nn.functional.silu(a) * b * (1 + 1e-3), inputs
        )


class OnesOnlyGradSwiGLU(WrongGradSwiGLU):
    """Right forward; a backward that ignores the output gradient (right only for all ones)."""

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        sig = torch.sigmoid(a)
        return b * sig * (1 + a * (1 - sig)), torch.nn.functional.silu(a)


def test_gradient_check_uses_a_random_output_gradient():
    with pytest.raises(AssertionError, match=r"grad\[a\].*FAIL"):
        assert_kernel_matches(swiglu_reference, lambda a, b: OnesOnlyGradSwiGLU.apply(a, b), inputs)


def test_unwritten_output_is_caught_by_poisoning():
    def forgets_the_last_row(a, b):
        out = torch.empty_like(a)
        out[:-1] = torch.nn.functional.silu(a[:-1]) * b[:-1]
        return out

    with pytest.raises(AssertionError, match=r"out .*FAIL \(9/36 elements\)"):
        assert_kernel_matches(swiglu_reference, forgets_the_last_row, inputs, check_grad=False)


def test_poisoning_fills_every_empty_factory_and_restores_them():
    original = torch.empty
    with poison_uninitialized():
        assert torch.empty(3).isnan().all()
        assert torch.empty_like(torch.ones(2)).isnan().all()
        assert torch.empty_strided((2,), (1,)).isnan().all()
        assert torch.ones(1).new_empty(4).isnan().all()
        assert (torch.empty(2, dtype=torch.int32) == torch.iinfo(torch.int32).max).all()
        assert torch.empty(2, dtype=torch.bool).all()
    assert torch.empty is original


def test_non_differentiable_implementation_is_reported():
    with pytest.raises(AssertionError, match=r"not differentiable"):
        assert_kernel_matches(
            swiglu_reference, lambda a, b: (torch.nn.functional.silu(a) * b).detach(), inputs
        )


def test_output_structure_must_match():
    with pytest.raises(AssertionError, match=r"output structure differs"):
        assert_kernel_matches(lambda a, b: (a, b), lambda a, b: (a, (b,)), inputs, check_grad=False)


def test_reference_runs_in_float32_for_low_precision_inputs():
    seen: list[torch.dtype] = []

    def reference(a, b):
        seen.append(a.dtype)
        return swiglu_reference(a, b)

    def bf16_inputs(generator):
        return {k: v.detach().bfloat16().requires_grad_() for k, v in inputs(generator).items()}

    assert_kernel_matches(reference, swiglu_reference, bf16_inputs)
    assert seen == [torch.float32]


def test_compare_tensors_errors_and_nan_handling():
    expected = torch.tensor([1.0, 2.0, math.nan, math.inf])
    same = compare_tensors("x", expected.clone(), expected, Tolerance(0.0, 0.0))
    assert same.ok
    assert same.max_abs_error == 0.0
    off = compare_tensors(
        "x", torch.tensor([1.0, 2.5, math.nan, math.inf]), expected, Tolerance(0.1, 0.1)
    )
    assert off.mismatched == 1
    assert off.max_abs_error == pytest.approx(0.5)
    assert off.max_rel_error == pytest.approx(0.25)
    nan_where_finite = compare_tensors(
        "x", torch.tensor([math.nan]), torch.tensor([1.0]), Tolerance(1, 1)
    )
    assert not nan_where_finite.ok
    with pytest.raises(AssertionError, match=r"shape \(2,\) != reference \(3,\)"):
        compare_tensors("x", torch.ones(2), torch.ones(3), Tolerance(0, 0))


def test_tolerance_validation_and_missing_dtype():
    with pytest.raises(ValueError, match="non-negative"):
        Tolerance(atol=-1.0, rtol=0.0)

    def int_inputs(generator):
        return {"x": torch.arange(3)}

    with pytest.raises(ValueError, match=r"no tolerance for dtype torch.int64"):
        assert_kernel_matches(
            lambda x: x, lambda x: x, int_inputs, reference_dtype=None, check_grad=False
        )
    with pytest.raises(ValueError, match="no input requires grad"):
        assert_kernel_matches(lambda x: x, lambda x: x, int_inputs)


def state_inputs(generator: torch.Generator) -> dict:
    """A recurrent-style call: a tensor and a nested state tuple, all differentiable."""
    return {
        "x": torch.randn(3, 4, generator=generator, requires_grad=True),
        "state": (
            torch.randn(3, 4, generator=generator, requires_grad=True),
            torch.randn(3, generator=generator, requires_grad=True),
        ),
    }


def step(x, state):
    c, n = state
    return x * c + n[:, None]


def test_nested_inputs_are_copied_cast_and_their_gradients_compared():
    dtypes = []

    def reference(x, state):
        dtypes.append([x.dtype, *(t.dtype for t in state)])
        return step(x, state)

    report = assert_kernel_matches(reference, step, state_inputs)
    assert [c.name for c in report.comparisons] == [
        "out",
        "grad[x]",
        "grad[state[0]]",
        "grad[state[1]]",
    ]

    def bf16(generator):
        made = state_inputs(generator)
        return {
            "x": made["x"].detach().bfloat16().requires_grad_(),
            "state": tuple(t.detach().bfloat16().requires_grad_() for t in made["state"]),
        }

    dtypes.clear()
    # bf16 rounds x * c (|x * c| < 16 here) to 8 bits before n is added: near-cancelling sums
    # keep an absolute error of up to 2**-8 * 16 = 0.0625, which the atol allows for.
    bf16_tolerance = Tolerance(atol=0.0625, rtol=1.6e-2)
    assert_kernel_matches(reference, step, bf16, tolerances=bf16_tolerance)
    assert dtypes == [[torch.float32] * 3]


def test_a_detached_state_is_caught():
    def detaches_state(x, state):
        return step(x, tuple(t.detach() for t in state))

    with pytest.raises(AssertionError, match=r"grad\[state\[0\]\].*FAIL"):
        assert_kernel_matches(step, detaches_state, state_inputs)


def test_float64_inputs_are_not_downcast_for_the_reference():
    def inputs64(generator):
        return {"a": torch.randn(50, generator=generator, dtype=torch.float64, requires_grad=True)}

    def fn(a):
        return torch.exp(a) * 1.2345678901

    report = assert_kernel_matches(fn, fn, inputs64)
    assert report["out"].max_abs_error == 0.0


def test_differentiable_outputs_must_agree():
    with pytest.raises(AssertionError, match="differentiable outputs differ"):
        assert_kernel_matches(
            lambda a, b: (a * b, a + b),
            lambda a, b: (a * b, (a + b).detach()),
            inputs,
        )


finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(finite, finite), min_size=1, max_size=20),
    st.sampled_from([0.0, 1e-6, 1e-3]),
    st.sampled_from([0.0, 1e-5, 1e-2]),
)
def test_compare_tensors_agrees_with_torch_isclose(pairs, atol, rtol):
    actual = torch.tensor([a for a, _ in pairs])
    expected = torch.tensor([e for _, e in pairs])
    comparison = compare_tensors("x", actual, expected, Tolerance(atol, rtol))
    # peer oracle: torch.isclose applies the same |a - e| <= atol + rtol * |e| rule
    close = torch.isclose(actual.double(), expected.double(), rtol=rtol, atol=atol)
    assert comparison.mismatched == int((~close).sum())
    assert comparison.ok == (comparison.tolerance_used <= 1.0)


def test_forward_only_implementation_with_check_grad_false():
    # inference-only kernels are compared on outputs alone, with the same input factory
    def no_autograd(a, b):
        with torch.no_grad():
            return torch.nn.functional.silu(a) * b

    report = assert_kernel_matches(swiglu_reference, no_autograd, inputs, check_grad=False)
    assert [c.name for c in report.comparisons] == ["out"]


class State(NamedTuple):
    c: torch.Tensor
    n: torch.Tensor


def test_named_tuple_state_is_rebuilt_and_differentiated():
    def named(generator):
        made = state_inputs(generator)
        return {"x": made["x"], "state": State(*made["state"])}

    seen = []

    def step_named(x, state):
        seen.append(type(state))
        return step(x, (state.c, state.n))

    report = assert_kernel_matches(step_named, step_named, named)
    assert seen == [State, State]
    assert "grad[state[1]]" in [c.name for c in report.comparisons]


def test_device_for_backend_puts_compiled_triton_inputs_on_cuda():
    from kernels_common import Backend
    from kernels_common.testing import device_for_backend

    assert device_for_backend(Backend.TRITON) == "cuda"
    assert device_for_backend("triton") == "cuda"
    assert device_for_backend(Backend.INTERPRETER) == "cpu"
    assert device_for_backend(Backend.REFERENCE) == "cpu"
