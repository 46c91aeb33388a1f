"""Puts the test helpers on the path (pytest runs with ``--import-mode=importlib``), and runs the
layers on the PyTorch reference unless a test names a backend: under ``TRITON_INTERPRET=1`` (the
nox session) every automatic choice would otherwise be the Triton interpreter, which is exact but
far too slow to train with. The kernel tests pass their backend explicitly."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def reference_backend_by_default(monkeypatch):
    monkeypatch.setenv("KERNELS_COMMON_BACKEND", "reference")
