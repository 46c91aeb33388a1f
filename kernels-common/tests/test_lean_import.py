"""Importing the library, and dispatching on CPU tensors, neither imports Triton nor uses CUDA."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import sys
import torch
import kernels_common
from kernels_common.swiglu import swiglu
import kernels_common.bench, kernels_common.report, kernels_common.results, kernels_common.testing
swiglu(torch.ones(3), torch.ones(3))
print("triton" in sys.modules, torch.cuda.is_initialized(), "matplotlib" in sys.modules)
"""


def test_import_is_lean():
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
    )
    assert result.stdout.split() == ["False", "False", "False"]
