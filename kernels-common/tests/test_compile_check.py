"""compile_check: kernels compiled for sm_90 without a GPU, against closed-form resources."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kernels_common import __main__ as cli_main
from kernels_common.compile_check import (
    MAX_REGISTERS_PER_THREAD,
    SM90_REGISTERS_PER_SM,
    SM90_SHARED_PER_BLOCK,
    KernelResources,
    compile_only,
    compile_workload,
    resources_table,
)

pytest.importorskip("triton")
WORKLOADS = Path(__file__).parent / "workloads"


@pytest.fixture(scope="module")
def workloads():
    """The compile process imports the workloads folder and whatever this process imports."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", ":".join([str(WORKLOADS), *sys.path]))
        yield


@pytest.fixture(scope="module")
def cases(workloads) -> dict[str, list[KernelResources]]:
    """One compile process for every case of ``compile_cases.every_case``, by kernel name."""
    found: dict[str, list[KernelResources]] = {}
    for kernel in compile_workload("compile_cases:every_case"):
        found.setdefault(kernel.name, []).append(kernel)
    return found


def test_tensor_core_instructions_follow_the_tile_and_dtype(cases):
    wide, narrow, ieee = cases["dot_kernel"]
    assert [k.constants["N"] for k in (wide, narrow, ieee)] == [64, 32, 64]
    # Hopper's warpgroup MMA takes 64-row tiles; a 32-row tile falls back to mma.sync
    assert wide.wgmma > 0
    assert wide.mma == 0
    assert narrow.mma > 0
    assert narrow.wgmma == 0
    # float32 IEEE products never run on tensor cores
    assert not ieee.tensor_cores
    # both 64×64 bf16 operands are staged in shared memory for wgmma: 2·64·64·2 bytes
    assert wide.shared_bytes >= 2 * 64 * 64 * 2
    assert wide.fits
    assert not wide.spills
    assert all(k.arch == 90 and k.num_warps == 4 for k in (wide, narrow, ieee))


def test_spills_when_a_tile_cannot_live_in_registers(cases):
    (held,) = cases["held_kernel"]
    assert held.constants["N"] == 128
    # 128·128 float32 values over 32 threads: 2,048 bytes each, a register file holds 255·4
    assert held.num_warps == 1
    assert held.registers <= MAX_REGISTERS_PER_THREAD
    assert held.spill_stores >= 128 * 128 * 4 // 32 - MAX_REGISTERS_PER_THREAD * 4
    assert held.spills
    assert not held.tensor_cores


def test_every_autotune_config_is_compiled_once(cases):
    # tuned() launches twice: the second launch compiles nothing new
    kernels = cases["scale_kernel"]
    assert [(k.constants["BLOCK"], k.num_warps) for k in kernels] == [(32, 1), (64, 2), (128, 4)]


def test_a_failing_workload_reports_its_error(workloads):
    with pytest.raises(RuntimeError, match="this workload fails"):
        compile_workload("compile_cases:failing")
    with pytest.raises(ValueError, match=r"package\.module:function"):
        compile_workload("compile_cases")


def test_compile_only_refuses_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="compile_workload"), compile_only():
        pass


def _kernel(**overrides) -> KernelResources:
    fields = dict(name="k", constants={"BLOCK": 64, "DTYPE": "bf16", "FLAG": True}, num_warps=4,  # noqa: C408
                  num_stages=2, registers=128, spill_stores=0, spill_loads=0,
                  shared_bytes=64 * 1024, wgmma=2, mma=0)  # fmt: skip
    return KernelResources(**{**fields, **overrides})


def test_fits_is_the_shared_and_register_limits():
    assert _kernel().fits
    assert _kernel(shared_bytes=SM90_SHARED_PER_BLOCK).fits
    assert not _kernel(shared_bytes=SM90_SHARED_PER_BLOCK + 1).fits
    # 255 registers × 8 warps of 32 threads = 65,280 ≤ 65,536; 16 warps do not fit
    assert _kernel(registers=255, num_warps=8).fits
    assert SM90_REGISTERS_PER_SM < 255 * 32 * 16
    assert not _kernel(registers=255, num_warps=16).fits


def test_table_rows():
    table = resources_table([_kernel(), _kernel(name="j", wgmma=0, mma=3, spill_stores=8),
                             _kernel(name="x", wgmma=0, shared_bytes=300 * 1024)])  # fmt: skip
    lines = table.splitlines()
    assert len(lines) == 5
    # booleans are not shown as constants; integers and strings are, sorted
    assert lines[2] == "| k | BLOCK=64, DTYPE=bf16 | 4 | 2 | 128 | 0 | 64.0 | wgmma |"
    assert lines[3] == "| j | BLOCK=64, DTYPE=bf16 | 4 | 2 | 128 | 8 | 64.0 | mma.sync |"
    assert lines[4].endswith("| 300.0 | none (does not fit) |")
    only = resources_table([_kernel()], constants=["BLOCK"]).splitlines()[2]
    assert only.startswith("| k | BLOCK=64 | 4 |")


def test_cli_refuses_kwargs_that_are_not_an_object(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli_main.main(["compile", "compile_cases:dots", "--kwargs", "[1]"])
    assert stopped.value.code == 2
    assert "expected a JSON object" in capsys.readouterr().err
