"""Gumbel logic gate networks ("Mind the Gap", Yousefi et al., NeurIPS 2025).

Differentiable logic gate networks trained with the softmax relaxation (difflogic) or with
Gumbel noise and a straight-through estimator, a fused logic-layer kernel, and exact bit-parallel
compiled inference.
"""

from importlib import metadata as _metadata

from dlgn_gumbel.cbuild import CompilerUnavailableError
from dlgn_gumbel.compiled import CompiledLogicNet, compile_logic_net
from dlgn_gumbel.diagnose import GradientAgreement, LayerAgreement, gradient_agreement
from dlgn_gumbel.gates import GATE_COEFFS, GATE_NAMES, gate_coefficients, relaxed_gate
from dlgn_gumbel.layers import (
    GroupSum,
    LogicLayer,
    LogicNet,
    LogicNetConfig,
    ThermometerEncoder,
    difflogic_connections,
    make_connections,
)
from dlgn_gumbel.metrics import (
    DiscretizationGap,
    GateUsage,
    accuracy,
    discretization_gap,
    gate_usage,
)
from dlgn_gumbel.ops import logic_layer
from dlgn_gumbel.reference import logic_layer_affine, logic_layer_reference16
from dlgn_gumbel.train import TrainConfig, TrainResult, load_checkpoint, train

try:
    __version__ = _metadata.version("dlgn-gumbel")
except _metadata.PackageNotFoundError:  # imported from a source tree (PYTHONPATH), not installed
    __version__ = "0.0.0+source"

__all__ = [
    "GATE_COEFFS",
    "GATE_NAMES",
    "CompiledLogicNet",
    "CompilerUnavailableError",
    "DiscretizationGap",
    "GateUsage",
    "GradientAgreement",
    "GroupSum",
    "LayerAgreement",
    "LogicLayer",
    "LogicNet",
    "LogicNetConfig",
    "ThermometerEncoder",
    "TrainConfig",
    "TrainResult",
    "__version__",
    "accuracy",
    "compile_logic_net",
    "difflogic_connections",
    "discretization_gap",
    "gate_coefficients",
    "gate_usage",
    "gradient_agreement",
    "load_checkpoint",
    "logic_layer",
    "logic_layer_affine",
    "logic_layer_reference16",
    "make_connections",
    "relaxed_gate",
    "train",
]
