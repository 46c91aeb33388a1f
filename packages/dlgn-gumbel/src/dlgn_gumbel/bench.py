"""Helpers shared by the benchmarks and ``reproduce``: throughput timing and the difflogic anchor.

The anchor (Petersen et al.'s ``difflogic``) does not build against a CPU-only torch (its setup
compiles a CUDA extension), so :func:`load_difflogic` fetches its source distribution from PyPI
at run time into a temporary folder and imports its pure-Python modules with a stand-in for the
missing ``difflogic_cuda`` module. Nothing of it is stored in this package. On a CUDA machine,
building the extension in that folder (``python setup.py build_ext --inplace``) makes
:func:`load_difflogic` import the real one, and ``copy_into_difflogic(..., implementation="cuda")``
then gives the anchor's own CUDA kernels.
"""

from __future__ import annotations

import importlib
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

__all__ = ["copy_into_difflogic", "difflogic_has_cuda", "images_per_second", "load_difflogic"]

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
        sys.path.insert(0, str(source))
        try:  # the CUDA extension, where it was built in place (see the module docstring)
            importlib.import_module("difflogic_cuda")
        except ImportError:  # a CPU build: its Python modules only import the name
            sys.modules["difflogic_cuda"] = types.ModuleType("difflogic_cuda")
        import difflogic
    except Exception as error:  # network, PyPI layout, import errors: all mean "no anchor"
        raise RuntimeError(f"could not load difflogic {version} from PyPI: {error}") from error
    finally:
        if str(source) in sys.path:
            sys.path.remove(str(source))
    return difflogic


def difflogic_has_cuda() -> bool:
    """Whether the loaded difflogic runs its own CUDA extension (not the CPU stand-in)."""
    return hasattr(sys.modules.get("difflogic_cuda"), "forward")


def copy_into_difflogic(net, difflogic: types.ModuleType, implementation: str = "python"):
    """A difflogic ``Sequential(LogicLayer..., GroupSum)`` with ``net``'s connections and logits.

    difflogic's LogicLayer uses the same 16-gate order and relaxations, so both networks compute
    the same function (a cross-check of the two implementations). ``implementation="cuda"`` builds
    the anchor's CUDA layers on the GPU (needs :func:`difflogic_has_cuda`); ``"python"`` its
    PyTorch layers on the CPU (move them with ``.to``).
    """
    import torch

    if implementation not in ("python", "cuda"):
        raise ValueError(f"implementation must be 'python' or 'cuda', got {implementation!r}")
    if implementation == "cuda" and not difflogic_has_cuda():
        raise RuntimeError("difflogic's CUDA extension is not built (see load_difflogic)")
    device = "cuda" if implementation == "cuda" else "cpu"
    layers: list[torch.nn.Module] = []
    for layer in net.layers:
        peer = difflogic.LogicLayer(
            layer.in_dim, layer.out_dim, device=device, implementation=implementation
        )
        with torch.no_grad():
            peer.weights.copy_(layer.weights)
        if implementation == "cuda":
            a, b = layer.idx_a.long().to(device), layer.idx_b.long().to(device)
            peer.indices = (a, b)
            peer.given_x_indices_of_y_start, peer.given_x_indices_of_y = _readers_of_inputs(
                a, b, layer.in_dim
            )
        else:  # int32 indices: difflogic prints a line on every forward with int64 ones
            peer.indices = (layer.idx_a.int(), layer.idx_b.int())
        layers.append(peer)
    layers.append(difflogic.GroupSum(net.config.num_classes, net.config.tau, device=device))
    return torch.nn.Sequential(*layers)


def _readers_of_inputs(a, b, in_dim: int):
    """difflogic's CUDA backward index: for each input x, the neurons y reading it (CSR form).

    Neuron y appears in x's list once for ``a[y] == x`` and once for ``b[y] == x``, in increasing
    y, as difflogic's own constructor lists them: a stable sort of the interleaved (a, b) pairs.
    """
    import torch

    inputs = torch.stack([a, b], dim=1).reshape(-1)
    neurons = torch.arange(a.numel(), device=a.device).repeat_interleave(2)
    order = torch.sort(inputs, stable=True).indices
    counts = torch.bincount(inputs, minlength=in_dim)
    start = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    return start, neurons[order]
