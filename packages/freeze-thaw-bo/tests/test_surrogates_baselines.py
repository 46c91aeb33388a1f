"""The baselines' surrogates: the freeze-thaw GP against dense formulas; DPL's power laws."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal

from freeze_thaw_bo.surrogates.base import CurveObservations, CurveSurrogate
from freeze_thaw_bo.surrogates.dpl import DPLSurrogate, member_draws, power_law_error
from freeze_thaw_bo.surrogates.gp import FreezeThawGPSurrogate, GPHyperparameters


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small tensors: one thread is faster, and the shared CI cores are not oversubscribed."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


GLU_MINIMUM = -0.27846  # min_v v·σ(v), at v ≈ −1.2785


# ------------------------------------------------------------------------------------ the GP


def _dense_kernel(xa, ta, xb, tb, h: GPHyperparameters) -> np.ndarray:
    """The product kernel written out in numpy, independently of the torch code."""
    scales = h.lengthscale_vector(xa.shape[1])
    r = np.sqrt((((xa[:, None, :] - xb[None, :, :]) / scales) ** 2).sum(-1))
    k_x = (1 + math.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-math.sqrt(5) * r)
    k_t = h.beta**h.alpha / (ta[:, None] + tb[None, :] + h.beta) ** h.alpha
    return k_x * (h.asymptote_variance + h.decay_variance * k_t)


def _tiny_observations() -> CurveObservations:
    x = np.array([[0.1, 0.8], [0.5, 0.4], [0.9, 0.3]])
    curves = (np.array([0.40, 0.55, 0.61]), np.array([0.30]), np.array([]))
    return CurveObservations(x, curves, horizon=4)


HYPER = GPHyperparameters(
    lengthscales=(0.7, 0.4),
    mean=0.5,
    asymptote_variance=0.03,
    decay_variance=0.4,
    alpha=1.3,
    beta=2.0,
    noise=1e-3,
)


def test_gp_posterior_matches_the_dense_formula():
    obs = _tiny_observations()
    mean, cov = FreezeThawGPSurrogate(fit_iterations=0).posterior(obs, HYPER)
    ids, epochs, y = obs.context()
    x_o, t_o = obs.x[ids], epochs.astype(float)
    n, horizon = obs.num_configs, obs.horizon
    x_p = np.repeat(obs.x, horizon, axis=0)
    t_p = np.tile(np.arange(1.0, horizon + 1), n)
    k_oo = _dense_kernel(x_o, t_o, x_o, t_o, HYPER) + HYPER.noise * np.eye(len(y))
    k_po = _dense_kernel(x_p, t_p, x_o, t_o, HYPER)
    k_pp = _dense_kernel(x_p, t_p, x_p, t_p, HYPER) + HYPER.noise * np.eye(len(t_p))
    dense_mean = HYPER.mean + k_po @ np.linalg.solve(k_oo, y - HYPER.mean)
    dense_cov = k_pp - k_po @ np.linalg.solve(k_oo, k_po.T)
    np.testing.assert_allclose(mean.numpy(), dense_mean.reshape(n, horizon), atol=1e-10)
    for c in range(n):
        block = dense_cov[c * horizon : (c + 1) * horizon, c * horizon : (c + 1) * horizon]
        np.testing.assert_allclose(cov[c].numpy(), block, atol=1e-10)


def test_gp_without_observations_is_its_prior():
    obs = CurveObservations(np.array([[0.2, 0.2]]), (np.array([]),), horizon=3)
    mean, cov = FreezeThawGPSurrogate(fit_iterations=0).posterior(obs, HYPER)
    t = np.arange(1.0, 4.0)
    prior = _dense_kernel(obs.x[[0, 0, 0]], t, obs.x[[0, 0, 0]], t, HYPER) + HYPER.noise * np.eye(3)
    np.testing.assert_allclose(mean.numpy(), np.full((1, 3), 0.5))
    np.testing.assert_allclose(cov[0].numpy(), prior, atol=1e-12)


def test_gp_fit_raises_the_marginal_likelihood():
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(6, 2))
    epochs = np.arange(1, 7)
    curves = tuple(
        0.8
        - 0.3 * x[n, 0]
        - 0.3 * np.exp(-epochs[: 2 + n % 4] / 2)
        + 0.01 * rng.normal(size=2 + n % 4)
        for n in range(6)
    )
    obs = CurveObservations(x, curves, horizon=6)
    ids, t, y = obs.context()

    def log_likelihood(h: GPHyperparameters) -> float:  # scipy as the oracle
        k = _dense_kernel(x[ids], t.astype(float), x[ids], t.astype(float), h)
        return multivariate_normal.logpdf(
            y, mean=np.full(len(y), h.mean), cov=k + h.noise * np.eye(len(y))
        )

    surrogate = FreezeThawGPSurrogate(fit_iterations=40)
    fitted = surrogate.fit(obs)
    start = FreezeThawGPSurrogate(fit_iterations=0).fit(obs)
    assert start.mean == pytest.approx(y.mean())
    assert log_likelihood(fitted) > log_likelihood(start) + 1.0
    assert fitted == surrogate.fit(obs), "a refit of the same data must give the same model"


def test_gp_samples_follow_the_posterior_jointly():
    obs = _tiny_observations()
    hyper = replace(HYPER, asymptote_variance=0.005, decay_variance=0.02)
    surrogate = FreezeThawGPSurrogate(start=hyper, fit_iterations=0)
    assert isinstance(surrogate, CurveSurrogate)
    num = 40_000
    samples = surrogate.sample_curves(obs, num, torch.Generator().manual_seed(0)).double()
    assert samples.shape == (3, num, 4)
    assert samples.min() >= 0.0
    assert samples.max() <= 1.0
    mean, cov = surrogate.posterior(obs, hyper)
    # the posterior stays well inside [0, 1] here (|mean − 0.5| + 4 sd < 0.5), so clipping is rare
    sd = cov.diagonal(dim1=1, dim2=2).sqrt()
    assert ((mean - 0.5).abs() + 4 * sd < 0.5).all()
    np.testing.assert_allclose(samples.mean(1), mean, atol=float(5 * sd.max() / math.sqrt(num)))
    centred = samples - samples.mean(1, keepdim=True)
    empirical = centred.transpose(1, 2) @ centred / num  # (N, T, T): the paths are joint
    # sd of a sample covariance entry ≤ sqrt(2)·σ_i·σ_j/√S for Gaussians
    tolerance = 5 * math.sqrt(2) * float(sd.max()) ** 2 / math.sqrt(num)
    np.testing.assert_allclose(empirical, cov, atol=tolerance)


def test_gp_rejects_bad_settings():
    with pytest.raises(ValueError, match="noise"):
        GPHyperparameters(noise=0.0)
    with pytest.raises(ValueError, match="lengthscales"):
        GPHyperparameters(lengthscales=(1.0, -1.0))
    with pytest.raises(ValueError, match="fit_iterations"):
        FreezeThawGPSurrogate(fit_iterations=-1)
    with pytest.raises(ValueError, match="2 lengthscales"):
        FreezeThawGPSurrogate(fit_iterations=0).posterior(
            CurveObservations(np.zeros((1, 3)), (np.array([0.5]),), 2), HYPER
        )
    with pytest.raises(ValueError, match="num_samples"):
        FreezeThawGPSurrogate().sample_curves(_tiny_observations(), 0, torch.Generator())


# ------------------------------------------------------------------------------------ DPL

TRUE_LAWS = torch.tensor([[0.10, 0.10, 0.5], [0.25, 0.05, 0.8]], dtype=torch.float64)  # (α, β̃, γ̃)
HORIZON = 12


def _power_law_observations() -> tuple[CurveObservations, torch.Tensor]:
    epochs = torch.arange(1, HORIZON + 1, dtype=torch.float64)
    errors = TRUE_LAWS[:, 0:1] + TRUE_LAWS[:, 1:2] * (epochs / HORIZON) ** (-TRUE_LAWS[:, 2:3])
    obs = CurveObservations(np.array([[0.2], [0.8]]), tuple((1 - errors).numpy()), HORIZON)
    return obs, errors


def test_dpl_power_law_is_dpls_parametrisation():
    parameters = torch.tensor([[0.2, 0.3, 0.5]])
    epochs = torch.tensor([4.0])
    expected = 0.2 + 0.3 * (4 / 8) ** (-0.5)
    assert float(power_law_error(parameters, epochs, 8)) == pytest.approx(expected)


def test_dpl_recovers_an_exact_power_law():
    """Every member either fits the noise-free curves (then its parameters are the true ones up to
    the first-order propagation of its residual, |Δθ| ≤ ‖J⁺‖·‖r‖) or sits at the GLU's lower
    bound, where DPL's β̃ = β·σ(β) and γ̃ = γ·σ(γ) have no gradient (a known trap of the
    parametrisation: the shape α − 0.278·(t/T)^δ)."""
    obs, errors = _power_law_observations()
    surrogate = DPLSurrogate(train_steps=2000, seed=1)
    fitted = surrogate.fit(obs).double()  # (E, N, 3)
    epochs = torch.arange(1, HORIZON + 1, dtype=torch.float64)
    scaled = epochs / HORIZON
    curves = fitted[..., 0:1] + fitted[..., 1:2] * scaled ** (-fitted[..., 2:3])  # (E, N, T)
    recovered = 0
    for member in range(surrogate.ensemble_size):
        residual = curves[member] - errors
        if residual.abs().max() < 0.025:  # Adam (lr 1e-3) on an L1 loss hovers at this scale
            recovered += 1
            for n, (_alpha, beta, gamma) in enumerate(TRUE_LAWS):
                jacobian = torch.stack(
                    [
                        torch.ones_like(scaled),
                        scaled**-gamma,
                        -beta * scaled.log() * scaled**-gamma,
                    ],
                    dim=1,
                )
                bound = 1.5 * torch.linalg.pinv(jacobian).norm(2) * residual[n].norm()
                error = (fitted[member, n] - TRUE_LAWS[n]).abs().max()
                assert error <= bound, (member, n, float(error), float(bound))
                assert error < 0.1
        else:
            assert fitted[member, :, 1:].min() < GLU_MINIMUM + 0.01, f"member {member} is stuck"
    assert recovered >= 3
    assert torch.equal(surrogate.fit(obs).double(), fitted), "fits must be deterministic"


def test_dpl_bounds_gamma_below_by_the_glu():
    """A rising error e = 0.2 + 0.5·t/T needs γ̃ = −1; DPL's γ̃ = γ·σ(γ) cannot go below the GLU's
    minimum, so every member pins γ̃ there (a linear output layer would reach −1)."""
    t = np.arange(1, 11) / 10
    obs = CurveObservations(np.array([[0.5]]), (1 - (0.2 + 0.5 * t),), 10)
    fitted = DPLSurrogate(train_steps=300).fit(obs)
    np.testing.assert_allclose(fitted[:, 0, 2], GLU_MINIMUM, atol=1e-3)


def test_dpl_samples_are_whole_member_curves():
    obs, _ = _power_law_observations()
    surrogate = DPLSurrogate(ensemble_size=3, train_steps=15, seed=0)
    members = surrogate.member_curves(obs)  # (E, N, T)
    samples = surrogate.sample_curves(obs, 12, torch.Generator().manual_seed(3))
    assert samples.shape == (2, 12, HORIZON)
    counts = np.zeros(3, dtype=int)
    for s in range(12):
        matches = [k for k in range(3) if torch.equal(samples[:, s], members[k])]
        assert len(matches) >= 1, "a sample path must be one member's curve for every config"
        counts[matches[0]] += 1
    np.testing.assert_array_equal(counts, [4, 4, 4])  # S a multiple of E: every member equally
    np.testing.assert_allclose(samples.mean(1), members.mean(0), atol=1e-6)
    np.testing.assert_allclose(
        samples.std(1, correction=0), members.std(0, correction=0), atol=1e-6
    )


def test_member_draws_are_uniform_and_balanced():
    draws = torch.stack([member_draws(5, 7, torch.Generator().manual_seed(s)) for s in range(2000)])
    for row in draws[:50]:
        counts = torch.bincount(row, minlength=5)
        assert int(counts.max() - counts.min()) <= 1
    frequency = torch.bincount(draws.flatten(), minlength=5).double() / draws.numel()
    sd = math.sqrt(0.2 * 0.8 / 2000)  # per path; paths within a row are negatively correlated
    np.testing.assert_allclose(frequency, 0.2, atol=5 * sd)
    first = torch.bincount(draws[:, 0], minlength=5).double() / 2000  # one path's member
    np.testing.assert_allclose(first, 0.2, atol=5 * sd)


def test_dpl_rejects_bad_input():
    with pytest.raises(ValueError, match="at least one observation"):
        DPLSurrogate().fit(CurveObservations(np.zeros((2, 1)), (np.array([]), np.array([])), 3))
    with pytest.raises(ValueError, match="ensemble_size"):
        DPLSurrogate(ensemble_size=0)
    with pytest.raises(ValueError, match="learning_rate"):
        DPLSurrogate(learning_rate=-1.0)
    with pytest.raises(TypeError, match="CurveObservations"):
        DPLSurrogate().fit({"x": 1})
