"""The score-function gradient against exact gradients by enumeration (Bernoulli masks) and by
a peer's closed forms (truncated Gaussian, scipy), exactly and statistically."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from cads import BernoulliMasks, TruncatedGaussianRatios, score_function_gradient

N = 4
MASKS = torch.tensor(list(itertools.product((0.0, 1.0), repeat=N)), dtype=torch.float64)


def objective(masks: torch.Tensor) -> torch.Tensor:
    """Any non-linear function of a mask (a stand-in for a validation loss after training)."""
    weights = torch.tensor([0.7, -1.3, 0.4, 2.0], dtype=torch.float64)
    return torch.sin(masks @ weights) + 0.5 * masks[..., 0] * masks[..., 3] + 3.0


def exact_gradient(s: torch.Tensor) -> torch.Tensor:
    """∇_s Σ_m p(m|s) f(m), the expectation enumerated over all 2^n masks, by autograd."""
    s = s.clone().requires_grad_(True)
    expectation = (BernoulliMasks().log_prob(MASKS, s).exp() * objective(MASKS)).sum()
    (grad,) = torch.autograd.grad(expectation, s)
    return grad


S = torch.tensor([0.2, 0.5, 0.7, 0.9], dtype=torch.float64)


@pytest.mark.parametrize(
    ("baseline", "scale"), [("none", 1.0), ("leave_one_out", 1.0), ("mean", 0.5)]
)
def test_expectation_over_all_pairs_of_masks_is_exact(baseline, scale):
    """With K = 2 the estimator's expectation is a finite sum over the 16 × 16 pairs of masks:
    it equals the true gradient (the mean baseline shrinks it by (K − 1)/K = 1/2)."""
    dist = BernoulliMasks()
    probability = dist.log_prob(MASKS, S).exp()
    total = torch.zeros(N, dtype=torch.float64)
    for i, j in itertools.product(range(len(MASKS)), repeat=2):
        pair = MASKS[[i, j]]
        estimate = score_function_gradient(objective(pair), dist.score(pair, S), baseline)
        total += probability[i] * probability[j] * estimate
    torch.testing.assert_close(total, scale * exact_gradient(S), rtol=0, atol=1e-12)


def test_leave_one_out_unbiased_statistically():
    """K = 4, 20,000 independent estimates: their mean within 5 standard errors of the exact
    gradient in every coordinate (a false alarm has probability below 1e-5)."""
    dist = BernoulliMasks()
    generator = torch.Generator().manual_seed(0)
    draws = 20_000
    masks = dist.sample(S, 4 * draws, generator).view(draws, 4, N)
    values, scores = objective(masks), dist.score(masks.view(-1, N), S).view(draws, 4, N)
    # the estimator batched over the 20,000 draws (checked against the function on a few)
    centred = values - (values.sum(1, keepdim=True) - values) / 3
    estimates = (centred.unsqueeze(-1) * scores).mean(1)
    for i in range(50):
        torch.testing.assert_close(
            score_function_gradient(values[i], scores[i]), estimates[i], rtol=1e-12, atol=1e-12
        )
    error = (estimates.mean(0) - exact_gradient(S)).abs()
    standard_error = estimates.std(0) / math.sqrt(draws)
    assert (error < 5 * standard_error).all(), (error, standard_error)
    # and the baseline is worth having: less variance than no baseline on the same masks
    plain = (values.unsqueeze(-1) * scores).mean(1)
    assert (estimates.var(0) < plain.var(0)).all()


def test_bernoulli_sampler_frequencies():
    masks = BernoulliMasks().sample(S, 40_000, torch.Generator().manual_seed(1))
    # binomial standard error at 40,000 draws is at most 0.0025: 5 of them
    assert (masks.mean(0) - S).abs().max() < 5 * 0.0025


@pytest.mark.parametrize("sigma", [0.05, 0.1, 0.3])
def test_truncated_gaussian_against_scipy(sigma):
    stats = pytest.importorskip("scipy.stats")
    s = torch.tensor([0.0, 0.15, 0.5, 0.97], dtype=torch.float64)
    dist = TruncatedGaussianRatios(sigma)
    r = dist.sample(s, 20_000, torch.Generator().manual_seed(2))
    assert (r >= 0).all()
    assert (r <= 1).all()
    for j, centre in enumerate(s.tolist()):
        law = stats.truncnorm((0 - centre) / sigma, (1 - centre) / sigma, centre, sigma)
        # density: scipy's log-pdf, exactly the paper's formula
        grid = torch.linspace(0.01, 0.99, 7, dtype=torch.float64)
        ours = torch.stack([dist.log_prob(g.view(1, 1), s[j : j + 1]) for g in grid]).flatten()
        torch.testing.assert_close(
            ours, torch.tensor(law.logpdf(grid.numpy())), rtol=1e-10, atol=1e-10
        )
        # sampler: Kolmogorov-Smirnov against scipy's CDF
        assert stats.kstest(r[:, j].numpy(), law.cdf).pvalue > 1e-4
        # mean: scipy's, in closed form (not s_j: the truncation pulls it inwards)
        assert float(dist.mean(s)[j]) == pytest.approx(law.mean(), rel=1e-10, abs=1e-12)


def test_truncated_gaussian_score_is_the_derivative_of_log_prob():
    dist = TruncatedGaussianRatios(0.1)
    s = torch.tensor([0.02, 0.3, 0.6, 0.99], dtype=torch.float64, requires_grad=True)
    r = dist.sample(s.detach(), 5, torch.Generator().manual_seed(3))
    (autograd,) = torch.autograd.grad(dist.log_prob(r, s).sum(), s)
    torch.testing.assert_close(dist.score(r, s.detach()).sum(0), autograd, rtol=1e-10, atol=1e-10)


def test_truncated_gaussian_estimator_unbiased():
    """∇_s E[r²] from scipy's moments (finite differences) against the score-function mean."""
    stats = pytest.importorskip("scipy.stats")
    sigma, centre, h = 0.2, 0.35, 1e-5

    def second_moment(c):
        return stats.truncnorm((0 - c) / sigma, (1 - c) / sigma, c, sigma).moment(2)

    exact = (second_moment(centre + h) - second_moment(centre - h)) / (2 * h)
    dist = TruncatedGaussianRatios(sigma)
    s = torch.tensor([centre], dtype=torch.float64)
    r = dist.sample(s, 200_000, torch.Generator().manual_seed(4))
    terms = (r[:, 0] ** 2) * dist.score(r, s)[:, 0]
    error = abs(float(terms.mean()) - exact)
    assert error < 5 * float(terms.std()) / math.sqrt(len(terms))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: score_function_gradient(torch.ones(1), torch.ones(1, 3)), "at least 2"),
        (lambda: score_function_gradient(torch.ones(1), torch.ones(1, 3), "mean"), "zero"),
        (lambda: score_function_gradient(torch.ones(2), torch.ones(2, 3), "median"), "baseline"),
        (lambda: score_function_gradient(torch.tensor([1.0, math.nan]), torch.ones(2, 3)), "NaN"),
        (lambda: score_function_gradient(torch.ones(3), torch.ones(2, 3)), "one per draw"),
        (lambda: BernoulliMasks().score(torch.ones(2, 2), torch.tensor([0.0, 0.5])), "strictly"),
        (lambda: BernoulliMasks().sample(torch.tensor([0.5]), 0, None), "positive integer"),
        (lambda: TruncatedGaussianRatios(0.0), "sigma"),
    ],
)
def test_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()
