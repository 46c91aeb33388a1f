"""TFLA Triton kernels (forward and backward) against the float64 parallel form.

Runs on the CPU interpreter under ``TRITON_INTERPRET=1`` (tiny shapes) and compiled on CUDA.
Tolerances in float32: outputs ``atol = rtol = 1e-4``, gradients ``atol = rtol = 1e-3`` (the
specification's bounds; the kernels use full-precision float32 dots and reorder sums of at most
a few hundred O(1) terms). bf16/fp16 on the GPU, see ``LOW_PRECISION``.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from kernels_common.testing import Tolerance, assert_kernel_matches, device_for_backend
from tfla_mlstm import mlstm_chunkwise, mlstm_parallel, mlstmsig_chunkwise, mlstmsig_parallel
from tfla_mlstm.kernels.tiles import Tiles

OUT_TOL = Tolerance(atol=1e-4, rtol=1e-4)
GRAD_TOL = Tolerance(atol=1e-3, rtol=1e-3)
# bf16/fp16 (the GPU tests' shapes): the tensor-core dots take the intra-chunk weights, the chunk
# states and their gradients rounded to the inputs' dtype (2^-8, 2^-11); the mLSTM denominator
# max(|z|, exp(-m)) can sit well below 1, which scales those errors up, and di, df are reverse
# cumulative sums over S of per-step terms. Running the GPU test shapes on the interpreter with
# bf16/fp16 dots computed as exact products summed in float32 (what the tensor cores do) and
# float32 "tf32" dots on operands rounded to TF32 reaches at most 0.44 (out) and 0.63 (grads) of
# these bounds in bf16, 0.50 and 0.63 in fp16.
LOW_PRECISION = {
    torch.bfloat16: (Tolerance(atol=1e-1, rtol=5e-2), Tolerance(atol=5e-1, rtol=2.5e-1)),
    torch.float16: (Tolerance(atol=1e-2, rtol=1e-2), Tolerance(atol=1e-1, rtol=5e-2)),
}

VARIANTS = {
    "mlstm": (mlstm_parallel, mlstm_chunkwise, {}),
    "sig": (mlstmsig_parallel, mlstmsig_chunkwise, {"normalize": True}),
    "sig-unnormalized": (mlstmsig_parallel, mlstmsig_chunkwise, {"normalize": False}),
}
# (B, NH, S, DQK, DV, chunk_size): S = 1, S not a multiple of the chunk, several chunks, DQK != DV,
# head dims above one 64-wide tile, chunks of several 64-step tiles, B = 1 and 3
CASES = [
    (1, 1, 1, 8, 8, 16),
    (3, 1, 17, 8, 12, 16),
    (1, 2, 70, 16, 8, 32),
    (1, 1, 200, 8, 16, 256),
    (1, 1, 40, 80, 72, 16),
]


def check(triton_backend, variant, inputs, dtype=torch.float32, chunk_size=16, **options):
    parallel, chunkwise, variant_options = VARIANTS[variant]
    tolerances = (OUT_TOL, GRAD_TOL) if dtype == torch.float32 else LOW_PRECISION[dtype]
    return assert_kernel_matches(
        functools.partial(parallel, **variant_options, **options),
        functools.partial(
            chunkwise, chunk_size=chunk_size, backend=triton_backend, **variant_options, **options
        ),
        inputs,
        reference_dtype=torch.float64,
        tolerances=tolerances[0],
        grad_tolerances=tolerances[1],
    )


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernels_match_the_parallel_form(triton_backend, make_inputs, variant, case):
    *sizes, chunk_size = case
    device = device_for_backend(triton_backend)
    report = check(
        triton_backend,
        variant,
        make_inputs(*sizes, sig=variant != "mlstm", device=device),
        chunk_size=chunk_size,
    )
    assert {"out", "grad[q]", "grad[i]", "grad[f]"} <= {c.name for c in report.comparisons}


@pytest.mark.parametrize("variant", ["mlstm", "sig"])
def test_kernels_carry_states_in_and_out(triton_backend, make_inputs, variant):
    """Initial state in, last state out: values and gradients of both, through the kernels."""
    device = device_for_backend(triton_backend)
    report = check(
        triton_backend,
        variant,
        make_inputs(2, 1, 33, 8, 16, sig=variant == "sig", state=True, device=device),
        return_last_state=True,
    )
    assert "grad[initial_state[0]]" in {c.name for c in report.comparisons}


def test_large_gates_stay_finite(triton_backend, make_inputs):
    device = device_for_backend(triton_backend)
    make = make_inputs(1, 1, 48, 8, 8, gate_scale=8.0, device=device)
    inputs = make(torch.Generator().manual_seed(3))
    assert inputs["i"].abs().max() > 15
    h = mlstm_chunkwise(**inputs, chunk_size=16, backend=triton_backend)
    h.sum().backward()
    assert torch.isfinite(h).all()
    assert all(torch.isfinite(inputs[n].grad).all() for n in "qkvif")
    check(triton_backend, "mlstm", make)


def test_kernels_take_non_contiguous_inputs(triton_backend, make_inputs):
    """q, k, v stored as (B, S, NH, D) and seen as (B, NH, S, D), S not a multiple of the chunk:
    the kernels read contiguous copies and write contiguous outputs and gradients."""
    make = make_inputs(2, 3, 37, 8, 8, device=device_for_backend(triton_backend))

    def transposed(generator: torch.Generator) -> dict:
        inputs = make(generator)
        for name in "qkv":
            stored = inputs[name].detach().transpose(1, 2).contiguous()
            inputs[name] = stored.transpose(1, 2).requires_grad_()
        assert not inputs["q"].is_contiguous()
        return inputs

    check(triton_backend, "mlstm", transposed)


# (S, DQK, DV, chunk): partial head tiles and a partial chunk of 128; two 128-step state blocks
# inside each chunk of 256, the second chunk partial
SIXTEEN_BIT_CASES = [(200, 80, 144, 128), (300, 24, 40, 256)]


@pytest.mark.parametrize("case", SIXTEEN_BIT_CASES, ids=str)
@pytest.mark.parametrize("variant", ["mlstm", "sig"])
def test_16_bit_tile_layout_matches_the_parallel_form(
    triton_backend, make_inputs, monkeypatch, variant, case
):
    """The bf16/fp16 layouts (head tiles up to 128 and 64 / 32-step blocks at level 2; 64-wide
    head tiles over whole 128-step chunks, one stage, for the chunk states) on float32 inputs
    with full-precision dots, so the float32 bounds apply: their masks and block loops are under
    test."""
    S, DQK, DV, chunk_size = case
    choose = Tiles.choose.__func__
    used = []

    def sixteen_bit(cls, chunk_size, dqk, dv, dtype, *, kernel="output"):
        tiles = choose(cls, chunk_size, dqk, dv, torch.bfloat16, kernel=kernel)
        used.append(tiles)
        return dataclasses.replace(tiles, precision="ieee")

    monkeypatch.setattr(Tiles, "choose", classmethod(sixteen_bit))
    inputs = make_inputs(
        1, 1, S, DQK, DV, sig=variant == "sig", device=device_for_backend(triton_backend)
    )
    check(triton_backend, variant, inputs, chunk_size=chunk_size)
    # the three layouts this test exists for: output, states, gradients
    expected = {(128, 80, 144): {(64, 128, 128, 2), (128, 64, 64, 1), (32, 128, 128, 2)},
                (256, 24, 40): {(64, 32, 64, 2), (128, 32, 64, 1), (32, 32, 64, 2)}}  # fmt: skip
    assert {(t.seq, t.qk, t.v, t.stages) for t in used} == expected[(chunk_size, DQK, DV)]


@pytest.mark.parametrize(
    ("chunk_size", "dqk", "dv"), [(128, 128, 256), (512, 64, 64), (32, 32, 48)]
)
def test_chunk_state_layout_is_the_anchors(chunk_size, dqk, dv):
    """bf16 chunk-state kernels against mlstm-kernels' own choice for its recurrent state kernels
    (``get_head_dim_block_size``, one stage, 4 warps at a 64-wide DQK tile, else 2) over blocks
    of its 128-step inter chunk: 8 programs per head at DQK 128, DV 256. float32 keeps its one
    layout; an unknown kernel group is refused."""
    heuristics = pytest.importorskip("mlstm_kernels.triton.kernel_param_heuristics")
    tiles = Tiles.choose(chunk_size, dqk, dv, torch.bfloat16, kernel="states")
    qk, v = (heuristics.get_head_dim_block_size(d, min_block_size=64) for d in (dqk, dv))
    assert (tiles.qk, tiles.v) == (qk, v)
    assert (tiles.seq, tiles.stages, tiles.warps) == (min(chunk_size, 128), 1, 4 if qk == 64 else 2)
    assert Tiles.choose(128, 128, 256, torch.float32, kernel="states") == Tiles.choose(
        128, 128, 256, torch.float32, kernel="gradients"
    )
    with pytest.raises(ValueError, match=r"kernel must be one of .*'states'.*got 'dq'"):
        Tiles.choose(128, 128, 256, torch.bfloat16, kernel="dq")


@pytest.mark.parametrize("chunk_size", [64, 128])
@pytest.mark.parametrize("variant", ["mlstm", "sig"])
def test_backward_recomputes_the_forward_states_bit_for_bit(
    triton_backend, make_inputs, monkeypatch, variant, chunk_size
):
    """float16 (the 16-bit layouts, which differ between the passes at level 2): the backward
    pass recomputes the chunk states with the forward pass's kernel and layout, so the gradients
    are those of the states that produced ``h``, not of a differently rounded copy. At chunk 128
    the state layout's step block (128) differs from both level-2 layouts' (64, 32)."""
    from tfla_mlstm import autograd

    computed = []

    def recorded(*args, **kwargs):
        out = chunk_states(*args, **kwargs)
        computed.append([x.clone() for x in out])
        return out

    chunk_states = autograd.chunk_states
    monkeypatch.setattr(autograd, "chunk_states", recorded)
    x = make_inputs(
        1, 2, 150, 32, 48, sig=variant == "sig", dtype=torch.float16,
        device=device_for_backend(triton_backend),
    )(torch.Generator().manual_seed(0))  # fmt: skip
    fn = mlstm_chunkwise if variant == "mlstm" else mlstmsig_chunkwise
    fn(**x, chunk_size=chunk_size, backend=triton_backend).float().sum().backward()
    assert len(computed) == 2
    for forward, recomputed in zip(*computed, strict=True):
        assert torch.equal(forward, recomputed)


@pytest.mark.parametrize("variant", ["mlstm", "sig"])
def test_float16_matches_the_parallel_form(triton_backend, make_inputs, variant):
    """float16 inputs with their own layout: h and every gradient written in float16 by the
    kernels (S 150 leaves a partial chunk of 64, DV 48 a partial head tile), held to the GPU
    test's float16 bounds, which this shape uses at most 0.16 of on the interpreter."""
    inputs = make_inputs(
        1, 2, 150, 32, 48, sig=variant == "sig", dtype=torch.float16,
        device=device_for_backend(triton_backend),
    )  # fmt: skip
    check(triton_backend, variant, inputs, dtype=torch.float16, chunk_size=64)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant", ["mlstm", "sig"])
