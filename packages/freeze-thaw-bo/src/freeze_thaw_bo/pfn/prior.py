"""FT-PFN's learning-curve prior (ifBO's `ftpfn_prior.py`), seeded by a torch.Generator.

One *task* is a search space [0, 1]^D, a start value y₀ shared by every curve, and N
configurations. A random neural network maps each configuration to 23 numbers; each is turned
into a uniform draw and then into one curve parameter through that parameter's quantile function,
so configurations that are close in x get similar curves, and the network's random depth, width
and weight scale decide how sensitive the task is to its hyperparameters. A curve over the
normalised epoch x = t/T, t = 1..T, is a convex combination of four basis families, plus noise,
clipped to [0, 1].

What follows ifBO, and where it differs:

* Network (`MLP` in ifBO): tanh, 8-15 layers, 36-149 units, weights and biases N(0, s²) with
  s ~ U(0.089, 0.193), 14.5 % of hidden weights dropped (kept ones rescaled), pre-activation
  noise std ~ U(3e-4, 1.4e-3), output noise std ~ U(4e-4, 1.3e-3), inputs standardised by
  (x − 0.5)/√(1/12). Same here, computed for a whole batch of tasks at once.
* Output → uniform: ifBO passes each output through the empirical CDF of outputs collected from
  many random networks (a shipped table, `output_sorted.npy`). We use the exact distribution
  instead: given the last hidden layer h, each output is N(0, s²(‖h‖² + 1) + σ_out²) over the
  draw of the last layer's weights, so u = Φ(o / that std) is exactly uniform over tasks while
  configurations of one task stay correlated through h. No table to ship.
* Task start and ceiling: y₀ = min(u₁, u₂); y_max = max(u₁, u₂) with probability 1/4, else 1.
* Per configuration (in ifBO's output order): asymptote y∞ ~ U(y₀, y_max); mixture weights
  w ~ Dirichlet(1, 1, 1, 1); shapes α_pow4 = e^N(1, 1), α_exp = e^N(0, 1),
  α_log = 1 + e^N(−4, 1), α_hill = e^N(0.5, 0.5²); saturation point x_sat,f =
  10^N(0, 1) · r_f / max r, r_f ~ Exp(1); remaining gap at saturation 1/P_f with
  P_f = 10^U(0, 3); post-saturation rate ρ_f = 1 − Exp(1) (ρ < 0: the curve turns back down,
  ρ ≈ 0: flat, ρ ≈ 1: keeps improving); noise std σ = e^N(−5, 1) (ifBO's GP noise options are
  commented out there and absent here).
* Families, with Δ = y∞ − y₀ and y = y∞ − Δ·g(x) (each family leaves exactly Δ/P at x = x_sat):
  pow4 g = (1 + (P^{1/α} − 1)·x/x_sat)^{−α}; exp g = P^{−(x/x_sat)^α};
  log-power (ifBO's "log") g = ln α / ln(α + (α^P − α)·x/x_sat);
  hill-3 g = 1 / (1 + (P − 1)·(x/x_sat)^α).
  Past saturation the clock runs at rate ρ: x' = x_sat + ρ·(x − x_sat). Where x' ≤ 0 (strong
  divergence) the curve leaves y₀ with an exponential tail y₀·exp(x'·g'/y₀), g' the family's slope
  just after the start (ifBO takes a finite difference at 10⁻⁹; we use the analytic derivative at
  the same point, capped at 10¹²). The log-power family is evaluated in log space (ifBO computes
  α^P directly).
* Configurations are uniform in [0, 1]^D; D, T and N are drawn per batch by
  `sample_training_batch` (ifBO: D uniform, T = round(10^U(0, 3)) epochs; here T and N
  log-uniform up to the model's `max_horizon` and `max_configs`).

Example:
    >>> import torch
    >>> tasks = sample_prior_tasks(2, 5, 20, 3, torch.Generator().manual_seed(0))
    >>> tasks.curves.shape
    torch.Size([2, 5, 20])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from freeze_thaw_bo.pfn.batch import CurveBatch, cut_tasks

__all__ = [
    "FAMILIES",
    "CurvePriorConfig",
    "PriorTasks",
    "family_curves",
    "log_uniform_int",
    "sample_prior_tasks",
    "sample_training_batch",
]

FAMILIES = ("pow4", "exp", "log_power", "hill")
NUM_PARAMETERS = (
    23  # y∞, 4 weights, 4 shapes, saturation scale, 4 relative, 4 precisions, 4 rates, σ
)
_SLOPE_AT = 1e-9  # where the start slope of a family is taken (ifBO's finite-difference step)
_MAX_SLOPE = 1e12


@dataclass(frozen=True)
class CurvePriorConfig:
    """Which curves the prior draws and how tasks are shaped for training.

    Attributes:
        families: basis families allowed in the mixture (a subset of `FAMILIES`).
        noise: whether to add observation noise.
        max_dim_x: D is drawn uniformly from 1..max_dim_x per batch.
        min_horizon, max_horizon: T is drawn log-uniformly from this range per batch.
        max_configs: N is drawn log-uniformly from 1..max_configs per batch.
        start_known_prob: chance that a task shows the model its start value y₀.
    """

    families: tuple[str, ...] = FAMILIES
    noise: bool = True
    max_dim_x: int = 16
    min_horizon: int = 3
    max_horizon: int = 128
    max_configs: int = 100
    start_known_prob: float = 0.5

    def __post_init__(self) -> None:
        unknown = set(self.families) - set(FAMILIES)
        if not self.families or unknown:
            raise ValueError(
                f"families must be a non-empty subset of {FAMILIES}, got {self.families}"
            )
        if self.max_dim_x < 1 or self.max_configs < 1:
            raise ValueError(
                f"max_dim_x and max_configs must be >= 1, got {self.max_dim_x}, {self.max_configs}"
            )
        if not 1 <= self.min_horizon <= self.max_horizon:
            raise ValueError(
                f"need 1 <= min_horizon <= max_horizon, got {self.min_horizon}, {self.max_horizon}"
            )
        if not 0.0 <= self.start_known_prob <= 1.0:
            raise ValueError(f"start_known_prob must lie in [0, 1], got {self.start_known_prob}")


@dataclass(frozen=True)
class PriorTasks:
    """Tasks drawn from the prior.

    Attributes:
        x: (B, N, D) float32 configurations in [0, 1]^D.
        curves: (B, N, T) float32 values at epochs 1..T, in [0, 1].
        y_start: (B,) float32 the value every curve starts from (epoch 0).
        params: float64 curve parameters: "y_inf", "noise_std" (B, N); "weights", "alpha",
            "x_sat", "prec", "r_post" (B, N, 4) in `FAMILIES` order; "y_max" (B,).
    """

    x: torch.Tensor
    curves: torch.Tensor
    y_start: torch.Tensor
    params: dict[str, torch.Tensor] = field(default_factory=dict)


def _random_network_uniforms(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """(B, N, 23) float64 uniforms from one random tanh network per task (see module docstring)."""
    b, n, d = x.shape
    max_width, max_hidden_layers = 149, 13

    def uniform(low: float, high: float, *shape: int) -> torch.Tensor:
        return low + (high - low) * torch.rand(*shape, generator=generator)

    def normal(*shape: int) -> torch.Tensor:  # float32: 10x faster to draw than float64
        return torch.randn(*shape, generator=generator)

    width = torch.randint(36, 150, (b,), generator=generator)
    hidden_layers = torch.randint(8, 16, (b,), generator=generator) - 2
    std = uniform(0.089, 0.193, b)[:, None, None]
    pre_noise = uniform(3e-4, 1.4e-3, b)[:, None, None]
    out_noise = uniform(4e-4, 1.3e-3, b)[:, None, None]
    unit_mask = (torch.arange(max_width)[None, :] < width[:, None]).to(torch.float32)[:, None, :]
    keep = 1.0 - 0.145

    def layer(h: torch.Tensor, fan_in: int, fan_out: int, sparse: bool) -> torch.Tensor:
        weight = std * normal(b, fan_in, fan_out)
        if sparse:
            drop = torch.rand(b, fan_in, fan_out, generator=generator) < keep
            weight = weight * drop / math.sqrt(keep)
        return h @ weight + std * normal(b, 1, fan_out)

    z = (x - 0.5) / math.sqrt(1.0 / 12.0)
    h = torch.tanh(layer(z, d, max_width, False) + pre_noise * normal(b, n, max_width)) * unit_mask
    for i in range(max_hidden_layers):
        new = torch.tanh(layer(h, max_width, max_width, True) + pre_noise * normal(b, n, max_width))
        active = (i < hidden_layers).to(torch.float32)[:, None, None]
        h = active * new * unit_mask + (1.0 - active) * h
    out = layer(h, max_width, NUM_PARAMETERS, False) + out_noise * normal(b, n, NUM_PARAMETERS)
    scale = torch.sqrt(std**2 * (h.square().sum(-1, keepdim=True) + 1.0) + out_noise**2)
    u = 0.5 * torch.erfc(-(out / scale).double() / math.sqrt(2.0))
    return u.clamp(1e-6, 1.0 - 1e-6)


def _parameters(
    u: torch.Tensor, y_start: torch.Tensor, y_max: torch.Tensor, families: tuple[str, ...]
) -> dict[str, torch.Tensor]:
    """Curve parameters from the network's uniforms u (B, N, 23), in ifBO's output order."""

    def gauss(v: torch.Tensor) -> torch.Tensor:
        return math.sqrt(2.0) * torch.erfinv(2.0 * v - 1.0)

    def exponential(v: torch.Tensor) -> torch.Tensor:
        return -torch.log1p(-v)

    allowed = torch.tensor([f in families for f in FAMILIES], dtype=torch.float64)
    weights = exponential(u[..., 1:5]) * allowed
    relative = exponential(u[..., 10:14])
    x_sat_max = 10.0 ** gauss(u[..., 9:10])
    y0, ymax = y_start[:, None], y_max[:, None]
    return {
        "y_inf": y0 + (ymax - y0) * u[..., 0],
        "weights": weights / weights.sum(-1, keepdim=True),
        "alpha": torch.stack(
            [
                torch.exp(1.0 + gauss(u[..., 5])),
                torch.exp(gauss(u[..., 6])),
                1.0 + torch.exp(-4.0 + gauss(u[..., 7])),
                torch.exp(0.5 + 0.5 * gauss(u[..., 8])),
            ],
            dim=-1,
        ),
        "x_sat": x_sat_max * relative / relative.amax(-1, keepdim=True),
        "prec": 10.0 ** (3.0 * u[..., 14:18]),
        "r_post": 1.0 - exponential(u[..., 18:22]),
        "noise_std": torch.exp(-5.0 + gauss(u[..., 22])),
    }


def _gaps_and_slopes(
    x: torch.Tensor, x_sat: torch.Tensor, alpha: torch.Tensor, prec: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Remaining-gap fractions g_f(x) and start slopes g_f'(0⁺)/(-1), each (..., 4), for x ≥ 0."""
    log_p = torch.log(prec)
    a_pow, a_exp, a_log, a_hill = alpha.unbind(-1)
    s_pow, s_exp, s_log, s_hill = x_sat.unbind(-1)
    p_pow, p_exp, p_log, p_hill = log_p.unbind(-1)
    e = torch.full_like(s_pow, _SLOPE_AT)

    rate_pow = torch.expm1(p_pow / a_pow) / s_pow

    def pow4(v: torch.Tensor) -> torch.Tensor:
        return torch.exp(-a_pow * torch.log1p(rate_pow * v))

    def exp(v: torch.Tensor) -> torch.Tensor:
        return torch.exp(-p_exp * (v / s_exp) ** a_exp)

    log_a = torch.log(a_log)
    # ln(α + (α^P − α)·v/x_sat) = ln α + ln(1 + (α^{P−1} − 1)·v/x_sat)
    rate_log = torch.expm1((torch.exp(p_log) - 1.0) * log_a) / s_log

    def log_power(v: torch.Tensor) -> torch.Tensor:
        return log_a / (log_a + torch.log1p(rate_log * v))

    rate_hill = torch.expm1(p_hill) / s_hill**a_hill

    def hill(v: torch.Tensor) -> torch.Tensor:
        return 1.0 / (1.0 + rate_hill * v**a_hill)

    gaps = torch.stack([f(x[..., i]) for i, f in enumerate((pow4, exp, log_power, hill))], -1)
    slopes = torch.stack(
        [
            a_pow * rate_pow * (1.0 + rate_pow * e) ** (-a_pow - 1.0),
            exp(e) * p_exp * a_exp * (e / s_exp) ** (a_exp - 1.0) / s_exp,
            log_a * rate_log / ((1.0 + rate_log * e) * (log_a + torch.log1p(rate_log * e)) ** 2),
            rate_hill * a_hill * e ** (a_hill - 1.0) / (1.0 + rate_hill * e**a_hill) ** 2,
        ],
        dim=-1,
    )
    return gaps, slopes.nan_to_num(_MAX_SLOPE).clamp(0.0, _MAX_SLOPE)


