"""Helpers shared by the benchmarks and ``reproduce``: throughput timing and the difflogic anchor.

The anchor (Petersen et al.'s ``difflogic``) does not build against a CPU-only torch (its setup
compiles a CUDA extension), so :func:`load_difflogic` fetches its source distribution from PyPI
at run time into a temporary folder and imports its pure-Python modules with a stand-in for the
missing ``difflogic_cuda`` module. Nothing of it is stored in this package.
"""

from __future__ import annotations

import json
import logging
import sys
import tarfile
import tempfile
import time
import types
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["copy_into_difflogic", "images_per_second", "load_difflogic"]

DIFFLOGIC_JSON = "https://pypi.org/pypi/difflogic/json"


def images_per_second(fn: Callable[[], Any], batch: int, *, repeat: int = 5) -> float:
    """``batch`` divided by the median time of ``repeat`` calls of ``fn`` (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return batch / sorted(times)[len(times) // 2]


def load_difflogic(version: str = "0.1.0", cache: str | Path | None = None) -> types.ModuleType:
    """Import difflogic's Python code from its PyPI sdist (downloaded once into ``cache``).

    Raises:
        RuntimeError: the download or import failed (no network, PyPI changed); the message says
            why, so a benchmark can skip the anchor's columns.
    """
    if "difflogic" in sys.modules:
        return sys.modules["difflogic"]
    root = Path(cache) if cache else Path(tempfile.gettempdir()) / "dlgn-gumbel-anchor"
    source = root / f"difflogic-{version}"
    try:
        if not (source / "difflogic" / "__init__.py").is_file():
            root.mkdir(parents=True, exist_ok=True)
            with urllib.request.urlopen(DIFFLOGIC_JSON, timeout=30) as response:
                files = json.load(response)["releases"][version]
            sdist = next(f for f in files if f["packagetype"] == "sdist")
            archive = root / sdist["filename"]
            urllib.request.urlretrieve(sdist["url"], archive)
            with tarfile.open(archive) as tar:
                tar.extractall(root, filter="data")
        # the CUDA extension is absent on a CPU build; its Python modules only import the name
        sys.modules.setdefault("difflogic_cuda", types.ModuleType("difflogic_cuda"))
        sys.path.insert(0, str(source))
        import difflogic
    except Exception as error:  # network, PyPI layout, import errors: all mean "no anchor"
        raise RuntimeError(f"could not load difflogic {version} from PyPI: {error}") from error
    finally:
        if str(source) in sys.path:
            sys.path.remove(str(source))
    return difflogic


def copy_into_difflogic(net, difflogic: types.ModuleType):
    """A difflogic ``Sequential(LogicLayer..., GroupSum)`` with ``net``'s connections and logits.

    difflogic's python LogicLayer uses the same 16-gate order and relaxations, so both networks
    compute the same function (a cross-check of the two implementations).
    """
    import torch

    layers: list[torch.nn.Module] = []
    for layer in net.layers:
        peer = difflogic.LogicLayer(
            layer.in_dim, layer.out_dim, device="cpu", implementation="python"
        )
        with torch.no_grad():
            peer.weights.copy_(layer.weights)
        # int32 indices: difflogic prints a line on every forward with int64 ones
        peer.indices = (layer.idx_a.int(), layer.idx_b.int())
        layers.append(peer)
    layers.append(difflogic.GroupSum(net.config.num_classes, net.config.tau, device="cpu"))
    return torch.nn.Sequential(*layers)
