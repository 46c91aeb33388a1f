"""The PyTorch forms against each other: chunkwise and recurrent vs the parallel form in float64.

Tolerances (float32 implementation vs a float64 oracle): outputs ``atol = rtol = 1e-4``, gradients
``atol = rtol = 1e-3``, the bounds the specification sets; a float32 chunkwise pass reorders sums
of at most a few hundred terms of size O(1), which stays orders of magnitude below them.
"""

from __future__ import annotations

import functools

import pytest
import torch

from kernels_common.testing import Tolerance, assert_kernel_matches
from tfla_mlstm import (
    default_chunk_size,
    mlstm_chunkwise,
    mlstm_parallel,
    mlstm_recurrent,
    mlstmsig_chunkwise,
    mlstmsig_parallel,
    mlstmsig_recurrent,
)

OUT_TOL = Tolerance(atol=1e-4, rtol=1e-4)
GRAD_TOL = Tolerance(atol=1e-3, rtol=1e-3)

VARIANTS = {
    "mlstm": (mlstm_parallel, mlstm_recurrent, mlstm_chunkwise, {}),
    "sig": (mlstmsig_parallel, mlstmsig_recurrent, mlstmsig_chunkwise, {"normalize": True}),
    "sig-unnormalized": (
        mlstmsig_parallel,
        mlstmsig_recurrent,
        mlstmsig_chunkwise,
        {"normalize": False},
    ),
}
# (B, NH, S, DQK, DV, chunk_size): S = 1, S not a multiple of the chunk, DQK != DV, B = 1 and 3
CASES = [
    (1, 1, 1, 8, 8, 16),
    (3, 2, 17, 8, 12, 16),
    (1, 2, 200, 16, 8, 64),
    (2, 1, 200, 8, 16, 256),
    (1, 1, 130, 12, 4, 128),
]


def check(reference, implementation, inputs, **options):
    return assert_kernel_matches(
        functools.partial(reference, **options),
        functools.partial(implementation, **options),
        inputs,
        reference_dtype=torch.float64,
        tolerances=OUT_TOL,
        grad_tolerances=GRAD_TOL,
    )


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("with_state", [False, True], ids=["no-state", "state"])
def test_chunkwise_equals_parallel(make_inputs, variant, case, with_state):
    parallel, _, chunkwise, options = VARIANTS[variant]
    *sizes, chunk_size = case
    report = check(
        parallel,
        functools.partial(chunkwise, chunk_size=chunk_size, backend="reference"),
        make_inputs(*sizes, sig=variant != "mlstm", state=with_state),
        return_last_state=True,
        **options,
    )
    assert "grad[f]" in {c.name for c in report.comparisons}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("with_state", [False, True], ids=["no-state", "state"])
def test_recurrent_equals_parallel(make_inputs, variant, with_state):
    parallel, recurrent, _, options = VARIANTS[variant]
    check(
        parallel,
        recurrent,
        make_inputs(2, 2, 23, 8, 6, sig=variant != "mlstm", state=with_state),
        return_last_state=True,
        **options,
    )


@pytest.mark.parametrize("variant", ["mlstm", "sig"])
def test_large_gates_stay_finite_and_exact(make_inputs, variant):
    """|i|, |f| up to ~20: the stabilized forms stay finite and agree with the float64 oracle."""
    parallel, _, chunkwise, options = VARIANTS[variant]
    make = make_inputs(1, 2, 70, 8, 8, sig=variant != "mlstm", gate_scale=8.0)
    inputs = make(torch.Generator().manual_seed(3))
    assert inputs["i"].abs().max() > 15
    h = chunkwise(**inputs, chunk_size=32, backend="reference", **options)
    h.sum().backward()
    assert torch.isfinite(h).all()
    assert all(torch.isfinite(inputs[n].grad).all() for n in "qkvif")
    check(parallel, functools.partial(chunkwise, chunk_size=32, backend="reference"), make)


@pytest.mark.parametrize("S", [16, 32, 64, 128, 256, 8192])
def test_default_chunk_size_is_the_anchors_where_the_anchor_has_one(S):
    """mlstm-kernels' heuristic (defined for S = 16, 32, 64 and multiples of 128)."""
    heuristics = pytest.importorskip("mlstm_kernels.triton.chunkwise.kernel_param_heuristics")
    assert (
        default_chunk_size(S)
        == heuristics.select_heuristic_xl_chunk_kernel_params(S).chunk_size_intra
    )


@pytest.mark.parametrize(("S", "chunk_size"), [(1, 16), (20, 32), (64, 64), (100, 128), (300, 128)])
def test_chunkwise_ops_default_to_the_chunk_size_heuristic(
    make_inputs, chunk_sizes_seen, S, chunk_size
):
    """Without ``chunk_size`` both chunkwise ops run ``default_chunk_size(S)``: the chunk that
    reaches the chunkwise form is recorded."""
    assert default_chunk_size(S) == chunk_size
    x = make_inputs(1, 1, S, 8, 4)(torch.Generator().manual_seed(0))
    mlstm_chunkwise(**x, backend="reference")
    mlstmsig_chunkwise(**x, backend="reference")
    mlstm_chunkwise(**x, chunk_size=16, backend="reference")
    assert chunk_sizes_seen == [chunk_size, chunk_size, 16]
