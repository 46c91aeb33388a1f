"""The flashdp kernels compiled for an H200 (sm_90) on a CPU, at GPT-2 small's shapes: 16-bit
products run on tensor cores, float32 products in IEEE float32, and every autotune config fits the
chip without spilling registers (``kernels_common.compile_check``; nothing runs)."""

from __future__ import annotations

import pytest

from kernels_common.compile_check import compile_workload

pytest.importorskip("triton")

PRODUCTS = {"_norm2_kernel", "_clipped_sum_kernel", "_store_kernel"}
CONFIGS = {
    "_norm2_kernel": 5,
    "_clipped_sum_kernel": 5,
    "_store_kernel": 5,
    "_weighted_sum_kernel": 3,
}


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def compiled(request):
    """bf16: every linear layer of GPT-2 small (whether a config spills depends on the shape's
    specialisation: the LM head's 50,257 outputs are not a multiple of 16); float32: the MLP's
    up-projection."""
    layers = None if request.param == "bfloat16" else ["up"]
    kernels = compile_workload(
        "flashdp.benchmark:kernel_workload", dtype=request.param, layers=layers
    )
    return request.param, kernels


def test_every_config_of_every_kernel_is_compiled(compiled):
    _, kernels = compiled
    for name, count in CONFIGS.items():
        tiles = {(k.constants["BLOCK_O"], k.constants["BLOCK_I"], k.num_warps)
                 for k in kernels if k.name == name}  # fmt: skip
        assert len(tiles) == count, name


def test_products_run_on_tensor_cores_only_for_16_bit_inputs(compiled):
    dtype, kernels = compiled
    for kernel in kernels:
        if kernel.name in PRODUCTS and dtype == "bfloat16":
            assert kernel.tensor_cores, kernel.label()
            # Hopper's warpgroup MMA from 64-row tiles on; the 32×32 config uses mma.sync
            assert (kernel.wgmma > 0) == (kernel.constants["BLOCK_O"] >= 64), kernel.label()
        else:  # float32 products in IEEE float32; the weighted sum has no product
            assert not kernel.tensor_cores, kernel.label()


def test_every_config_fits_the_chip(compiled):
    dtype, kernels = compiled
    for kernel in kernels:
        assert kernel.fits, kernel.label()
        if dtype == "bfloat16":
            assert not kernel.spills, kernel.label()
