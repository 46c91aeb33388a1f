"""Scaling laws for LLM pre-training, from three NeurIPS 2025 papers.

* :mod:`scaling_laws.lr_annealing`: the loss curve under any learning-rate schedule,
  ``L(s) = L0 + A·S1^(−α) − C·S2`` (Tissue et al.), with schedule builders in
  :mod:`scaling_laws.schedules`;
* :mod:`scaling_laws.power_lines`: AdamW timescale τ = B/(ηλD), τ_opt = c·(D/N)^m, optimal weight
  decay, B_opt and B_crit power laws, Pareto fronts (Bergsma et al.);
* :mod:`scaling_laws.diloco`: a DiLoCo trainer on torch.distributed with a data-parallel baseline,
  exact checkpoints, and the paper's laws f(N) = A·N^α, f(N, M) = A·N^α·M^β (Charles et al.).

Importing this package never imports Triton or initialises CUDA.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from scaling_laws import power_lines, schedules
from scaling_laws.diloco import (
    DiLoCoConfig,
    DiLoCoTrainer,
    fit_joint_law,
    fit_model_size_law,
    launch_local,
)
from scaling_laws.lr_annealing import (
    AnnealingCurve,
    LRAnnealingLaw,
    areas,
    best_wsd_fraction,
    compare_schedules,
    fit,
    relative_error,
    relative_errors,
)
from scaling_laws.power_law import PowerLaw, fit_power_law
from scaling_laws.power_lines import (
    SweepRecord,
    fit_tau_law,
    optimal_weight_decay,
    pareto_front,
    timescale,
)

try:
    __version__ = _metadata.version("scaling-laws")
except _metadata.PackageNotFoundError:  # imported from a source tree (PYTHONPATH), not installed
    __version__ = "0.0.0+source"

__all__ = [
    "AnnealingCurve",
    "DiLoCoConfig",
    "DiLoCoTrainer",
    "LRAnnealingLaw",
    "PowerLaw",
    "SweepRecord",
    "__version__",
    "areas",
    "best_wsd_fraction",
    "compare_schedules",
    "fit",
    "fit_joint_law",
    "fit_model_size_law",
    "fit_power_law",
    "fit_tau_law",
    "launch_local",
    "optimal_weight_decay",
    "pareto_front",
    "power_lines",
    "relative_error",
    "relative_errors",
    "schedules",
    "timescale",
]
