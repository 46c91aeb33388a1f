"""The baselines CFBO is compared with: model-based freeze-thaw BO (DyHPO, ifBO, DPL) and, from
`freeze_thaw_bo.bandits`, random search, successive halving, Hyperband and ASHA.

Each model-based method asks its surrogate for sampled curve continuations, scores every
configuration that can still be thawed, and thaws the argmax for one epoch (ties broken uniformly
with `self.rng`). While nothing is observed yet it thaws a random untried configuration, as the
authors' code does (DyHPO, ifBO and DPL all start from one random configuration at one epoch).
All stop by the base class's fixed threshold rule (`stopping="threshold"`, R̂ ≥ 0.2), the paper's
rule for baselines, so their stopping points compare with CFBO's.

Acquisitions (m_n = epochs observed for configuration n, T = `max_epochs`, y_{n,e} its sampled
value after epoch e, ŷ the incumbent):

- DyHPO (Wistuba et al., 2022): one-step multi-fidelity EI, E[(y_{n, m_n+1} − ŷ_{m_n+1})₊], where
  ŷ_e is the best value observed at epoch e by any configuration, or ŷ when no configuration
  reached epoch e (the authors' `calculate_fidelity_ymax`); `reference="incumbent"` uses ŷ for
  every configuration, as CFBO's reimplementation of DyHPO does.
- ifBO (Rakotoarison et al., 2024), MFPI-random: per ask, a horizon h ~ U{1..T} and τ ~ U(−4, −1)
  set the threshold ŷ + 10^τ·(1 − ŷ), and the score is P(y_{n, min(m_n+h, T)} > threshold).
  This is CFBO with α = 0 and no utility.
- DPL (Kadra et al., 2023): EI of the final value, (μ − ŷ)Φ(z) + σφ(z), z = (μ − ŷ)/σ, with μ, σ
  the mean and standard deviation over samples of y_{n,T} (over DPL's ensemble members).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any

import numpy as np
import torch

from freeze_thaw_bo.bandits import ASHA, Hyperband, RandomSearch, SuccessiveHalving, draw_untried
from freeze_thaw_bo.optimizer import FreezeThawOptimizer
from freeze_thaw_bo.surrogates.base import CurveSurrogate

__all__ = [
    "ASHA",
    "DPLFreezeThaw",
    "DyHPO",
    "Hyperband",
    "IfBO",
    "RandomSearch",
    "SuccessiveHalving",
    "final_expected_improvement",
    "next_epoch_expected_improvement",
    "probability_of_improvement",
]

REFERENCES = ("fidelity", "incumbent")


def _check_samples(samples: torch.Tensor, lengths: np.ndarray) -> np.ndarray:
    """samples (N, S, T) as float64 numpy, after checking `lengths` is (N,)."""
    if samples.ndim != 3 or lengths.shape != (samples.shape[0],):
        raise ValueError(
            f"samples must be (N, S, T) and lengths (N,), got {tuple(samples.shape)} and "
            f"{lengths.shape}"
        )
    return samples.detach().to(torch.float64).cpu().numpy()


def next_epoch_expected_improvement(
    samples: torch.Tensor, lengths: np.ndarray, reference: np.ndarray
) -> np.ndarray:
    """DyHPO's acquisition: (N,) mean over samples of (y_{n, m_n+1} − reference[m_n])₊.

    Args:
        samples: (N, S, T) sampled curves.
        lengths: (N,) epochs observed m_n; a finished configuration (m_n = T) scores 0.
        reference: (T,) the value to beat at epochs 1..T (`reference[e − 1]` at epoch e).
    """
    y = _check_samples(samples, lengths)
    n, _, horizon = y.shape
    unfinished = lengths < horizon
    index = np.minimum(lengths, horizon - 1)
    next_values = y[np.arange(n), :, index]  # (N, S)
    gain = np.clip(next_values - np.asarray(reference)[index][:, None], 0.0, None).mean(axis=1)
    return np.where(unfinished, gain, 0.0)


def probability_of_improvement(
    samples: torch.Tensor, lengths: np.ndarray, *, horizon: int, threshold: float
) -> np.ndarray:
    """ifBO's MFPI: (N,) fraction of samples with y_{n, min(m_n + horizon, T)} > threshold."""
    y = _check_samples(samples, lengths)
    n, _, t = y.shape
    epoch = np.minimum(lengths + horizon, t)
    pi = (y[np.arange(n), :, epoch - 1] > threshold).mean(axis=1)
    return np.where(lengths < t, pi, 0.0)


