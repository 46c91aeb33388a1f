"""Settings of the outer optimisation, shared by CADS and the bilevel baselines.

Defaults follow the paper where it gives a value: Adam with learning rate 5e-2 on ``s`` and 5e-3
on the jointly trained model, ``s`` initialised at 0.5, K = 5 draws per outer step, 100 outer
steps, the truncated Gaussian's ``σ_0 = 0.1`` annealed by 0.99 per step, the surrogate's
fractions. The paper gives no penalty weight ``α`` and no clipping norm: ``α = 1`` and a norm of 3
(the clip that PBCS's code applies) are this package's choices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cads.estimator import BASELINES, MIN_DRAWS
from cads.surrogate import INTERPOLATIONS, PAPER_FRACTIONS

__all__ = ["IHVP_METHODS", "SelectConfig"]

IHVP_METHODS = ("cg", "neumann")


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _positive(name: str, value) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


@dataclass(frozen=True)
class SelectConfig:
    """Outer-loop settings.

    Attributes:
        outer_steps: updates of ``s``.
        samples: ``K``, draws per outer step (``≥ 2`` for the leave-one-out and mean
            baselines; one is enough without a baseline).
        lr: Adam's learning rate on ``s``.
        model_lr: Adam's learning rate on CADS's jointly trained model ``θ``.
        init: the starting value of every ``s_i`` (the paper's 0.5; with ``size`` the first
            projection moves it to the size's fraction).
        alpha: CADS's penalty weight ``α``.
        sigma: CADS-S's truncated-Gaussian scale ``σ_0``.
        sigma_decay: its factor per outer step.
        baseline: the score-function baseline (see :func:`cads.score_function_gradient`).
        clip_norm: the largest norm of the gradient on ``s`` (``None``: no clipping).
        size: impose an expected selection size (examples) by projection; ``None`` (the paper's
            CADS): the budget alone decides how much data to take.
        pool_batch: pool examples on which CADS estimates each draw's training loss per step
            (``None``, the default: the whole pool, exact; a batch: unbiased, cheaper).
        val_batch: validation examples per CADS step (``None``: all).
        fractions: the surrogate's subset fractions.
        interpolation: the surrogate's cubic, ``"pchip"`` or ``"cubic"`` (see
            :mod:`cads.surrogate`).
        eps: Bernoulli probabilities are kept in ``[eps, 1 − eps]`` (the score needs ``0 < s < 1``).
        ihvp: the implicit baseline's inverse-Hessian-vector product, ``"cg"`` (conjugate
            gradients) or ``"neumann"`` (Neumann series).
        ihvp_iterations: its iterations.
        damping: the ``λ`` of ``(H + λI)^{-1}``.
        neumann_scale: the Neumann series' step ``η`` in ``Σ_j (I − η(H + λI))^j η v``.
    """

    outer_steps: int = 100
    samples: int = 5
    lr: float = 5e-2
    model_lr: float = 5e-3
    init: float = 0.5
    alpha: float = 1.0
    sigma: float = 0.1
    sigma_decay: float = 0.99
    baseline: str = "leave_one_out"
    clip_norm: float | None = 3.0
    size: float | None = None
    pool_batch: int | None = None
    val_batch: int | None = 1024
    fractions: tuple[float, ...] = PAPER_FRACTIONS
    interpolation: str = "pchip"
    eps: float = 1e-3
    ihvp: str = "cg"
    ihvp_iterations: int = 20
    damping: float = 1e-2
    neumann_scale: float = 1e-2

    def __post_init__(self) -> None:
        _positive_int("outer_steps", self.outer_steps)
        _positive_int("samples", self.samples)
        _positive_int("ihvp_iterations", self.ihvp_iterations)
        for name in ("lr", "model_lr", "alpha", "sigma", "damping", "neumann_scale"):
            _positive(name, getattr(self, name))
        if not 0 < self.sigma_decay <= 1:
            raise ValueError(f"sigma_decay must be in (0, 1], got {self.sigma_decay!r}")
        if not 0 < self.init < 1:
            raise ValueError(f"init must lie strictly inside (0, 1), got {self.init!r}")
        if not 0 < self.eps < 0.5:
            raise ValueError(f"eps must be in (0, 0.5), got {self.eps!r}")
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        if self.baseline == "leave_one_out" and self.samples < MIN_DRAWS[self.baseline]:
            raise ValueError("the leave-one-out baseline needs samples >= 2")
        if self.baseline == "mean" and self.samples < MIN_DRAWS[self.baseline]:
            raise ValueError(
                "the mean baseline needs samples >= 2: with one draw it equals the draw's value "
                "and the gradient on s is zero (baseline='none' works with one draw)"
            )
        if self.clip_norm is not None:
            _positive("clip_norm", self.clip_norm)
        if self.size is not None:
            _positive("size", self.size)
        for name in ("pool_batch", "val_batch"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        if self.pool_batch is not None and self.pool_batch < 2:
            raise ValueError(f"pool_batch must be at least 2 (two halves), got {self.pool_batch}")
        if self.ihvp not in IHVP_METHODS:
            raise ValueError(f"ihvp must be one of {IHVP_METHODS}, got {self.ihvp!r}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"interpolation must be one of {INTERPOLATIONS}, got {self.interpolation!r}"
            )
        object.__setattr__(self, "fractions", tuple(self.fractions))
