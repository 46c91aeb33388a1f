"""Importing the package neither imports Triton nor initialises CUDA."""

from __future__ import annotations

import subprocess
import sys


def test_import_is_lean():
    probe = (
        "import sys, torch, tfla_mlstm\n"
        "print('triton' in sys.modules, 'mlstm_kernels' in sys.modules, "
        "torch.cuda.is_initialized())"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]
