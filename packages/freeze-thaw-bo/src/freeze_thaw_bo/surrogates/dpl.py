"""DPL's deep power law (Kadra et al., NeurIPS 2023): an ensemble of MLPs that output power laws.

Each member maps an encoded configuration x to (α, β, γ) and predicts the *error* e = 1 − y of x
after epoch t as

    e(x, t) = α + β̃·(t/T)^(−γ̃),   β̃ = GLU([β, β]) = β·σ(β),   γ̃ = GLU([γ, γ]) = γ·σ(γ),

exactly the authors' `ConditionedPowerLaw` (budgets scaled to (0, 1] by the maximum budget T,
GLU activations on β and γ, none on α). DPL minimises errors; our values are maximised in [0, 1],
so it sees e = 1 − y (its `max_value − y` with max_value = 1) and returns y = 1 − e. The network
is the authors' default: Linear(D, 128) → LeakyReLU → Linear(128, 128) → LeakyReLU →
Linear(128, 3), no learning-curve CNN (`use_learning_curve=False`), trained on every observed
(x, t, y) with the L1 loss and Adam (lr 10⁻³), minibatches of 64.

Training schedule (a documented deviation): DPL trains each member from scratch for 250 epochs
for the first 10 iterations, then refines the previous weights for 20 epochs with the newest
observation added to every batch. Here every call trains from scratch for `train_steps` Adam steps
(default 250) on random minibatches, so the fit is a deterministic function of the observations
(an optimizer resumed from disk makes the same choices) and costs the same at every step. While at
most `batch_size` observations exist each step is a full batch, which is DPL's schedule exactly.
The members are trained as one batched network (stacked weights; the loss is the sum of the
members' losses, so each member's Adam update is the one it would get alone).

Uncertainty: DPL's predictive spread is the ensemble's (mean and standard deviation over members).
`sample_curves` returns joint curves whose sample paths are member curves: each path's member is
uniform over the ensemble, and the draws are balanced (the member counts differ by at most one),
so with `num_samples` a multiple of `ensemble_size` the sample mean and standard deviation are the
ensemble's exactly. Curves are not clipped to [0, 1] (a power law can leave it; DPL does not clip).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
import torch.nn.functional as F

from freeze_thaw_bo.surrogates.base import CurveObservations

__all__ = ["DPLSurrogate", "member_draws", "power_law_error"]


def power_law_error(parameters: torch.Tensor, epochs: torch.Tensor, horizon: int) -> torch.Tensor:
    """e = α + β̃·(t/T)^(−γ̃), elementwise: `parameters` (..., 3) = (α, β̃, γ̃), `epochs` t
    broadcastable to `parameters.shape[:-1]`."""
    alpha, beta, gamma = parameters.unbind(-1)
    return alpha + beta * (epochs.to(parameters.dtype) / horizon).pow(-gamma)


class _Ensemble:
    """`size` MLPs D → H → … → 3 with stacked weights (E, in, out), initialised like nn.Linear."""

    def __init__(self, size: int, dims: list[int], seeds: list[int]) -> None:
        self.weights: list[torch.Tensor] = []
        self.biases: list[torch.Tensor] = []
        generators = [torch.Generator().manual_seed(s) for s in seeds]
        for fan_in, fan_out in itertools.pairwise(dims):
            bound = 1.0 / math.sqrt(fan_in)  # kaiming_uniform(a=√5) and the bias rule of nn.Linear
            w, b = [], []
            for g in generators:
                w.append((torch.rand(fan_out, fan_in, generator=g) * 2 - 1) * bound)
                b.append((torch.rand(fan_out, generator=g) * 2 - 1) * bound)
            self.weights.append(torch.stack(w).transpose(1, 2).contiguous().requires_grad_(True))
            self.biases.append(torch.stack(b)[:, None, :].contiguous().requires_grad_(True))
        self.size = size

    def parameters(self) -> list[torch.Tensor]:
        return [*self.weights, *self.biases]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: (E, B, D) → (E, B, 3) = (α, β̃, γ̃) with DPL's GLU on β and γ."""
        h = x
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = torch.baddbmm(b, h, w)
            if i < last:
                h = F.leaky_relu(h)
        alpha, beta, gamma = h.unbind(-1)
        # GLU(cat(v, v)) = v·σ(v), the authors' `last_act_func(torch.cat((betas, betas)))`
        return torch.stack((alpha, beta * torch.sigmoid(beta), gamma * torch.sigmoid(gamma)), -1)


