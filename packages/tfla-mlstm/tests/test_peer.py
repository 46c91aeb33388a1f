"""Against the anchor, ``mlstm-kernels``: our chunkwise path equals its native parallel kernels.

Both sides run in float32 on the same inputs; the anchor is the oracle. Tolerances: outputs
``atol = rtol = 1e-4``, gradients ``atol = rtol = 1e-3`` (the specification's bounds; the two
differ only by float32 summation order).
"""

from __future__ import annotations

import functools

import pytest

from kernels_common.testing import Tolerance, assert_kernel_matches
from tfla_mlstm import mlstm_chunkwise, mlstmsig_chunkwise

native_parallel = pytest.importorskip("mlstm_kernels.torch.parallel.native")
native_siging = pytest.importorskip("mlstm_kernels.torch.parallel.native_siging")

OUT_TOL = Tolerance(atol=1e-4, rtol=1e-4)
GRAD_TOL = Tolerance(atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize(("S", "chunk_size"), [(64, 16), (100, 32), (256, 128)])
def test_mlstm_equals_the_anchors_parallel_kernel(make_inputs, S, chunk_size):
    assert_kernel_matches(
        native_parallel.mlstm_parallel__native_autograd,
        functools.partial(mlstm_chunkwise, chunk_size=chunk_size, backend="reference"),
        make_inputs(2, 2, S, 16, 32),
        tolerances=OUT_TOL,
        grad_tolerances=GRAD_TOL,
    )


@pytest.mark.parametrize("normalize", [True, False])
def test_mlstmsig_equals_the_anchors_sigmoid_gate_kernel(make_inputs, normalize):
    assert_kernel_matches(
        functools.partial(
            native_siging.mlstm_siging_parallel__native_autograd, normalize=normalize
        ),
        functools.partial(
            mlstmsig_chunkwise, chunk_size=32, normalize=normalize, backend="reference"
        ),
        make_inputs(1, 3, 90, 16, 8, sig=True),
        tolerances=OUT_TOL,
        grad_tolerances=GRAD_TOL,
    )
