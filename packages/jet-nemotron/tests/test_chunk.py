"""The chunked (WY) gated delta rule: the PyTorch chunk form and the Triton kernels.

Oracle: the step-by-step recurrence (``jet_nemotron.ops.naive``) in float64, checked once against
FLA's ``naive_recurrent_gated_delta_rule`` (the peer). Inputs as FLA's ``test_gdn.py``: unit-norm
keys, ``beta = sigmoid(·)``, ``g = logsigmoid(U(0, 1)) / norm`` with ``norm`` 0.1 (fast decay, ``g``
down to -6.9 per step), 1 or 10; every case carries an initial state in and the final state out, so
one random output gradient and one random final-state gradient reach every input.

Tolerances (elementwise, ``|a - e| <= atol + rtol |e|``):

* float64 (the PyTorch form): ``1e-12``. The two forms sum the same O(1) terms in a different
  order, over at most a few hundred steps; float64 rounding stays below 3e-14 (measured), while a
  wrong term is O(1e-3) or larger.
* float32 (the kernels, full-precision ``tl.dot``): outputs and states ``atol = rtol = 2e-6``,
  gradients ``atol = rtol = 2e-5``. Gradients pass through ``(I + A)⁻¹`` and the reverse
  recurrence, and the reverse in-chunk sums of ``dg`` add up to 64 terms: about ten times the
  outputs' rounding (measured at most 6e-7 for outputs, 7e-6 for gradients, 0.3 of the bounds).
  FLA's own test allows a relative norm error of 2e-3 in float32.
* float16 (interpreter): the kernels store ``w, u, v_new`` and the chunk states in float16 and
  feed float16 tiles to ``tl.dot``, each a rounding of 2^-11 = 4.9e-4 relative, compounded
  through the solve and the recurrence: outputs ``5e-3``, gradients ``2e-2`` (measured at most
  0.2 of these bounds).
* bfloat16 (GPU only: the interpreter's ``tl.dot`` multiplies bfloat16 bit patterns as
  integers): 2^-8 = 3.9e-3 per rounding, eight times float16's. Outputs ``atol = rtol = 5e-2``,
  gradients ``atol = 0.5, rtol = 5e-2`` (dk of unit-norm keys reaches O(10)); on the interpreter
  with bfloat16 dots emulated as exact products summed in float32 (what tensor cores do) the test
  shape reached 0.39 (outputs) and 0.56 (gradients) of these bounds.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.nn.functional as F

from jet_nemotron.ops.chunk import (
    chunk_gated_delta_rule_fwd,
    chunk_gated_delta_rule_torch,
    from_chunks,
    solve_tril,
    to_chunks,
)
from jet_nemotron.ops.naive import naive_recurrent_gated_delta_rule
from kernels_common.testing import Tolerance, assert_kernel_matches, device_for_backend

F64_TOL = Tolerance(atol=1e-12, rtol=1e-12)
TOLERANCES = {  # dtype: (outputs and final state, gradients)
    torch.float32: (Tolerance(atol=2e-6, rtol=2e-6), Tolerance(atol=2e-5, rtol=2e-5)),
    torch.float16: (Tolerance(atol=5e-3, rtol=5e-3), Tolerance(atol=2e-2, rtol=2e-2)),
    torch.bfloat16: (Tolerance(atol=5e-2, rtol=5e-2), Tolerance(atol=5e-1, rtol=5e-2)),
}


def gated_delta_inputs(
    B: int,
    T: int,
    H: int,
    K: int,
    V: int,
    *,
    gate_norm: float = 1.0,
    dtype: torch.dtype = torch.float64,
    device: str = "cpu",
    initial_state: bool = True,
    output_final_state: bool = True,
    strided: bool = False,
):
    """A seeded input factory for ``assert_kernel_matches`` (FLA's test_gdn distributions);
    the state is float32 (float64 for float64 inputs), as the ops take it. ``strided``: q, k, v,
    g, beta laid out ``(B, H, T, ...)`` in memory (non-contiguous views)."""

    def make(generator: torch.Generator) -> dict:
        def rand(*shape: int) -> torch.Tensor:
            return torch.rand(*shape, generator=generator, dtype=torch.float64)

        def randn(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=generator, dtype=torch.float64)

        tensors = {
            "q": randn(B, T, H, K),
            "k": F.normalize(randn(B, T, H, K), dim=-1),
            "v": randn(B, T, H, V),
            "g": F.logsigmoid(rand(B, T, H)) / gate_norm,
            "beta": rand(B, T, H).sigmoid(),
        }
        if strided:
            tensors = {
                n: x.transpose(1, 2).contiguous().transpose(1, 2) for n, x in tensors.items()
            }
        inputs = {n: x.to(device, dtype).requires_grad_() for n, x in tensors.items()}
        state_dtype = torch.promote_types(dtype, torch.float32)
        state = randn(B, H, K, V).to(device, state_dtype).requires_grad_()
        inputs["initial_state"] = state if initial_state else None
        inputs["scale"] = K**-0.5
        inputs["output_final_state"] = output_final_state
        return inputs

    return make


def naive(q, k, v, g, beta, scale, initial_state, output_final_state):
    return naive_recurrent_gated_delta_rule(
        q, k, v, g, beta, scale, initial_state, output_final_state
    )


# (B, T, H, K, V, chunk_size, gate_norm): T = 1, T one short of a chunk, T not a multiple of the
# chunk, several chunks (500 = 7 full chunks + 52), odd head dims (60, 100), K != V, batch 1 and 2
TORCH_CASES = [
    (2, 1, 2, 60, 100, 16, 1.0),
    (1, 63, 1, 64, 64, 64, 0.1),
    (2, 75, 2, 100, 60, 32, 10.0),
    (1, 75, 1, 128, 100, 16, 1.0),
    (1, 500, 2, 32, 48, 64, 1.0),
]


@pytest.mark.parametrize("case", TORCH_CASES, ids=str)
def test_torch_chunk_form_matches_the_recurrence(case):
    B, T, H, K, V, chunk_size, gate_norm = case
    report = assert_kernel_matches(
        naive,
        functools.partial(chunk_gated_delta_rule_torch, chunk_size=chunk_size),
        gated_delta_inputs(B, T, H, K, V, gate_norm=gate_norm),
        reference_dtype=torch.float64,
        tolerances=F64_TOL,
    )
    names = {c.name for c in report.comparisons}
    assert {"out[0]", "out[1]", "grad[g]", "grad[beta]", "grad[initial_state]"} <= names


def test_explicit_backward_matches_autograd_through_the_stages():
    """The hand-written backward equals autograd through the forward stage functions."""
    make = gated_delta_inputs(1, 75, 2, 60, 100, gate_norm=0.1)
    inputs = make(torch.Generator().manual_seed(0))
    names = ["q", "k", "v", "g", "beta", "initial_state"]
    leaves = [inputs[n] for n in names]
    generator = torch.Generator().manual_seed(1)
    do = torch.randn(1, 75, 2, 100, generator=generator, dtype=torch.float64)
    dht = torch.randn(1, 2, 60, 100, generator=generator, dtype=torch.float64)

    o, final = chunk_gated_delta_rule_torch(*leaves[:5], inputs["scale"], leaves[5], True, 32)
    explicit = torch.autograd.grad((o * do).sum() + (final * dht).sum(), leaves)

    chunked = [to_chunks(x, 32) for x in leaves[:5]]
    o_stages, final_stages, _, _ = chunk_gated_delta_rule_fwd(*chunked, inputs["scale"], leaves[5])
    o_stages = from_chunks(o_stages, 75)
    autograd = torch.autograd.grad((o_stages * do).sum() + (final_stages * dht).sum(), leaves)
    for name, a, b in zip(names, explicit, autograd, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12, msg=name)


def test_gradcheck_of_the_explicit_backward():
    """Finite differences in float64 at a tiny shape: two chunks, the second partial."""
    inputs = gated_delta_inputs(1, 20, 1, 4, 3)(torch.Generator().manual_seed(2))
    args = [inputs[n] for n in ("q", "k", "v", "g", "beta")]

    def fn(q, k, v, g, beta, initial_state):
        return chunk_gated_delta_rule_torch(q, k, v, g, beta, 0.5, initial_state, True, 16)

    assert torch.autograd.gradcheck(fn, (*args, inputs["initial_state"]))


@pytest.mark.parametrize("chunk_size", [16, 32, 64])
def test_solve_tril_inverts(chunk_size):
    """Blocked forward substitution equals a dense inverse, for the sizes of A it meets (entries
    up to ~1 from unit keys and beta < 1)."""
    generator = torch.Generator().manual_seed(3)
    A = torch.rand(3, chunk_size, chunk_size, generator=generator, dtype=torch.float64) - 0.5
    A = A.tril(-1)
    eye = torch.eye(chunk_size, dtype=torch.float64)
    expected = torch.linalg.inv(eye + A)
    torch.testing.assert_close(solve_tril(A), expected, atol=1e-12, rtol=1e-12)


def test_state_passing_equals_one_run():
    """Two halves (split off the chunk grid) with the state handed over equal one pass."""
    inputs = gated_delta_inputs(2, 75, 2, 60, 100)(torch.Generator().manual_seed(4))
    q, k, v, g, beta = (inputs[n].detach() for n in ("q", "k", "v", "g", "beta"))
    h0, scale = inputs["initial_state"].detach(), inputs["scale"]
    o, final = chunk_gated_delta_rule_torch(q, k, v, g, beta, scale, h0, True, 32)
    first, middle = chunk_gated_delta_rule_torch(
        *(x[:, :40] for x in (q, k, v, g, beta)), scale, h0, True, 32
    )
    second, last = chunk_gated_delta_rule_torch(
        *(x[:, 40:] for x in (q, k, v, g, beta)), scale, middle, True, 32
    )
    torch.testing.assert_close(torch.cat([first, second], dim=1), o, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(last, final, atol=1e-12, rtol=1e-12)


def test_torch_form_keeps_dtypes_and_layouts():
    """Non-contiguous float32 inputs: o in float32 like q, the state float32, and the same values
    as contiguous float64 inputs (to float32 rounding)."""
    inputs = gated_delta_inputs(1, 30, 2, 8, 6)(torch.Generator().manual_seed(5))
    args = [inputs[n].detach() for n in ("q", "k", "v", "g", "beta")]
    o64, s64 = chunk_gated_delta_rule_torch(*args, 0.3, None, True, 16)
    strided = [x.float().transpose(1, 2).contiguous().transpose(1, 2) for x in args]
    assert not strided[0].is_contiguous()
    o32, s32 = chunk_gated_delta_rule_torch(*strided, 0.3, None, True, 16)
    assert (o32.dtype, s32.dtype, o64.dtype) == (torch.float32, torch.float32, torch.float64)
    torch.testing.assert_close(o32, o64.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s32, s64.float(), atol=1e-5, rtol=1e-5)
    _, final = chunk_gated_delta_rule_torch(*strided, 0.3, None, False, 16)
    assert final is None


@pytest.mark.filterwarnings("ignore:Triton is not supported on current platform")
def test_torch_chunk_form_matches_fla_naive():
    """Peer: FLA's recurrence (float32, arguments ordered q, k, v, beta, g)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
        fla_naive = pytest.importorskip("fla.ops.gated_delta_rule.naive")

    def peer(q, k, v, g, beta, scale, initial_state, output_final_state):
        return fla_naive.naive_recurrent_gated_delta_rule(
            q, k, v, beta, g, scale, initial_state, output_final_state
        )

    assert_kernel_matches(
        peer,
        functools.partial(chunk_gated_delta_rule_torch, chunk_size=32),
        gated_delta_inputs(2, 75, 2, 60, 100, dtype=torch.float32),
        tolerances=TOLERANCES[torch.float32][0],
        grad_tolerances=TOLERANCES[torch.float32][1],
    )


# (B, T, H, K, V, chunk_size): T = 1; T not a multiple of the chunk with V = 100 (two V tiles)
# and K = 60; T one short of a 64-chunk; K = 128 (two K tiles in dq/dk/dw, partial dg sums);
# K = 256, V = 80 (the largest state tile: 256 x 32, three V programs); T = 500 (eight chunks)
# with slow decay (gate_norm 10: the state keeps what it is written for hundreds of steps)
KERNEL_CASES = [  # (B, T, H, K, V, chunk_size, gate_norm)
    (1, 1, 2, 60, 100, 16, 1.0),
    (2, 75, 1, 60, 100, 32, 1.0),
    (1, 63, 2, 64, 64, 64, 1.0),
    (1, 40, 1, 128, 48, 16, 1.0),
    (1, 20, 1, 256, 80, 16, 1.0),
    (1, 500, 1, 32, 32, 64, 10.0),
]


def check_kernels(triton_backend, make, chunk_size, dtype=torch.float32):
    from jet_nemotron.ops.chunk_triton import chunk_gated_delta_rule_triton

    out_tol, grad_tol = TOLERANCES[dtype]
    return assert_kernel_matches(
        naive,
        functools.partial(chunk_gated_delta_rule_triton, chunk_size=chunk_size),
        make,
        reference_dtype=torch.float64,
        tolerances=out_tol,
        grad_tolerances=grad_tol,
    )


@pytest.mark.parametrize("case", KERNEL_CASES, ids=str)
def test_kernels_match_the_recurrence(triton_backend, case):
    B, T, H, K, V, chunk_size, gate_norm = case
    device = device_for_backend(triton_backend)
    make = gated_delta_inputs(
        B, T, H, K, V, gate_norm=gate_norm, dtype=torch.float32, device=device
    )
    report = check_kernels(triton_backend, make, chunk_size)
    assert "grad[initial_state]" in {c.name for c in report.comparisons}


def test_kernels_with_fast_decay_no_states_and_strided_inputs(triton_backend):
    """g down to -6.9 per step (e^{gc} underflows to 0 in float32 within a chunk), no initial
    state and no final state (the kernels' ``None`` paths), non-contiguous inputs."""
    device = device_for_backend(triton_backend)
    make = gated_delta_inputs(
        1, 50, 2, 60, 100, gate_norm=0.1, dtype=torch.float32, device=device,
        initial_state=False, output_final_state=False, strided=True,
    )  # fmt: skip
    assert not make(torch.Generator().manual_seed(0))["q"].is_contiguous()
    check_kernels(triton_backend, make, 32)


def test_kernels_in_float16(triton_backend):
    device = device_for_backend(triton_backend)
    make = gated_delta_inputs(1, 70, 2, 60, 100, dtype=torch.float16, device=device)
    check_kernels(triton_backend, make, 32, dtype=torch.float16)


@pytest.mark.gpu
def test_kernels_in_bfloat16_on_the_gpu(triton_backend):
    """Model-sized heads (K = V = 128, 64-step chunks, a partial last chunk)."""
    make = gated_delta_inputs(2, 130, 2, 128, 128, dtype=torch.bfloat16, device="cuda")
    check_kernels(triton_backend, make, 64, dtype=torch.bfloat16)


def test_kernel_state_passing_equals_one_run(triton_backend):
    from jet_nemotron.ops.chunk_triton import chunk_gated_delta_rule_triton

    device = device_for_backend(triton_backend)
    make = gated_delta_inputs(1, 50, 1, 60, 100, dtype=torch.float32, device=device)
    inputs = make(torch.Generator().manual_seed(6))
    q, k, v, g, beta = (inputs[n].detach() for n in ("q", "k", "v", "g", "beta"))
    h0, scale = inputs["initial_state"].detach(), inputs["scale"]
    o, final = chunk_gated_delta_rule_triton(q, k, v, g, beta, scale, h0, True, 16)
    first, middle = chunk_gated_delta_rule_triton(
        *(x[:, :21] for x in (q, k, v, g, beta)), scale, h0, True, 16
    )
    second, last = chunk_gated_delta_rule_triton(
        *(x[:, 21:] for x in (q, k, v, g, beta)), scale, middle, True, 16
    )
    tolerance = {"atol": 2e-6, "rtol": 2e-6}  # float32 reordering, as TOLERANCES
    torch.testing.assert_close(torch.cat([first, second], dim=1), o, **tolerance)
    torch.testing.assert_close(last, final, **tolerance)


@pytest.mark.parametrize("chunk_size", [16, 32, 64])
def test_solve_tril_kernel_inverts(triton_backend, chunk_size):
    """The kernel's ``(I + A)⁻¹`` per chunk, with a partial last chunk, against a dense inverse
    (float32 with full-precision dots: 1e-5)."""
    from jet_nemotron.kernels.chunk_forward import solve_tril as solve_tril_kernel

    device = device_for_backend(triton_backend)
    T = chunk_size + 5
    generator = torch.Generator().manual_seed(7)
    A = torch.rand(1, T, 2, chunk_size, generator=generator) - 0.5
    chunked = to_chunks(A, chunk_size)  # (1, 2, N, C, C)
    rows = torch.arange(chunk_size)
    lower = (rows[:, None] > rows[None, :]).float()
    Ai = solve_tril_kernel(from_chunks(chunked * lower, T).contiguous().to(device)).cpu()
    eye = torch.eye(chunk_size, dtype=torch.float64)
    expected = from_chunks(torch.linalg.inv(eye + (chunked * lower).double()), T)
    torch.testing.assert_close(Ai.double(), expected, atol=1e-5, rtol=1e-5)


def test_kernels_refuse_float64(triton_backend):
    from jet_nemotron.ops.chunk_triton import chunk_gated_delta_rule_triton

    inputs = gated_delta_inputs(1, 4, 1, 8, 8)(torch.Generator().manual_seed(8))
    args = [inputs[n].detach() for n in ("q", "k", "v", "g", "beta")]
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        chunk_gated_delta_rule_triton(*args, 0.5, None, False, 16)
