"""PostNAS: the search that designs a hybrid from a pretrained full-attention model.

1. :class:`SuperNetwork` + :func:`train_supernet`: every layer holds its attention and a linear
   block; paths (which layers keep attention) are sampled while the linear blocks distil.
2. :func:`search_placement`: beam search of the attention placement on probes
   (:func:`default_probes`, :func:`answer_probe`) scored with the super-network's weights.
3. :func:`select_block`: linear-attention candidates (:data:`LINEAR_BLOCKS`) at a fixed placement.
4. :func:`search_hardware`: JetBlock shapes of one recurrent-state size, by measured throughput
   and quality; its Pareto front.

The names load on first access (they import transformers), so ``import jet_nemotron.postnas``
stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LINEAR_BLOCKS": "jet_nemotron.postnas.blocks",
    "build_linear_block": "jet_nemotron.postnas.blocks",
    "state_numel": "jet_nemotron.postnas.blocks",
    "JetShape": "jet_nemotron.postnas.hardware",
    "HardwareSearch": "jet_nemotron.postnas.hardware",
    "plot_pareto": "jet_nemotron.postnas.hardware",
    "search_hardware": "jet_nemotron.postnas.hardware",
    "state_size_grid": "jet_nemotron.postnas.hardware",
    "Probe": "jet_nemotron.postnas.probes",
    "ProbeScore": "jet_nemotron.postnas.probes",
    "answer_probe": "jet_nemotron.postnas.probes",
    "default_probes": "jet_nemotron.postnas.probes",
    "score_probe": "jet_nemotron.postnas.probes",
    "PlacementEvaluator": "jet_nemotron.postnas.search",
    "PlacementSearch": "jet_nemotron.postnas.search",
    "beam_search": "jet_nemotron.postnas.search",
    "search_placement": "jet_nemotron.postnas.search",
    "BlockResult": "jet_nemotron.postnas.selection",
    "select_block": "jet_nemotron.postnas.selection",
    "SuperNetwork": "jet_nemotron.postnas.supernet",
    "SupernetTrainConfig": "jet_nemotron.postnas.supernet",
    "from_checkpoint": "jet_nemotron.postnas.supernet",
    "train_supernet": "jet_nemotron.postnas.supernet",
    "uniform_placement": "jet_nemotron.postnas.supernet",
}


def __getattr__(name: str) -> Any:
    """The PostNAS API, imported on first access."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jet_nemotron.postnas' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
