"""A Gaussian process over (configuration, epoch) with Swersky et al.'s freeze-thaw kernel.

Model (all values in [0, 1], higher is better): the value of configuration x after epoch t is

    y(x, t) = m + a(x) + g(x, t) + ε,    a ~ GP(0, σ_a²·k_x),   g ~ GP(0, σ_d²·k_x ⊗ k_t),

so the joint kernel is the product

    k((x, t), (x', t')) = k_x(x, x') · [σ_a² + σ_d²·k_t(t, t')] (+ σ_n² on identical points),

with k_x a Matérn-5/2 kernel with one lengthscale per encoded dimension and k_t the freeze-thaw
exponential-decay kernel of Swersky, Snoek & Adams (2014), k_t(t, t') = β^α / (t + t' + β)^α
(an infinite mixture of exponentials e^{−λt} with λ ~ Gamma(α, β)), on raw epochs. The constant
σ_a² term is the per-curve asymptote a(x): it is the same at every epoch and correlated across
configurations by k_x; the decaying term g(x, t) is each curve's transient, which vanishes as t
grows (Var g(x, t) = σ_d²·β^α/(2t + β)^α), so every predicted curve converges to its asymptote.
Unlike Swersky et al., whose transients are independent across curves, the transient here is also
shared through k_x, so an untried configuration's early epochs are predicted from its neighbours'
early epochs (DyHPO needs exactly that: it compares values at the next epoch).

Hyperparameters (lengthscales, m, σ_a², σ_d², α, β, σ_n²) maximise the log marginal likelihood
(L-BFGS in float64 from a fixed start), refitted from that start on every call, so the model is a
deterministic function of the observations (an optimizer resumed from disk samples the same
curves). `sample_curves` draws joint Gaussian curves over epochs 1..T per configuration from the
posterior predictive (noise included, like the GP baselines' `likelihood(model(x))`), by a batched
Cholesky factor of each configuration's T×T posterior covariance, clipped to [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from freeze_thaw_bo.surrogates.base import CurveObservations

__all__ = ["FreezeThawGPSurrogate", "GPHyperparameters"]

_LOG_BOUNDS = (-9.0, 6.0)  # every positive hyperparameter stays in [e⁻⁹, e⁶] while fitting
_CHUNK_ELEMENTS = 2_000_000  # test points × observations per block of the posterior


@dataclass(frozen=True)
class GPHyperparameters:
    """The GP's hyperparameters; the defaults are the start of the marginal-likelihood fit.

    Attributes:
        lengthscales: Matérn-5/2 lengthscale per encoded dimension (one float: the same for all).
        mean: the constant prior mean m; None means the observations' mean (0.5 with none).
        asymptote_variance: σ_a², the variance of the per-curve asymptote.
        decay_variance: σ_d², the scale of the freeze-thaw (transient) term.
        alpha: α of the freeze-thaw kernel (the Gamma shape).
        beta: β of the freeze-thaw kernel (the Gamma rate), in epochs.
        noise: σ_n², the observation noise variance.

    The fit keeps every positive hyperparameter in [e⁻⁹, e⁶] (so σ_n² ≥ 1.2·10⁻⁴, a noise sd of
    at least 0.011 on values in [0, 1]).
    """

    lengthscales: float | tuple[float, ...] = 0.5
    mean: float | None = None
    asymptote_variance: float = 0.05
    decay_variance: float = 0.5
    alpha: float = 1.0
    beta: float = 1.0
    noise: float = 1e-3

    def __post_init__(self) -> None:
        scales = np.atleast_1d(np.asarray(self.lengthscales, dtype=np.float64))
        positive = {
            "asymptote_variance": self.asymptote_variance,
            "decay_variance": self.decay_variance,
            "alpha": self.alpha,
            "beta": self.beta,
            "noise": self.noise,
        }
        for name, value in positive.items():
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        if not (np.all(np.isfinite(scales)) and np.all(scales > 0)):
            raise ValueError(f"lengthscales must be finite and > 0, got {self.lengthscales}")
        if self.mean is not None and not math.isfinite(self.mean):
            raise ValueError(f"mean must be finite or None, got {self.mean}")

    def lengthscale_vector(self, dim: int) -> np.ndarray:
        """(dim,) lengthscales (a single float broadcast)."""
        scales = np.atleast_1d(np.asarray(self.lengthscales, dtype=np.float64))
        if scales.size == 1:
            return np.full(dim, float(scales[0]))
        if scales.size != dim:
            raise ValueError(f"{scales.size} lengthscales for a {dim}-dimensional encoding")
        return scales


def squared_differences(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """(n1, n2, D) per-dimension squared differences of (n1, D) and (n2, D) points."""
    return (x1[:, None, :] - x2[None, :, :]) ** 2


def matern52(sq_diff: torch.Tensor, lengthscales: torch.Tensor) -> torch.Tensor:
    """(n1, n2) Matérn-5/2 correlations (1 + √5r + 5r²/3)·exp(−√5r), r the scaled distance,
    from `squared_differences` (n1, n2, D) and (D,) lengthscales."""
    r = torch.sqrt((sq_diff / lengthscales**2).sum(-1).clamp_min(1e-30))  # gradient-safe at r = 0
    s5r = math.sqrt(5.0) * r
    return (1.0 + s5r + s5r**2 / 3.0) * torch.exp(-s5r)


def freeze_thaw_kernel(
    t1: torch.Tensor, t2: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """(n1, n2) Swersky et al.'s k(t, t') = β^α / (t + t' + β)^α, computed in log space."""
    return torch.exp(alpha * (torch.log(beta) - torch.log(t1[:, None] + t2[None, :] + beta)))


class _Parameters:
    """Unconstrained (log) parameters as one float64 tensor, and their constrained values."""

    def __init__(self, start: GPHyperparameters, dim: int, mean: float) -> None:
        logs = [
            *np.log(start.lengthscale_vector(dim)),
            math.log(start.asymptote_variance),
            math.log(start.decay_variance),
            math.log(start.alpha),
            math.log(start.beta),
            math.log(start.noise),
        ]
        self.dim = dim
        self.raw = torch.tensor([mean, *logs], dtype=torch.float64)

    def unpack(self, raw: torch.Tensor) -> dict[str, torch.Tensor]:
        logs = raw[1:].clamp(*_LOG_BOUNDS)
        d = self.dim
        return {
            "mean": raw[0],
            "lengthscales": logs[:d].exp(),
            "asymptote_variance": logs[d].exp(),
            "decay_variance": logs[d + 1].exp(),
            "alpha": logs[d + 2].exp(),
            "beta": logs[d + 3].exp(),
            "noise": logs[d + 4].exp(),
        }


def _as_tensors(hyper: GPHyperparameters, dim: int, mean: float) -> dict[str, torch.Tensor]:
    def f(value: float) -> torch.Tensor:
        return torch.tensor(value, dtype=torch.float64)

    return {
        "mean": f(mean if hyper.mean is None else hyper.mean),
        "lengthscales": torch.from_numpy(hyper.lengthscale_vector(dim)),
        "asymptote_variance": f(hyper.asymptote_variance),
        "decay_variance": f(hyper.decay_variance),
        "alpha": f(hyper.alpha),
        "beta": f(hyper.beta),
        "noise": f(hyper.noise),
    }


def _time_kernel(t1: torch.Tensor, t2: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """σ_a² + σ_d²·k_t(t, t'): the epoch part of the product kernel."""
    decay = freeze_thaw_kernel(t1, t2, p["alpha"], p["beta"])
    return p["asymptote_variance"] + p["decay_variance"] * decay


@dataclass(frozen=True)
class _Training:
    """The observations as the kernel needs them, computed once per fit."""

    x: torch.Tensor  # (M, D)
    t: torch.Tensor  # (M,) epochs
    y: torch.Tensor  # (M,) values
    sq_diff: torch.Tensor  # (M, M, D)
    eye: torch.Tensor  # (M, M)

    @classmethod
    def of(cls, observations: CurveObservations) -> _Training:
        if not isinstance(observations, CurveObservations):
            raise TypeError(f"expected CurveObservations, got {type(observations).__name__}")
        ids, epochs, values = observations.context()
        x = torch.from_numpy(observations.x[ids])
        return cls(
            x=x,
            t=torch.from_numpy(epochs.astype(np.float64)),
            y=torch.from_numpy(values),
            sq_diff=squared_differences(x, x),
            eye=torch.eye(len(ids), dtype=torch.float64),
        )

    def covariance(self, p: dict[str, torch.Tensor]) -> torch.Tensor:
        """(M, M) k(·, ·) + σ_n² I over the observations."""
        k = matern52(self.sq_diff, p["lengthscales"]) * _time_kernel(self.t, self.t, p)
        return k + p["noise"] * self.eye


def _cholesky(matrix: torch.Tensor) -> torch.Tensor:
    """Cholesky factor of a (batch of) symmetric PSD matrices, adding jitter until it succeeds."""
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype)
    scale = matrix.diagonal(dim1=-2, dim2=-1).abs().mean().clamp_min(1e-12)
    for jitter in (0.0, 1e-10, 1e-8, 1e-6, 1e-4):
        factor, info = torch.linalg.cholesky_ex(matrix + jitter * scale * eye)
        if not bool((info != 0).any()):
            return factor
    raise ValueError("the GP covariance is not positive definite even with jitter")


def _negative_log_marginal_likelihood(data: _Training, p: dict[str, torch.Tensor]) -> torch.Tensor:
    """−log N(y; m, K) of the observations."""
    factor, info = torch.linalg.cholesky_ex(data.covariance(p))
    if bool(info != 0):
        return torch.tensor(math.inf, dtype=torch.float64)
    resid = (data.y - p["mean"])[:, None]
    white = torch.linalg.solve_triangular(factor, resid, upper=False)
    return (
        0.5 * (white**2).sum()
        + torch.log(factor.diagonal()).sum()
        + 0.5 * len(data.y) * math.log(2 * math.pi)
    )


class FreezeThawGPSurrogate:
    """A product-kernel GP over (configuration, epoch): Matérn-5/2 × (asymptote + freeze-thaw).

    Args:
        start: the hyperparameters the marginal-likelihood fit starts from.
        fit_iterations: L-BFGS iterations per fit (0 keeps `start` as is: a fixed-prior GP).

    Example:
        >>> import numpy as np, torch
        >>> from freeze_thaw_bo.surrogates.base import CurveObservations
        >>> obs = CurveObservations(
        ...     np.array([[0.2], [0.7]]), (np.array([0.3, 0.5]), np.array([])), 5
        ... )
        >>> FreezeThawGPSurrogate().sample_curves(obs, 8, torch.Generator().manual_seed(0)).shape
        torch.Size([2, 8, 5])
    """

    def __init__(self, start: GPHyperparameters | None = None, *, fit_iterations: int = 20) -> None:
        if fit_iterations < 0:
            raise ValueError(f"fit_iterations must be >= 0, got {fit_iterations}")
        self.start = GPHyperparameters() if start is None else start
        if not isinstance(self.start, GPHyperparameters):
            raise TypeError(f"start must be GPHyperparameters, got {type(self.start).__name__}")
        self.fit_iterations = int(fit_iterations)

    def fit(self, observations: CurveObservations) -> GPHyperparameters:
        """Hyperparameters maximising the marginal likelihood of the observations (from `start`).

        With no observations, or `fit_iterations=0`, returns `start` (its mean resolved).
        """
        data = _Training.of(observations)
        mean = float(data.y.mean()) if len(data.y) else 0.5
        if self.start.mean is not None:
            mean = self.start.mean
        start = replace(self.start, mean=mean)
        if len(data.y) == 0 or self.fit_iterations == 0:
            return start
        params = _Parameters(start, observations.x.shape[1], mean)
        raw = params.raw.clone().requires_grad_(True)
        optimizer = torch.optim.LBFGS(
            [raw], max_iter=self.fit_iterations, line_search_fn="strong_wolfe"
        )

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = _negative_log_marginal_likelihood(data, params.unpack(raw))
            if torch.isfinite(loss):
                loss.backward()
            return loss

        with torch.no_grad():
            initial = float(_negative_log_marginal_likelihood(data, params.unpack(params.raw)))
        try:
            optimizer.step(closure)
        except RuntimeError:  # a line search left the PD cone: keep the start
            return start
        with torch.no_grad():
            final = float(_negative_log_marginal_likelihood(data, params.unpack(raw)))
        if not (math.isfinite(final) and final <= initial):
            return start
        fitted = {k: v.detach() for k, v in params.unpack(raw.detach()).items()}
        return GPHyperparameters(
            lengthscales=tuple(float(v) for v in fitted["lengthscales"]),
            mean=float(fitted["mean"]),
            asymptote_variance=float(fitted["asymptote_variance"]),
            decay_variance=float(fitted["decay_variance"]),
            alpha=float(fitted["alpha"]),
            beta=float(fitted["beta"]),
            noise=float(fitted["noise"]),
        )

    def posterior(
        self, observations: CurveObservations, hyper: GPHyperparameters
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior predictive of y over epochs 1..T for every configuration.

        Returns:
            mean (N, T) float64 and covariance (N, T, T) float64 (noise σ_n² on the diagonal);
            configurations are independent of one another in this output (per-curve blocks of
            the joint posterior).
        """
        data = _Training.of(observations)
        y_obs = data.y
        p = _as_tensors(hyper, observations.x.shape[1], float(y_obs.mean()) if len(y_obs) else 0.5)
        horizon = observations.horizon
        grid = torch.arange(1, horizon + 1, dtype=torch.float64)
        k_tt = _time_kernel(grid, grid, p)  # k_x(x, x) = 1
        prior_cov = k_tt + p["noise"] * torch.eye(horizon, dtype=torch.float64)
        x_all = torch.from_numpy(observations.x)
        n = x_all.shape[0]
        if len(y_obs) == 0:
            mean = p["mean"].expand(n, horizon).clone()
            return mean, prior_cov.expand(n, horizon, horizon).clone()
        factor = _cholesky(data.covariance(p))
        weights = torch.cholesky_solve((y_obs - p["mean"])[:, None], factor)[:, 0]  # K⁻¹(y − m)
        k_time = _time_kernel(grid, data.t, p)  # (T, M)
        means, covs = [], []
        chunk = max(1, _CHUNK_ELEMENTS // (horizon * len(y_obs)))
        for start in range(0, n, chunk):
            block = squared_differences(x_all[start : start + chunk], data.x)
            k_x = matern52(block, p["lengthscales"])  # (C, M)
            cross = k_x[:, None, :] * k_time[None, :, :]  # (C, T, M)
            means.append(p["mean"] + cross @ weights)
            c = cross.shape[0]
            white = torch.linalg.solve_triangular(
                factor, cross.reshape(c * horizon, -1).T, upper=False
            )  # (M, C·T) = L⁻¹ K_*ᵀ
            white = white.T.reshape(c, horizon, -1)
            covs.append(prior_cov - white @ white.transpose(1, 2))
        return torch.cat(means), torch.cat(covs)

    def sample_curves(
        self, observations: CurveObservations, num_samples: int, generator: torch.Generator
    ) -> torch.Tensor:
        """(N, num_samples, T) float32 joint posterior-predictive curves, clipped to [0, 1]."""
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        mean, cov = self.posterior(observations, self.fit(observations))
        cov = 0.5 * (cov + cov.transpose(1, 2))
        factor = _cholesky(cov).to(torch.float32)  # (N, T, T); float64 up to here
        n, horizon = mean.shape
        z = torch.randn(n, num_samples, horizon, generator=generator, dtype=torch.float32)
        samples = mean.to(torch.float32)[:, None, :] + z @ factor.transpose(1, 2)  # (N, S, T)
        return samples.clamp_(0.0, 1.0)

    def __repr__(self) -> str:
        start = asdict(self.start)
        return f"FreezeThawGPSurrogate(start={start}, fit_iterations={self.fit_iterations})"
