"""Shared infrastructure of the paper packages.

Backend dispatch, Triton helpers, the kernel test contract, benchmarks and reproduce reports.

Importing this package never imports Triton or initialises CUDA.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from kernels_common.backend import (
    BACKEND_ENV_VAR,
    Backend,
    BackendUnavailableError,
    KernelOp,
    interpreter_enabled,
    resolve_backend,
    triton_available,
)
from kernels_common.bench import (
    Comparison,
    Measurement,
    compare,
    drop_failing,
    hardware_description,
    measure,
)
from kernels_common.memory import PeakMemory, peak_memory
from kernels_common.results import Claim, ReproduceResults
from kernels_common.testing import (
    DEFAULT_TOLERANCES,
    KernelReport,
    Tolerance,
    assert_kernel_matches,
    compare_tensors,
    poison_uninitialized,
)
from kernels_common.triton_utils import (
    autotune,
    cdiv,
    device_guard,
    is_power_of_2,
    next_power_of_2,
    triton_dtype,
)

try:
    __version__ = _metadata.version("kernels-common")
except _metadata.PackageNotFoundError:  # imported from a source tree (PYTHONPATH), not installed
    __version__ = "0.0.0+source"

__all__ = [
    "BACKEND_ENV_VAR",
    "DEFAULT_TOLERANCES",
    "Backend",
    "BackendUnavailableError",
    "Claim",
    "Comparison",
    "KernelOp",
    "KernelReport",
    "Measurement",
    "PeakMemory",
    "ReproduceResults",
    "Tolerance",
    "__version__",
    "assert_kernel_matches",
    "autotune",
    "cdiv",
    "compare",
    "compare_tensors",
    "device_guard",
    "drop_failing",
    "hardware_description",
    "interpreter_enabled",
    "is_power_of_2",
    "measure",
    "next_power_of_2",
    "peak_memory",
    "poison_uninitialized",
    "resolve_backend",
    "triton_available",
    "triton_dtype",
]