def final_expected_improvement(
    samples: torch.Tensor, lengths: np.ndarray, *, incumbent: float
) -> np.ndarray:
    """DPL's acquisition: (N,) Gaussian EI of y_{n,T} over `incumbent`, with μ and σ (population
    standard deviation) over the samples; σ = 0 gives (μ − incumbent)₊, the limit."""
    y = _check_samples(samples, lengths)
    final = torch.from_numpy(y[:, :, -1])
    mu, sigma = final.mean(dim=1), final.std(dim=1, correction=0)
    gap = mu - incumbent
    z = gap / torch.where(sigma > 0, sigma, 1.0)
    density = torch.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)
    ei = torch.where(sigma > 0, gap * torch.special.ndtr(z) + sigma * density, gap.clamp_min(0.0))
    return np.where(lengths < y.shape[2], ei.numpy(), 0.0)


class _SurrogateMethod(FreezeThawOptimizer):
    """Score configurations from sampled curves and thaw the argmax; random until a first value."""

    def __init__(
        self,
        space,
        *,
        surrogate: CurveSurrogate | None = None,
        num_samples: int = 1000,
        **kwargs: Any,
    ) -> None:
        super().__init__(space, **kwargs)
        if int(num_samples) != num_samples or num_samples < 1:
            raise ValueError(f"num_samples must be an integer >= 1, got {num_samples}")
        surrogate = self.default_surrogate() if surrogate is None else surrogate
        if not isinstance(surrogate, CurveSurrogate):
            raise TypeError(f"surrogate must implement sample_curves, got {surrogate!r}")
        self.surrogate = surrogate
        self.num_samples = int(num_samples)
        self.last_acquisition: np.ndarray | None = None

    @abstractmethod
    def default_surrogate(self) -> CurveSurrogate:
        """The surrogate used when none is given."""

    @abstractmethod
    def acquisition(self, samples: torch.Tensor) -> np.ndarray:
        """(N,) scores of every configuration from (N, S, T) sampled curves."""

    def settings(self) -> dict[str, Any]:
        return {"num_samples": self.num_samples}

    def _choose(self) -> tuple[int | None, bool]:
        available = self._available()
        if not self.history:  # every available trial is untried: draw one
            return draw_untried(self, 1)[0], False
        samples = self.surrogate.sample_curves(
            self.observations(), self.num_samples, self.generator
        )
        scores = self.acquisition(samples)
        self.last_acquisition = scores
        masked = np.where(available, scores, -math.inf)
        ties = np.flatnonzero(masked == masked.max())
        trial = int(ties[int(self.rng.integers(len(ties)))])
        return trial, self._threshold_stop()


class DyHPO(_SurrogateMethod):
    """DyHPO's multi-fidelity expected improvement, one epoch ahead.

    Differences from the authors' DyHPO: the default surrogate is `FreezeThawGPSurrogate` (a GP
    with a fixed product kernel, Matérn-5/2 over the configuration × freeze-thaw decay over the
    epoch, hyperparameters refitted by L-BFGS every ask) instead of a deep-kernel GP (an MLP on
    (x, budget) plus a CNN on the learning curve, feeding an RBF kernel, trained by Adam), and EI
    is a Monte Carlo mean over sampled values instead of the closed form of a Gaussian predictive
    (the same in expectation, up to the surrogate's clipping to [0, 1]).

    Args:
        space: the `SearchSpace` to search.
        reference: "fidelity" (DyHPO's ŷ at the next epoch) or "incumbent" (as CFBO's
            reimplementation of DyHPO).
        **kwargs: `surrogate` (a `CurveSurrogate`; default `FreezeThawGPSurrogate()`),
            `num_samples` (sampled curves per configuration) and the `FreezeThawOptimizer`
            arguments (`budget`, `max_epochs`, ...).

    Example:
        >>> from freeze_thaw_bo import Float, SearchSpace
        >>> opt = DyHPO(SearchSpace({"lr": Float(0.0, 1.0)}), budget=6, max_epochs=3)
        >>> trial, epoch = opt.ask()
    """

    method = "dyhpo"

    def __init__(self, space, *, reference: str = "fidelity", **kwargs: Any) -> None:
        if reference not in REFERENCES:
            raise ValueError(f"reference must be one of {REFERENCES}, got {reference!r}")
        self.reference = reference
        super().__init__(space, **kwargs)

    def default_surrogate(self) -> CurveSurrogate:
        from freeze_thaw_bo.surrogates.gp import FreezeThawGPSurrogate

        return FreezeThawGPSurrogate()

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "reference": self.reference}

    def fidelity_best(self) -> np.ndarray:
        """(T,) ŷ_e: the best value observed at epoch e by any configuration, else the incumbent."""
        best = np.full(self.max_epochs, self.incumbent)
        if self.reference == "incumbent":
            return best
        for e in range(self.max_epochs):
            at_e = [values[e] for values in self.values if len(values) > e]
            if at_e:
                best[e] = max(at_e)
        return best

    def acquisition(self, samples: torch.Tensor) -> np.ndarray:
        return next_epoch_expected_improvement(samples, self.lengths(), self.fidelity_best())