class DPLSurrogate:
    """An ensemble of deep power laws; sample paths are member curves.

    Args:
        ensemble_size: members (DPL's 5), each with its own initialisation and batch order.
        hidden_units: the MLP's width (DPL: 128).
        hidden_layers: the MLP's depth (DPL: 2).
        learning_rate: Adam's step size (DPL: 10⁻³).
        batch_size: minibatch size (DPL: 64).
        train_steps: Adam steps per member per fit, from scratch.
        seed: seeds the members' initialisations and minibatches.

    Example:
        >>> import numpy as np, torch
        >>> from freeze_thaw_bo.surrogates.base import CurveObservations
        >>> obs = CurveObservations(
        ...     np.array([[0.2], [0.7]]), (np.array([0.3, 0.5]), np.array([])), 5
        ... )
        >>> DPLSurrogate(train_steps=20).sample_curves(obs, 10, torch.Generator()).shape
        torch.Size([2, 10, 5])
    """

    def __init__(
        self,
        ensemble_size: int = 5,
        *,
        hidden_units: int = 128,
        hidden_layers: int = 2,
        learning_rate: float = 1e-3,
        batch_size: int = 64,
        train_steps: int = 250,
        seed: int = 0,
    ) -> None:
        for name, value in {
            "ensemble_size": ensemble_size,
            "hidden_units": hidden_units,
            "hidden_layers": hidden_layers,
            "batch_size": batch_size,
        }.items():
            if int(value) != value or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value}")
        if int(train_steps) != train_steps or train_steps < 0:
            raise ValueError(f"train_steps must be an integer >= 0, got {train_steps}")
        if not (math.isfinite(learning_rate) and learning_rate > 0):
            raise ValueError(f"learning_rate must be a finite number > 0, got {learning_rate}")
        self.ensemble_size = int(ensemble_size)
        self.hidden_units = int(hidden_units)
        self.hidden_layers = int(hidden_layers)
        self.learning_rate = float(learning_rate)
        self.batch_size = int(batch_size)
        self.train_steps = int(train_steps)
        self.seed = int(seed)

    def _member_seeds(self) -> list[int]:
        sequence = np.random.SeedSequence(self.seed)
        return [int(s.generate_state(1)[0]) for s in sequence.spawn(self.ensemble_size)]

    def fit(self, observations: CurveObservations) -> torch.Tensor:
        """Train the ensemble on every observation; (E, N, 3) float32 (α, β̃, γ̃) of each config."""
        if not isinstance(observations, CurveObservations):
            raise TypeError(f"expected CurveObservations, got {type(observations).__name__}")
        ids, epochs, values = observations.context()
        if ids.size == 0:
            raise ValueError("DPLSurrogate needs at least one observation to fit its power laws")
        horizon = observations.horizon
        x_all = torch.from_numpy(observations.x).to(torch.float32)
        x = x_all[torch.from_numpy(ids)]
        t = torch.from_numpy(epochs).to(torch.float32)
        err = 1.0 - torch.from_numpy(values).to(torch.float32)
        dims = [x_all.shape[1], *[self.hidden_units] * self.hidden_layers, 3]
        ensemble = _Ensemble(self.ensemble_size, dims, self._member_seeds())
        optimizer = torch.optim.Adam(ensemble.parameters(), lr=self.learning_rate, fused=True)
        batches = torch.Generator().manual_seed(self.seed)
        m, e = len(ids), self.ensemble_size
        full = m <= self.batch_size
        for _ in range(self.train_steps):
            if full:
                index = torch.arange(m).expand(e, m)
            else:
                index = torch.rand(e, m, generator=batches).argsort(dim=1)[:, : self.batch_size]
            optimizer.zero_grad(set_to_none=True)
            predicted = power_law_error(ensemble(x[index]), t[index], horizon)  # (E, B)
            loss = (predicted - err[index]).abs().mean(dim=1).sum()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            return ensemble(x_all.expand(e, *x_all.shape))

    def member_curves(self, observations: CurveObservations) -> torch.Tensor:
        """(E, N, T) float32: every member's predicted value curve y = 1 − e over epochs 1..T."""
        parameters = self.fit(observations)
        epochs = torch.arange(1, observations.horizon + 1)
        return 1.0 - power_law_error(parameters[..., None, :], epochs, observations.horizon)

    def sample_curves(
        self, observations: CurveObservations, num_samples: int, generator: torch.Generator
    ) -> torch.Tensor:
        """(N, num_samples, T) float32: path s is member k_s's curve for every configuration."""
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        curves = self.member_curves(observations)
        members = member_draws(self.ensemble_size, num_samples, generator)
        return curves[members].permute(1, 0, 2).contiguous()


def member_draws(ensemble_size: int, num_samples: int, generator: torch.Generator) -> torch.Tensor:
    """(num_samples,) members, each uniform over the ensemble, balanced (counts differ by ≤ 1)."""
    offset = int(torch.randint(ensemble_size, (1,), generator=generator))
    balanced = (torch.arange(num_samples) + offset) % ensemble_size
    return balanced[torch.randperm(num_samples, generator=generator)]
