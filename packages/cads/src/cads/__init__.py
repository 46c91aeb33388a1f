"""Computational budget-aware data selection (CADS): choose which training data to use, and how
much, for a given compute budget.

``cads.select(task, budget, method="cads-e")`` learns a selection distribution over a pool's
examples (CADS-E) or sources (CADS-S) by the paper's penalty-based single-level relaxation: one
model trained jointly with the selection, its training loss on each drawn subset pulled towards
the loss the budget can reach at that subset's size, and a Hessian-free policy gradient for the
selection. The conventional solvers it is measured against (Bilevel-CADS, implicit
differentiation) and the classic baselines (random, full data, best source, loss, EL2N, GraNd,
forgetting) run through the same call; ``cads.compare`` judges them all by a fresh model trained
for the same budget.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from cads.api import BILEVEL_METHODS, METHODS, compare, select
from cads.baselines import BASELINE_METHODS, run_baseline, score_examples
from cads.bilevel import implicit_hypergradient, run_bilevel, run_implicit
from cads.budget import ComputeBudget, InnerConfig, InnerLog, count_step_flops, train_under_budget
from cads.config import SelectConfig
from cads.data import IMAGE_SOURCES, TEXT_SOURCES, mixed_fashion_mnist, mixed_text, toy_task
from cads.distributions import BernoulliMasks, TruncatedGaussianRatios, ratios_to_mask
from cads.estimator import score_function_gradient
from cads.models import ByteLM, byte_lm, small_cnn
from cads.penalty import run_cads
from cads.projection import project_budget
from cads.selection import Selection, evaluate_selection, indices_from_probabilities
from cads.surrogate import PAPER_FRACTIONS, LossSurrogate, fit_loss_surrogate
from cads.task import SelectionTask, classification_loss, evaluate, token_loss

try:
    __version__ = _metadata.version("cads")
except _metadata.PackageNotFoundError:  # imported from a source tree (PYTHONPATH), not installed
    __version__ = "0.0.0+source"

__all__ = [
    "BASELINE_METHODS",
    "BILEVEL_METHODS",
    "IMAGE_SOURCES",
    "METHODS",
    "PAPER_FRACTIONS",
    "TEXT_SOURCES",
    "BernoulliMasks",
    "ByteLM",
    "ComputeBudget",
    "InnerConfig",
    "InnerLog",
    "LossSurrogate",
    "SelectConfig",
    "Selection",
    "SelectionTask",
    "TruncatedGaussianRatios",
    "__version__",
    "byte_lm",
    "classification_loss",
    "compare",
    "count_step_flops",
    "evaluate",
    "evaluate_selection",
    "fit_loss_surrogate",
    "implicit_hypergradient",
    "indices_from_probabilities",
    "mixed_fashion_mnist",
    "mixed_text",
    "project_budget",
    "ratios_to_mask",
    "run_baseline",
    "run_bilevel",
    "run_cads",
    "run_implicit",
    "score_examples",
    "score_function_gradient",
    "select",
    "small_cnn",
    "token_loss",
    "toy_task",
    "train_under_budget",
]
