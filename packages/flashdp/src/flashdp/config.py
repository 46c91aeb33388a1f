"""The settings of a private model, validated once when :func:`flashdp.make_private` runs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from flashdp.plan import METHODS

Clipping = Literal["per_layer", "flat"]
LossReduction = Literal["mean", "sum"]

CLIPPING_MODES: tuple[str, ...] = ("per_layer", "flat")
LOSS_REDUCTIONS: tuple[str, ...] = ("mean", "sum")


def _positive_finite(name: str, value: float, *, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value}")


@dataclass(frozen=True)
class PrivacyConfig:
    """How a model is made private.

    Attributes:
        max_grad_norm: C, the L2 bound of one example's whole clipped gradient (all layers
            together); the noise standard deviation is ``noise_multiplier * max_grad_norm``.
        noise_multiplier: σ, noise standard deviation in units of ``max_grad_norm`` (0 disables
            noise: no privacy, for testing only).
        clipping: ``"per_layer"`` (each parameter tensor l clipped to its own C_l) or ``"flat"``
            (the whole per-example gradient clipped to C).
        layer_norms: C_l per trainable parameter name, resolved by :func:`flashdp.make_private`
            (C/√L each unless given); empty for flat clipping.
        expected_batch_size: the denominator B of the gradient; ``None`` divides by the number
            of examples actually in the logical batch (right for fixed-size batches; Poisson
            sampling needs the expected size, since the actual size depends on the data).
        loss_reduction: ``"mean"``: backward is called on (1/B_micro)·Σ_b ℓ_b; ``"sum"``: on
            Σ_b ℓ_b. Per-example gradients are recovered from it before clipping.
        sample_rate: Poisson sampling rate q, for ε reporting (requires
            ``expected_batch_size``); ``None`` disables the accountant.
        backend: kernel backend for the fused per-layer clipping (see
            :func:`kernels_common.resolve_backend`); ``None`` chooses automatically.
        workspace_mb: bound, in MiB, of the float32 per-example weight gradients a linear layer
            may store at once to clip them in one GEMM (per-layer clipping; see
            :mod:`flashdp.plan`); 0 never stores them; ``None``: the device's default
            (:data:`flashdp.plan.DEFAULT_WORKSPACE_MB`).
        linear_method: how linear weights are clipped: ``"auto"`` (per layer, by the cost model
            of :mod:`flashdp.plan`), or ``"store"``, ``"ghost"`` or ``"recompute"`` wherever
            available.
    """

    max_grad_norm: float
    noise_multiplier: float
    clipping: Clipping = "per_layer"
    layer_norms: tuple[tuple[str, float], ...] = ()
    expected_batch_size: int | None = None
    loss_reduction: LossReduction = "mean"
    sample_rate: float | None = None
    backend: str | None = None
    workspace_mb: float | None = None
    linear_method: str = "auto"

    def __post_init__(self) -> None:
        if self.linear_method not in METHODS:
            raise ValueError(f"linear_method must be one of {METHODS}, got {self.linear_method!r}")
        if self.linear_method == "store" and self.clipping == "flat":
            raise ValueError(
                "linear_method='store' needs clipping='per_layer': flat clipping knows no "
                "example's coefficient before every layer's norm, so it cannot clip stored "
                "chunks as they are computed"
            )
        if self.workspace_mb is not None:
            _positive_finite("workspace_mb", self.workspace_mb, allow_zero=True)
        _positive_finite("max_grad_norm", self.max_grad_norm)
        _positive_finite("noise_multiplier", self.noise_multiplier, allow_zero=True)
        if self.clipping not in CLIPPING_MODES:
            raise ValueError(f"clipping must be one of {CLIPPING_MODES}, got {self.clipping!r}")
        if self.loss_reduction not in LOSS_REDUCTIONS:
            raise ValueError(
                f"loss_reduction must be one of {LOSS_REDUCTIONS}, got {self.loss_reduction!r}"
            )
        if self.expected_batch_size is not None and (
            isinstance(self.expected_batch_size, bool)
            or not isinstance(self.expected_batch_size, int)
            or self.expected_batch_size < 1
        ):
            raise ValueError(
                "expected_batch_size must be a positive int or None, "
                f"got {self.expected_batch_size!r}"
            )
        if self.sample_rate is not None:
            _positive_finite("sample_rate", self.sample_rate)
            if self.sample_rate > 1:
                raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate}")
            if self.expected_batch_size is None:
                # Dividing by the actual Poisson batch size makes the release depend on the
                # batch size, which the accountant's Gaussian mechanism does not cover.
                raise ValueError(
                    "sample_rate (Poisson sampling) needs expected_batch_size: the gradient "
                    "must be divided by the expected batch size q·N, not the actual one"
                )
        for name, bound in self.layer_norms:
            _positive_finite(f"layer_norms[{name!r}]", bound)
        total = math.sqrt(sum(bound**2 for _, bound in self.layer_norms))
        # The noise is calibrated to max_grad_norm: the per-layer bounds must not exceed it.
        if total > self.max_grad_norm * (1 + 1e-9):
            raise ValueError(
                f"the per-layer bounds have L2 norm {total:.6g} > max_grad_norm "
                f"{self.max_grad_norm:.6g}: the noise would be too small for their sensitivity"
            )

    @property
    def noise_std(self) -> float:
        """Standard deviation of the Gaussian noise added to every gradient coordinate of the
        summed clipped gradients: σ·C (before the division by the batch size)."""
        return self.noise_multiplier * self.max_grad_norm
