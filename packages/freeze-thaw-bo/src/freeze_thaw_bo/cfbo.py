"""CFBO: thaw the configuration expected to raise the utility most, and stop when it is unlikely to.

Acquisition (the paper's eq. and the authors' `hpo`): for configuration n with m_n epochs observed,
and every horizon Δt = 1..T − m_n,

    A(n) = max_Δt E[ U(b + Δt·κ_n, ỹ_{n, m_n+Δt}) − U_p ]₊,

where b is the spent budget (spent budget is sunk), κ_n the cost of one epoch (1 in epoch units),
ỹ the running maximum of the incumbent and the sampled continuation of n's curve, and U_p the
current utility. The expectation is a Monte Carlo mean over sampled curves. The argmax is thawed
for one epoch.

Stopping: with p = max_Δt P(U ≥ U_p) for the chosen configuration (0 if it is finished), stop when
the estimated regret R̂ = (Û_max − U_p)/(Û_max − Û_min) reaches δ(p) = BetaCDF(p; β, β)^γ, with
β = e⁻¹ and γ = log₀.₅ 0.2 (the authors' `beta = -1` is log β, `threshold = 0.2` gives γ). A
likely improvement (p near 1) needs a large regret to stop; an unlikely one (p near 0) stops at
any regret.

Samples: the default surrogate draws joint curves (one quantile level per path, see
`PFNSurrogate`); the authors draw every epoch independently and average 5 draws per sample
(`PFNSurrogate(sampling="marginal", average_draws=5)`; their transfer path also draws bucket
centres rather than points inside the bucket).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from freeze_thaw_bo.optimizer import FreezeThawOptimizer
from freeze_thaw_bo.surrogates.base import CurveSurrogate
from freeze_thaw_bo.utility import Utility

__all__ = ["CFBO", "adaptive_threshold", "utility_acquisition"]

BETA = math.exp(-1.0)
GAMMA = math.log(0.2, 0.5)


def adaptive_threshold(probability: float, *, beta: float = BETA, gamma: float = GAMMA) -> float:
    """δ(p) = BetaCDF(p; beta, beta)^gamma, CFBO's regret threshold for stopping."""
    from scipy.stats import beta as beta_distribution

    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"probability must be in [0, 1], got {probability}")
    return float(beta_distribution.cdf(probability, beta, beta) ** gamma)


def utility_acquisition(
    samples: torch.Tensor,
    lengths: torch.Tensor,
    *,
    incumbent: float,
    spent: float,
    step_costs: torch.Tensor,
    utility: Utility,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CFBO's acquisition and improvement probability for every configuration.

    Args:
        samples: (N, S, T) sampled curves (values for epochs 1..T).
        lengths: (N,) epochs observed per configuration (observed epochs are ignored).
        incumbent: the best value observed so far (the authors start from 0 before any).
        spent: the budget spent so far, b.
        step_costs: (N,) the budget one more epoch of each configuration costs.
        utility: U.

    Returns:
        acquisition (N,) = max_Δt mean_s [U − U_p]₊ and probability (N,) = max_Δt mean_s 1[U ≥ U_p];
        both 0 for a finished configuration.
    """
    n, s, t = samples.shape
    if lengths.shape != (n,) or step_costs.shape != (n,):
        raise ValueError(f"lengths and step_costs must be ({n},)")
    samples = samples.to(torch.float64)
    epochs = torch.arange(1, t + 1, dtype=torch.float64)
    horizon = epochs[None, :] - lengths.to(torch.float64)[:, None]  # (N, T): Δt per epoch
    future = horizon > 0
    budget = spent + horizon.clamp_min(0) * step_costs.to(torch.float64)[:, None]
    if not math.isfinite(incumbent):
        raise ValueError(f"incumbent must be finite, got {incumbent}")
    running = samples.clamp_min(incumbent).masked_fill(~future[:, None, :], -math.inf)
    running = torch.cummax(running, dim=-1).values
    u = utility(budget[:, None, :].expand(n, s, t), running)
    u = u.masked_fill(~future[:, None, :], -math.inf)
    u_p = float(utility(spent, incumbent))
    gain = (u - u_p).clamp_min(0.0)  # −∞ − U_p clamps to 0: past B or observed epochs gain nothing
    hit = (u >= u_p).to(torch.float64)
    acquisition = gain.mean(dim=1).max(dim=-1).values
    probability = hit.mean(dim=1).max(dim=-1).values
    return acquisition, probability


class CFBO(FreezeThawOptimizer):
    """Cost-sensitive freeze-thaw BO.

    Args:
        space: the `SearchSpace` to search.
        utility: the cost-performance trade-off U(b, y).
        budget: the total budget B (see `FreezeThawOptimizer`).
        surrogate: a `CurveSurrogate`; default the shipped learning-curve PFN.
        num_samples: Monte Carlo curves per configuration (the paper's 1000).
        **kwargs: `stopping` ("beta", CFBO's adaptive threshold and the default, "threshold" or
            "none"), `max_epochs`, `candidates`, `num_candidates`, `threshold`, `budget_unit`,
            `seed`.

    Example:
        >>> from freeze_thaw_bo import CFBO, Float, SearchSpace, Utility
        >>> space = SearchSpace({"lr": Float(1e-4, 1e-1, log=True)})
        >>> opt = CFBO(space, Utility(alpha=2**-4, budget=20), budget=20, max_epochs=10)
        >>> trial_id, epoch = opt.ask()
    """

    method = "cfbo"
    default_stopping = "beta"

    def __init__(
        self,
        space,
        utility: Utility,
        budget: float,
        *,
        surrogate: CurveSurrogate | None = None,
        num_samples: int = 1000,
        **kwargs: Any,
    ) -> None:
        super().__init__(space, budget=budget, utility=utility, **kwargs)
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if surrogate is None:
            from freeze_thaw_bo.surrogates.pfn import PFNSurrogate

            surrogate = PFNSurrogate()
        if not isinstance(surrogate, CurveSurrogate):
            raise TypeError(f"surrogate must implement sample_curves, got {surrogate!r}")
        self.surrogate = surrogate
        self.num_samples = int(num_samples)
        self.last_acquisition: np.ndarray | None = None
        self.last_probability: float | None = None

    def settings(self) -> dict[str, Any]:
        return {"num_samples": self.num_samples}

    def _choose(self) -> tuple[int | None, bool]:
        available = self._available()
        samples = self.surrogate.sample_curves(
            self.observations(), self.num_samples, self.generator
        )
        acquisition, probability = utility_acquisition(
            samples,
            torch.from_numpy(self.lengths()),
            incumbent=self.incumbent if self.history else 0.0,
            spent=self.budget_spent,
            step_costs=torch.from_numpy(self.step_costs()),
            utility=self.utility,
        )
        scores = acquisition.masked_fill(~torch.from_numpy(available), -math.inf)
        best = float(scores.max())
        ties = torch.nonzero(scores == best).flatten()
        trial = int(ties[int(self.rng.integers(len(ties)))])
        self.last_acquisition = acquisition.numpy()
        self.last_probability = float(probability[trial])
        return trial, self._threshold_stop(self.last_probability)
