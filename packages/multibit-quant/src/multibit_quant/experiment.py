"""The training schemes the paper compares, side by side on the same data and epochs.

* ``dedicated``: one model per bit-width, plain QAT (no correction); it has nothing to offer at
  a bit-width it was not trained at.
* ``any_precision``: one model, one BatchNorm per bit-width, every bit-width on every batch,
  recursive distillation (Any-Precision DNNs); an untrained bit-width borrows the nearest
  trained one's BatchNorm.
* ``shared_bn``: one model, one shared BatchNorm, no correction (the ablation: what weight bias
  correction fixes).
* ``ours``: one model, one shared BatchNorm, weight bias correction.
* ``ours_coreset``: the same with bit-wise coresets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import torch
from torch import nn

from multibit_quant.alignment import gradient_alignment
from multibit_quant.data import ImageData
from multibit_quant.layers import QuantConfig
from multibit_quant.model import MultiBitModel, quantize, switch_batchnorm
from multibit_quant.train import TrainConfig, TrainResult, evaluate, train_multibit

logger = logging.getLogger(__name__)

SCHEMES = ("dedicated", "any_precision", "shared_bn", "ours", "ours_coreset")


@dataclass
class SchemeResult:
    """Accuracy per evaluated bit-width (``None``: the scheme has no model for it) and cost."""

    scheme: str
    accuracy: dict[int, float | None]
    train_seconds: float
    scoring_seconds: float
    trained_examples: int
    scored_examples: int
    teacher_examples: int
    runs: list[dict] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.train_seconds + self.scoring_seconds

    def to_dict(self) -> dict:
        return {**asdict(self), "seconds": self.seconds}


def _collect(name: str, accuracy: dict, results: list[TrainResult]) -> SchemeResult:
    return SchemeResult(
        scheme=name,
        accuracy=accuracy,
        train_seconds=sum(r.train_seconds for r in results),
        scoring_seconds=sum(r.scoring_seconds for r in results),
        trained_examples=sum(sum(r.trained_examples.values()) for r in results),
        scored_examples=sum(r.scored_examples for r in results),
        teacher_examples=sum(r.teacher_examples for r in results),
        runs=[r.to_dict() for r in results],
    )


def run_scheme(
    scheme: str,
    factory: Callable[[], nn.Module],
    train: ImageData,
    test: ImageData,
    bits: tuple[int, ...],
    evaluate_bits: tuple[int, ...],
    config: TrainConfig,
    *,
    coreset: float = 0.5,
    quant: QuantConfig | None = None,
    progress: bool | None = None,
) -> tuple[SchemeResult, MultiBitModel | None]:
    """Train and evaluate one scheme; returns its result and (for the one-model schemes) the
    trained model. ``quant`` sets the quantizers (its correction is the scheme's own)."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; choose one of {SCHEMES}")
    quant = QuantConfig() if quant is None else quant
    torch.manual_seed(config.seed)
    if scheme == "dedicated":
        accuracy: dict[int, float | None] = dict.fromkeys(evaluate_bits)
        results = []
        for b in bits:
            torch.manual_seed(config.seed)
            model = quantize(factory(), [b], replace(quant, correction=None))
            results.append(train_multibit(model, train, config, progress=progress))
            accuracy[b] = evaluate(model, test, [b])[b]
        return _collect(scheme, accuracy, results), None
    if scheme == "any_precision":
        model = switch_batchnorm(quantize(factory(), bits, replace(quant, correction=None)))
        config = replace(config, distill="recursive", coreset=None)
    elif scheme == "shared_bn":
        model = quantize(factory(), bits, replace(quant, correction=None))
        config = replace(config, coreset=None)
    elif scheme == "ours":
        model = quantize(factory(), bits, quant)
        config = replace(config, coreset=None)
    else:
        model = quantize(factory(), bits, quant)
        config = replace(config, coreset=coreset)
    result = train_multibit(model, train, config, progress=progress)
    return _collect(scheme, evaluate(model, test, evaluate_bits), [result]), model


def compare_schemes(
    factory: Callable[[], nn.Module],
    train: ImageData,
    test: ImageData,
    bits: tuple[int, ...],
    evaluate_bits: tuple[int, ...],
    config: TrainConfig,
    *,
    schemes: tuple[str, ...] = SCHEMES,
    coreset: float = 0.5,
    quant: QuantConfig | None = None,
    alignment_batches: int = 4,
    progress: bool | None = None,
) -> dict:
    """Every scheme in one run, same data, epochs and seed; plus the cross-bit gradient angles
    of the ``ours`` model (if run). Returns a JSON-ready dict."""
    out: dict = {"schemes": {}, "alignment": None}
    for scheme in schemes:
        start = time.perf_counter()
        result, model = run_scheme(
            scheme, factory, train, test, bits, evaluate_bits, config,
            coreset=coreset, quant=quant, progress=progress,
        )  # fmt: skip
        logger.info(
            "%s: %.0f s, accuracy %s", scheme, time.perf_counter() - start,
            {b: None if a is None else round(a, 4) for b, a in result.accuracy.items()},
        )  # fmt: skip
        out["schemes"][scheme] = result.to_dict()
        if scheme == "ours" and model is not None and alignment_batches:
            angles = gradient_alignment(model, train, bits, batches=alignment_batches)
            out["alignment"] = {f"{a}-{b}": angle for (a, b), angle in angles.items()}
    return out
