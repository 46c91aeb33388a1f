"""One torch thread for the whole session: the graphs here are tiny, and on a shared 2-core
machine a second thread only spins (gradient matching ran 40x slower with two). Puts the test
helper modules on the path (pytest runs with ``--import-mode=importlib``)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).parent))