def family_curves(
    x: torch.Tensor,
    y_start: torch.Tensor,
    y_inf: torch.Tensor,
    x_sat: torch.Tensor,
    alpha: torch.Tensor,
    prec: torch.Tensor,
    r_post: torch.Tensor,
) -> torch.Tensor:
    """(..., T, 4) noise-free basis curves in `FAMILIES` order, float64.

    Args:
        x: (T,) normalised epochs (t/T). y_start, y_inf: (...) start and asymptote.
        x_sat, alpha, prec, r_post: (..., 4) per-family saturation point, shape, precision P
            (gap left at x_sat is Δ/P), and post-saturation rate.
    """
    x = x.to(torch.float64)
    shape = (*x_sat.shape[:-1], x.numel(), 4)
    xx = x[:, None].expand(shape)
    sat, rate = x_sat[..., None, :], r_post[..., None, :]
    clock = torch.where(xx < sat, xx, sat + rate * (xx - sat))
    gaps, slopes = _gaps_and_slopes(
        clock.clamp_min(0.0),
        sat.expand(shape),
        alpha[..., None, :].expand(shape),
        prec[..., None, :].expand(shape),
    )
    y0, yinf = y_start[..., None, None], y_inf[..., None, None]
    delta = yinf - y0
    tail = y0 * torch.exp(clock * delta * slopes / y0.clamp_min(1e-12))
    return torch.where(clock > 0, yinf - delta * gaps, tail)


