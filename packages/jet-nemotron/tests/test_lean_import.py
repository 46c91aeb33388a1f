"""Importing the package imports neither Triton, transformers nor FLA, and initialises no CUDA."""

from __future__ import annotations

from kernels_common.testing import import_footprint


def test_import_is_lean():
    footprint = import_footprint(
        "import torch, jet_nemotron", watch=["triton", "transformers", "fla"]
    )
    assert footprint == {"triton": False, "transformers": False, "fla": False, "cuda": False}


def test_models_load_on_first_access():
    import jet_nemotron
    from jet_nemotron.models.modeling import HybridForCausalLM

    assert jet_nemotron.HybridForCausalLM is HybridForCausalLM