def test_low_precision_on_the_gpu(make_inputs, dtype, variant):
    check(
        "triton",
        variant,
        make_inputs(2, 4, 1000, 64, 128, sig=variant == "sig", dtype=dtype, device="cuda"),
        dtype=dtype,
        chunk_size=128,
    )


# float32 rounding of the chunkwise form grows with the chunk: against the float64 parallel form
# at the shape below, the pure-PyTorch chunkwise form in float32 reaches relative norm errors
# ||x - ref|| / ||ref|| of 1.4e-6 (out) / 8.3e-6 (worst gradient) at L=128, 5.6e-6 / 3.4e-5 at
# L=512 and 1.3e-5 / 1.0e-4 at L=1024 (its element-wise maxima, 2.7e-3 on outputs of size ~50,
# sit on a few elements near cancellation). The kernel sums in another order, so it is held to 5x
# the worst of these; a wrong tile, mask or state is an O(1) relative error.
LARGE_CHUNK_RELATIVE_ERROR = 5e-4


@pytest.mark.gpu
def test_chunk_of_128_on_the_gpu(make_inputs):
    check("triton", "mlstm", make_inputs(1, 2, 2048, 128, 256, device="cuda"), chunk_size=128)


@pytest.mark.gpu
@pytest.mark.parametrize("chunk_size", [512, 1024])
def test_large_chunks_on_the_gpu(make_inputs, chunk_size):
    inputs = make_inputs(1, 2, 2048, 128, 256, device="cuda")(torch.Generator().manual_seed(0))
    grad = torch.randn(1, 2, 2048, 256, generator=torch.Generator().manual_seed(1)).cuda()

    def run(fn, dtype):
        x = {n: t.detach().to(dtype).requires_grad_() for n, t in inputs.items()}
        out = fn(**x)
        out.backward(grad.to(dtype))
        return {
            "out": out.detach().double(),
            **{f"grad[{n}]": t.grad.double() for n, t in x.items()},
        }

    expected = run(mlstm_parallel, torch.float64)
    got = run(
        functools.partial(mlstm_chunkwise, chunk_size=chunk_size, backend="triton"), torch.float32
    )
    errors = {n: ((got[n] - expected[n]).norm() / expected[n].norm()).item() for n in expected}
    assert all(e <= LARGE_CHUNK_RELATIVE_ERROR for e in errors.values()), errors