def sample_prior_tasks(
    num_tasks: int,
    num_configs: int,
    horizon: int,
    dim_x: int,
    generator: torch.Generator,
    config: CurvePriorConfig | None = None,
) -> PriorTasks:
    """Draw `num_tasks` tasks of `num_configs` curves over epochs 1..`horizon` in [0, 1]^dim_x.

    Deterministic given the generator's state (CPU generator).
    """
    config = config or CurvePriorConfig()
    if min(num_tasks, num_configs, horizon, dim_x) < 1:
        raise ValueError(
            "num_tasks, num_configs, horizon and dim_x must be >= 1, got "
            f"{num_tasks}, {num_configs}, {horizon}, {dim_x}"
        )
    if not isinstance(generator, torch.Generator):
        raise TypeError("generator must be a torch.Generator")
    x = torch.rand(num_tasks, num_configs, dim_x, generator=generator)
    u1, u2 = torch.rand(2, num_tasks, generator=generator, dtype=torch.float64)
    y_start = torch.minimum(u1, u2)
    capped = torch.rand(num_tasks, generator=generator, dtype=torch.float64) < 0.25
    y_max = torch.where(capped, torch.maximum(u1, u2), torch.ones_like(u1))
    params = _parameters(_random_network_uniforms(x, generator), y_start, y_max, config.families)
    epochs = torch.arange(1, horizon + 1, dtype=torch.float64) / horizon
    basis = family_curves(
        epochs,
        y_start[:, None],
        params["y_inf"],
        params["x_sat"],
        params["alpha"],
        params["prec"],
        params["r_post"],
    )
    curves = (basis * params["weights"][..., None, :]).sum(-1)
    if config.noise:
        noise = torch.randn(curves.shape, generator=generator).double()
        curves = curves + params["noise_std"][..., None] * noise
    params["y_max"] = y_max
    return PriorTasks(
        x=x,
        curves=curves.clamp(0.0, 1.0).to(torch.float32),
        y_start=y_start.to(torch.float32),
        params=params,
    )


