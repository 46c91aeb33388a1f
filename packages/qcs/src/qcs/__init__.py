"""Quadratic coreset selection (QCS) for instruction tuning, at the sequence and token level.

``qcs.select(pool, model, budget=0.05, token_ratio=0.5, validation=target)`` learns which
instruction-response pairs to keep (Bernoulli sequence indicators) and how much each kept
response token counts (elastic weights ``{ε, 1 − ε}``), by hierarchical policy gradients on the
validation loss after LoRA training on the weighted coreset: no back-propagation through the
inner training, no Hessian. LESS, IFD, random and full-data baselines run through the same call;
``Workbench.evaluate`` judges every selection by the same fine-tuning.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from qcs.api import METHODS, Workbench, noise_metrics, select
from qcs.baselines import (
    LessConfig,
    RademacherProjector,
    full_selection,
    ifd_scores,
    ifd_selection,
    less_scores,
    less_selection,
    random_selection,
)
from qcs.data import (
    FORMATS,
    InstructionPair,
    TokenizedPairs,
    arithmetic_pairs,
    extract_answer,
    fit_pairs,
    read_pairs,
    sharegpt_pairs,
    tokenize_pairs,
)
from qcs.lm import LoraSettings, ResponseScorer, add_lora, load_model
from qcs.noise import SEQUENCE_NOISE, plant_noise
from qcs.policy import (
    BASELINES,
    PolicyDraw,
    elastic_weights,
    hierarchical_gradient,
    project_budget,
    sample_policy,
)
from qcs.selection import Selection, budget_count
from qcs.solver import QCSConfig, run_qcs
from qcs.train import TrainConfig, exact_match, finetune

try:
    __version__ = _metadata.version("qcs")
except _metadata.PackageNotFoundError:  # imported from a source tree (PYTHONPATH), not installed
    __version__ = "0.0.0+source"

__all__ = [
    "BASELINES",
    "FORMATS",
    "METHODS",
    "SEQUENCE_NOISE",
    "InstructionPair",
    "LessConfig",
    "LoraSettings",
    "PolicyDraw",
    "QCSConfig",
    "RademacherProjector",
    "ResponseScorer",
    "Selection",
    "TokenizedPairs",
    "TrainConfig",
    "Workbench",
    "__version__",
    "add_lora",
    "arithmetic_pairs",
    "budget_count",
    "elastic_weights",
    "exact_match",
    "extract_answer",
    "finetune",
    "fit_pairs",
    "full_selection",
    "hierarchical_gradient",
    "ifd_scores",
    "ifd_selection",
    "less_scores",
    "less_selection",
    "load_model",
    "noise_metrics",
    "plant_noise",
    "project_budget",
    "random_selection",
    "read_pairs",
    "run_qcs",
    "sample_policy",
    "select",
    "sharegpt_pairs",
    "tokenize_pairs",
]