@pytest.mark.parametrize("variant", ["mlstm", "sig"])
def test_forgetting_every_step_stays_exact(triton_backend, make_inputs, variant):
    """Forget gates near 0 (logσ(f) ≈ -30 per step): inside a chunk the masked (future)
    log-weights reach +30 per step of distance and must never be exponentiated (inf, and an
    overflow warning under the interpreter)."""
    device = device_for_backend(triton_backend)
    make = make_inputs(1, 2, 40, 8, 8, sig=variant == "sig", state=True, device=device)

    def forgetting(generator: torch.Generator) -> dict:
        inputs = make(generator)
        inputs["f"] = (inputs["f"].detach() - 32.0).requires_grad_()
        return inputs

    check(triton_backend, variant, forgetting, return_last_state=True)


def test_low_precision_backward_uses_the_unrounded_output(triton_backend):
    """float16, two keys of equal weight: ``h_1 = (v_0 + v_1) / 2`` is their mean, so
    ``∂L/∂q_1 = 0`` exactly. The kernel forms it as ``Σ_j (dh·v_j / den - dh·h / den) k_j``, where
    every term is exact in float32 (den = 2, weights 1, eps 0): only an ``h`` rounded to float16
    (relative error 2^-11) leaves a residue, about 1e-4 here."""
    device = device_for_backend(triton_backend)
    generator = torch.Generator().manual_seed(0)
    DQK = DV = 16
    q, k = torch.zeros(1, 1, 2, DQK), torch.zeros(1, 1, 2, DQK)
    q[..., 1, 0], k[..., 0] = 4.0, 1.0  # q̂_1·k_j = 1 for both keys
    v = torch.randn(1, 1, 2, DV, generator=generator) * torch.tensor([1.0, 1e-2])[:, None]
    i, f = torch.zeros(1, 1, 2), torch.full((1, 1, 2), 30.0)  # logσ(30) = -9e-14: no forgetting
    dh = torch.randn(1, 1, 2, DV, generator=generator).half()
    leaves = [x.half().to(device).requires_grad_() for x in (q, k, v, i, f)]
    h = mlstm_chunkwise(*leaves, chunk_size=16, eps=0.0, backend=triton_backend)
    h.backward(dh.to(device))
    expected = torch.zeros(DQK, dtype=torch.float64)
    torch.testing.assert_close(leaves[0].grad[0, 0, 1].double().cpu(), expected, atol=1e-6, rtol=0)
