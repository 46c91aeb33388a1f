"""Importing the package neither imports Triton nor initialises CUDA."""

from __future__ import annotations

from kernels_common.testing import import_footprint


def test_import_is_lean():
    footprint = import_footprint("import torch, tfla_mlstm", watch=["triton", "mlstm_kernels"])
    assert footprint == {"triton": False, "mlstm_kernels": False, "cuda": False}