class IfBO(_SurrogateMethod):
    """ifBO's MFPI-random acquisition (CFBO's "α = 0, no utility" baseline).

    As the authors' `ifBO.hpo`: the first configuration is random; then per ask h ~ U{1..T} and
    τ ~ U(−4, −1) are drawn (in that order, from `self.rng`) and every unfinished configuration is
    scored by P(y_{min(m+h, T)} > ŷ + 10^τ(1 − ŷ)). Differences: the probability is the fraction of
    sampled curves above the threshold (the authors read it off FT-PFN's bar distribution), and
    ties, including all-zero scores, are broken uniformly at random (the authors take the lowest
    index, which is trial 0 when every score is 0).

    Args:
        **kwargs: `surrogate` (a `CurveSurrogate`; default the learning-curve PFN CFBO uses),
            `num_samples` (sampled curves per configuration) and the `FreezeThawOptimizer`
            arguments (`budget`, `max_epochs`, ...).

    Attributes:
        last_horizon, last_threshold: the h and threshold drawn for the latest scored ask.

    Example:
        >>> import numpy as np, torch
        >>> from freeze_thaw_bo import Float, SearchSpace
        >>> class Flat:  # any CurveSurrogate; the default is the shipped PFN
        ...     def sample_curves(self, observations, num_samples, generator):
        ...         n, t = observations.num_configs, observations.horizon
        ...         return torch.rand(n, num_samples, t, generator=generator)
        >>> opt = IfBO(
        ...     SearchSpace({"lr": Float(0.0, 1.0)}), budget=6, max_epochs=3, surrogate=Flat()
        ... )
        >>> trial, epoch = opt.ask()
    """

    method = "ifbo"
    log10_tau_range = (-4.0, -1.0)

    def __init__(self, space, **kwargs: Any) -> None:
        super().__init__(space, **kwargs)
        self.last_horizon: int | None = None
        self.last_threshold: float | None = None

    def default_surrogate(self) -> CurveSurrogate:
        from freeze_thaw_bo.surrogates.pfn import PFNSurrogate

        return PFNSurrogate()

    def acquisition(self, samples: torch.Tensor) -> np.ndarray:
        horizon = int(self.rng.integers(1, self.max_epochs + 1))
        tau = float(self.rng.uniform(*self.log10_tau_range))
        best = self.incumbent
        self.last_horizon = horizon
        self.last_threshold = best + 10.0**tau * (1.0 - best)
        return probability_of_improvement(
            samples, self.lengths(), horizon=horizon, threshold=self.last_threshold
        )


class DPLFreezeThaw(_SurrogateMethod):
    """DPL: expected improvement of the predicted final value, thawing the argmax for one epoch.

    As in the authors' `PowerLawSurrogate`: the first configuration is random (one epoch), then
    every unfinished configuration is scored by Gaussian EI at the maximum budget T over the
    incumbent, from the ensemble's mean and standard deviation (with the default surrogate and
    `num_samples` a multiple of its ensemble size, the samples hold every member equally often).

    Args:
        **kwargs: `surrogate` (a `CurveSurrogate`; default `DPLSurrogate(seed=seed)`),
            `num_samples` (sampled curves per configuration; 100: 20 per member of 5) and the
            `FreezeThawOptimizer` arguments (`budget`, `max_epochs`, ...).

    Example:
        >>> from freeze_thaw_bo import Float, SearchSpace
        >>> opt = DPLFreezeThaw(SearchSpace({"lr": Float(0.0, 1.0)}), budget=6, max_epochs=3)
        >>> trial, epoch = opt.ask()  # the first configuration is random
    """

    method = "dpl"

    def __init__(self, space, *, num_samples: int = 100, **kwargs: Any) -> None:
        super().__init__(space, num_samples=num_samples, **kwargs)

    def default_surrogate(self) -> CurveSurrogate:
        from freeze_thaw_bo.surrogates.dpl import DPLSurrogate

        return DPLSurrogate(seed=self.seed)

    def acquisition(self, samples: torch.Tensor) -> np.ndarray:
        return final_expected_improvement(samples, self.lengths(), incumbent=self.incumbent)
