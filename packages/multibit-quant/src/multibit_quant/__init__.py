"""Multi-bit quantization networks: one set of weights, many bit-widths.

``quantize(model, bits=[2, 4, 8])`` makes a network's Conv2d / Linear layers switchable between
bit-widths (``set_bits``), with DoReFa- or LSQ-style quantizers, weight bias correction (one
BatchNorm serves every bit-width, trained or not), fused fake-quant Triton kernels, bit-wise
coreset training, and integer export.

Importing this package never imports Triton or initialises CUDA.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from multibit_quant.alignment import gradient_alignment
from multibit_quant.checkpoint import load_checkpoint, save_checkpoint
from multibit_quant.coreset import BitwiseCoreset, ForgettingTracker, importance_scores, select
from multibit_quant.data import ImageData, cifar10_bigbench, fashion_mnist, image_folder
from multibit_quant.experiment import SCHEMES, compare_schemes, run_scheme
from multibit_quant.export import (
    IntegerConv2d,
    IntegerLinear,
    export_integer,
    export_sizes,
    load_integer,
    pack_codes,
    to_integer,
    unpack_codes,
)
from multibit_quant.layers import QuantConfig, QuantConv2d, QuantLinear
from multibit_quant.model import MultiBitModel, SwitchBatchNorm2d, quantize, switch_batchnorm
from multibit_quant.models import build_model, preact_resnet20, small_vit
from multibit_quant.ops import fake_quant_activation, fake_quant_weight
from multibit_quant.reference import FP_BITS
from multibit_quant.train import TrainConfig, TrainResult, evaluate, train_multibit

try:
    __version__ = _metadata.version("multibit-quant")
except _metadata.PackageNotFoundError:  # imported from a source tree (PYTHONPATH), not installed
    __version__ = "0.0.0+source"

__all__ = [
    "FP_BITS",
    "SCHEMES",
    "BitwiseCoreset",
    "ForgettingTracker",
    "ImageData",
    "IntegerConv2d",
    "IntegerLinear",
    "MultiBitModel",
    "QuantConfig",
    "QuantConv2d",
    "QuantLinear",
    "SwitchBatchNorm2d",
    "TrainConfig",
    "TrainResult",
    "__version__",
    "build_model",
    "cifar10_bigbench",
    "compare_schemes",
    "evaluate",
    "export_integer",
    "export_sizes",
    "fake_quant_activation",
    "fake_quant_weight",
    "fashion_mnist",
    "gradient_alignment",
    "image_folder",
    "importance_scores",
    "load_checkpoint",
    "load_integer",
    "pack_codes",
    "preact_resnet20",
    "quantize",
    "run_scheme",
    "save_checkpoint",
    "select",
    "small_vit",
    "switch_batchnorm",
    "to_integer",
    "train_multibit",
    "unpack_codes",
]
