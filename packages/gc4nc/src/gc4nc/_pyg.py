"""PyTorch Geometric, imported on first use (its import takes seconds: `import gc4nc` stays free
of it). `torch_geometric` scripts a few classes with `torch.jit.script` at import, which torch
2.10+ flags as deprecated; that warning is about PyG's internals, not the caller, so it is
silenced here, once."""

from __future__ import annotations

import warnings


def import_pyg():
    """`torch_geometric`, imported (idempotent)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r".*torch\.jit\.script.* deprecated", category=DeprecationWarning
        )
        import torch_geometric

    return torch_geometric
