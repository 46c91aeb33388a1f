"""Puts ``helpers`` on the path (pytest runs with ``--import-mode=importlib``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import CAUSAL, tiny_model


@pytest.fixture(params=CAUSAL)
def causal_lm(request):
    return tiny_model(request.param)
