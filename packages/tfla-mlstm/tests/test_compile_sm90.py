"""The TFLA kernels compiled for an H200 (sm_90) on a CPU, at the GPU benchmark's head dimensions
(DQK 128, DV 256, chunk 128; ``kernels_common.compile_check``, nothing runs): every kernel fits
the chip, 16-bit products run on tensor cores and float32 ones in IEEE float32, and the chunk-state
kernels compile to the same shared memory, warps and stages as mlstm-kernels' own."""

from __future__ import annotations

import importlib.util

import pytest

from kernels_common.compile_check import compile_workload

pytest.importorskip("triton")

WORKLOAD = "tfla_mlstm.bench:kernel_workload"
KERNELS = ["_chunk_states_kernel", "_chunk_output_kernel", "_normalizer_grad_kernel", "_dq_kernel",
           "_chunk_states_bwd_kernel", "_dk_kernel", "_dv_kernel"]  # fmt: skip
# ours -> the anchor's kernel of the same step (forward states, and dC)
STATE_KERNELS = {
    "_chunk_states_kernel": "mlstm_siging_chunkwise__recurrent_fw_C_kernel",
    "_chunk_states_bwd_kernel": "mlstm_siging_chunkwise__recurrent_bw_dC_kernel",
}


@pytest.fixture(scope="module")
def compiled_bf16():
    return compile_workload(WORKLOAD, dtype="bfloat16", variant="mlstmsig")


@pytest.fixture(scope="module")
def bf16(compiled_bf16):
    return {k.name: k for k in compiled_bf16}


def test_every_16_bit_kernel_fits_and_runs_its_products_on_tensor_cores(compiled_bf16):
    # forward and backward, each kernel once (the backward's state recompute is the forward's
    # kernel with the same layout: one compile)
    assert [k.name for k in compiled_bf16] == KERNELS
    for kernel in compiled_bf16:
        assert kernel.fits, kernel.label()
        assert kernel.tensor_cores, kernel.label()


def test_float32_kernels_fit_and_never_use_tensor_cores():
    kernels = compile_workload(WORKLOAD, dtype="float32", variant="mlstmsig")
    assert [k.name for k in kernels] == KERNELS
    for kernel in kernels:
        assert kernel.fits, kernel.label()
        assert not kernel.tensor_cores, kernel.label()


@pytest.mark.skipif(
    importlib.util.find_spec("mlstm_kernels") is None, reason="mlstm-kernels is not installed"
)
def test_state_kernels_compile_like_the_anchors(bf16):
    anchor = {
        k.name: k
        for k in compile_workload(WORKLOAD, dtype="bfloat16", variant="mlstmsig", anchor=True)
    }
    for ours, theirs in STATE_KERNELS.items():
        mine, reference = bf16[ours], anchor[theirs]
        assert mine.constants["BLOCK_QK"] == reference.constants["siz_b_DHQK"] == 64
        assert mine.constants["BLOCK_V"] == reference.constants["siz_b_DHHV"] == 64
        # the same warpgroup MMA, warps and stages; the same staged 64-wide tiles of a 128-step
        # block, up to one 128-step float32 vector (512 bytes: our dC kernel stages that much more
        # than the anchor's; the forward kernels stage the same)
        assert mine.wgmma > 0
        assert reference.wgmma > 0
        assert (mine.num_warps, mine.num_stages) == (reference.num_warps, reference.num_stages)
        assert abs(mine.shared_bytes - reference.shared_bytes) <= 128 * 4, ours
        assert not mine.spills, ours
