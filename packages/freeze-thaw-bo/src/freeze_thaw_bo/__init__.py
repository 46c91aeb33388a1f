"""Cost-sensitive freeze-thaw Bayesian optimization (CFBO, NeurIPS 2025).

* :class:`Utility` U(b, ỹ) = ỹ − α·(b/B)^c and :func:`fit_utility` (Bradley–Terry on a user's
  pairwise preferences);
* :class:`CFBO`: thaw the configuration whose sampled continuations raise the utility most, stop
  when the estimated regret passes an adaptive threshold; an ask/tell API with explicit freeze and
  thaw, several workers, save and resume;
* surrogates: a learning-curve PFN trained here on CPU from an FT-PFN-style prior (shipped
  weights), DPL and a freeze-thaw GP;
* baselines: random search, successive halving, Hyperband, ASHA, DyHPO-, ifBO- and DPL-style
  freeze-thaw;
* :func:`run_on_table`: replay any method on real learning-curve tables (benchdata) and score it
  by normalized regret of utility.

Importing this package never imports Triton, scipy, Optuna, Syne Tune or Ray, and never
initialises CUDA.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from freeze_thaw_bo.baselines import (
    ASHA,
    DPLFreezeThaw,
    DyHPO,
    Hyperband,
    IfBO,
    RandomSearch,
    SuccessiveHalving,
)
from freeze_thaw_bo.benchmark import (
    CurveTable,
    RunResult,
    make_optimizer,
    oracle_bounds,
    rescore,
    run_on_table,
)
from freeze_thaw_bo.cfbo import CFBO, adaptive_threshold, utility_acquisition
from freeze_thaw_bo.methods import METHODS, method_class
from freeze_thaw_bo.optimizer import FreezeThawOptimizer, Suggestion, load_optimizer
from freeze_thaw_bo.pfn.checkpoint import load_default_pfn, load_pfn, save_pfn
from freeze_thaw_bo.pfn.model import LearningCurvePFN, PFNConfig
from freeze_thaw_bo.pfn.train import FinetuneConfig, TrainConfig, finetune_pfn, train_pfn
from freeze_thaw_bo.space import Categorical, Float, Integer, SearchSpace
from freeze_thaw_bo.surrogates.base import CurveObservations, CurveSurrogate
from freeze_thaw_bo.surrogates.dpl import DPLSurrogate
from freeze_thaw_bo.surrogates.gp import FreezeThawGPSurrogate
from freeze_thaw_bo.surrogates.pfn import PFNSurrogate
from freeze_thaw_bo.utility import Preference, Utility, fit_utility

try:
    __version__ = _metadata.version("freeze-thaw-bo")
except _metadata.PackageNotFoundError:  # imported from a source tree (PYTHONPATH), not installed
    __version__ = "0.0.0+source"

__all__ = [
    "ASHA",
    "CFBO",
    "METHODS",
    "Categorical",
    "CurveObservations",
    "CurveSurrogate",
    "CurveTable",
    "DPLFreezeThaw",
    "DPLSurrogate",
    "DyHPO",
    "FinetuneConfig",
    "Float",
    "FreezeThawGPSurrogate",
    "FreezeThawOptimizer",
    "Hyperband",
    "IfBO",
    "Integer",
    "LearningCurvePFN",
    "PFNConfig",
    "PFNSurrogate",
    "Preference",
    "RandomSearch",
    "RunResult",
    "SearchSpace",
    "SuccessiveHalving",
    "Suggestion",
    "TrainConfig",
    "Utility",
    "__version__",
    "adaptive_threshold",
    "finetune_pfn",
    "fit_utility",
    "load_default_pfn",
    "load_optimizer",
    "load_pfn",
    "make_optimizer",
    "method_class",
    "oracle_bounds",
    "rescore",
    "run_on_table",
    "save_pfn",
    "train_pfn",
    "utility_acquisition",
]