def log_uniform_int(low: int, high: int, generator: torch.Generator) -> int:
    """An integer in [low, high], log-uniformly distributed."""
    u = float(torch.rand(1, generator=generator))
    return min(high, max(low, round(math.exp(math.log(low) + u * math.log(high / low)))))


def sample_training_batch(
    batch_size: int,
    generator: torch.Generator,
    *,
    max_context: int,
    num_queries: int,
    config: CurvePriorConfig | None = None,
) -> CurveBatch:
    """A PFN training batch: `batch_size` prior tasks cut into context and queries.

    D is uniform on 1..max_dim_x, T log-uniform on [min_horizon, max_horizon] and N log-uniform
    on [1, max_configs], shared by the batch; the cut is `cut_tasks` (context ≤ `max_context`
    tokens, ≤ `num_queries` queries). The start value is shown with `start_known_prob`.

    Example:
        >>> import torch
        >>> batch = sample_training_batch(
        ...     4, torch.Generator().manual_seed(0), max_context=50, num_queries=20
        ... )
        >>> batch.y_query.shape[0]
        4
    """
    config = config or CurvePriorConfig()
    dim_x = int(torch.randint(1, config.max_dim_x + 1, (1,), generator=generator))
    horizon = log_uniform_int(config.min_horizon, config.max_horizon, generator)
    num_configs = log_uniform_int(1, config.max_configs, generator)
    tasks = sample_prior_tasks(batch_size, num_configs, horizon, dim_x, generator, config)
    start_known = torch.rand(batch_size, generator=generator) < config.start_known_prob
    return cut_tasks(
        tasks.x,
        tasks.curves,
        tasks.y_start,
        start_known,
        generator,
        max_context=max_context,
        num_queries=num_queries,
    )
