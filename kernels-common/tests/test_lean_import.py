"""Importing the library, and dispatching on CPU tensors, neither imports Triton nor uses CUDA."""

from __future__ import annotations

import pytest

from kernels_common.testing import import_footprint

PROBE = """
import torch
import kernels_common
from kernels_common.swiglu import swiglu
import kernels_common.bench, kernels_common.report, kernels_common.results, kernels_common.testing
swiglu(torch.ones(3), torch.ones(3))
"""


def test_import_is_lean():
    footprint = import_footprint(PROBE, watch=["triton", "matplotlib"])
    assert footprint == {"triton": False, "matplotlib": False, "cuda": False}


def test_import_footprint_sees_what_the_code_imports():
    assert import_footprint("import colorsys, torch", watch=["colorsys", "wave"]) == {
        "colorsys": True,
        "wave": False,
        "cuda": False,
    }
    with pytest.raises(RuntimeError, match="ModuleNotFoundError"):
        import_footprint("import no_such_module_here")
