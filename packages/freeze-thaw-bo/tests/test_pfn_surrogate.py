"""The learning-curve PFN as a surrogate: sampling, context caps, bad input, shipped weights.

Oracles: the predicted bar distribution itself (one-sample KS with the DKW bound), the
comonotone construction (rank-consistent paths), held-out prior and real curves (coverage).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pfn_fixtures import TINY, dkw, generator, ks_to_cdf, one_thread
from pfn_fixtures import tiny_model as trained_tiny_model

from freeze_thaw_bo.pfn import checkpoint
from freeze_thaw_bo.pfn.bar import BarDistribution
from freeze_thaw_bo.pfn.batch import CurveBatch, cut_tasks
from freeze_thaw_bo.pfn.checkpoint import load_default_pfn
from freeze_thaw_bo.pfn.model import LearningCurvePFN
from freeze_thaw_bo.pfn.prior import sample_prior_tasks
from freeze_thaw_bo.pfn.train import FinetuneConfig, evaluate_nll, finetune_pfn, prior_batches
from freeze_thaw_bo.surrogates.base import CurveObservations, CurveSurrogate
from freeze_thaw_bo.surrogates.pfn import PFNSurrogate, thin_context


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from one_thread()


@pytest.fixture(scope="module")
def tiny_model(_one_thread) -> LearningCurvePFN:
    return trained_tiny_model()


def _observations(
    seed: int = 0, lengths: tuple[int, ...] = (0, 1, 3, 7, 12, 20), horizon: int = 20, dim: int = 3
) -> CurveObservations:
    tasks = sample_prior_tasks(1, len(lengths), horizon, dim, generator(seed))
    curves = tuple(tasks.curves[0, i, :k].double().numpy() for i, k in enumerate(lengths))
    return CurveObservations(x=tasks.x[0].double().numpy(), curves=curves, horizon=horizon)


def test_surrogate_shapes_and_observed_epochs(tiny_model) -> None:
    surrogate = PFNSurrogate(tiny_model)
    assert isinstance(surrogate, CurveSurrogate)
    obs = _observations()
    samples = surrogate.sample_curves(obs, 50, generator(0))
    assert samples.shape == (6, 50, 20)
    assert samples.dtype == torch.float32
    assert torch.equal(samples, surrogate.sample_curves(obs, 50, generator(0)))
    for n, curve in enumerate(obs.curves):
        expected = torch.as_tensor(curve, dtype=torch.float32).expand(50, -1)
        assert torch.equal(samples[n, :, : curve.size], expected)
    assert samples.min() >= 0
    assert samples.max() <= 1
    assert surrogate.predict_logits(obs).shape == (6, 20, TINY.num_bars)
    quantiles = surrogate.quantiles(obs, [0.1, 0.5, 0.9])
    assert quantiles.shape == (6, 20, 3)
    assert (quantiles[..., 1:] >= quantiles[..., :-1]).all()
    empty = CurveObservations(x=np.zeros((0, 3)), curves=(), horizon=20)
    assert surrogate.sample_curves(empty, 5, generator(0)).shape == (0, 5, 20)
    known_start = PFNSurrogate(tiny_model, initial_value=0.1).predict_logits(obs)
    assert (known_start - surrogate.predict_logits(obs)).abs().max() > 1e-3


def test_quantile_paths_are_rank_consistent(tiny_model) -> None:
    obs = _observations(1)
    for sampling, consistent in (("quantile", True), ("marginal", False)):
        samples = PFNSurrogate(tiny_model, sampling=sampling).sample_curves(obs, 200, generator(2))
        order = torch.argsort(samples[:, :, -1], dim=1)
        ranked = torch.gather(samples, 1, order[:, :, None].expand_as(samples))
        assert bool((ranked[:, 1:] >= ranked[:, :-1]).all()) == consistent


def test_marginal_and_quantile_sampling_share_marginals(tiny_model) -> None:
    """Both samplers draw every epoch from the predicted bar distribution (one-sample KS)."""
    obs = _observations(3)
    logits = PFNSurrogate(tiny_model).predict_logits(obs)
    cells = [(n, t) for n, c in enumerate(obs.curves) for t in range(c.size, obs.horizon)]
    s = 4000
    bound = dkw(s, 1e-3 / (2 * len(cells)))  # Bonferroni over cells and both samplers
    bar = tiny_model.bar
    for sampling in ("quantile", "marginal"):
        samples = PFNSurrogate(tiny_model, sampling=sampling).sample_curves(obs, s, generator(4))
        values = torch.stack([torch.sort(samples[n, :, t]).values for n, t in cells])
        cell_logits = torch.stack([logits[n, t] for n, t in cells])
        cdf = bar.cdf(cell_logits[:, None, :].expand(-1, s, -1), values)
        assert float(ks_to_cdf(values, cdf).max()) < bound


def test_average_draws_shrink_variance_fivefold(tiny_model) -> None:
    """The authors average 5 marginal draws per sample: variance / 5 (relative SE ≈ 3 %)."""
    obs = _observations(5)
    plain = PFNSurrogate(tiny_model, sampling="marginal").sample_curves(obs, 4000, generator(6))
    averaged = PFNSurrogate(tiny_model, sampling="marginal", average_draws=5).sample_curves(
        obs, 4000, generator(7)
    )
    ratio = averaged[0].var(0) / plain[0].var(0)  # configuration 0 has no observations
    assert float(ratio.mean()) == pytest.approx(0.2, rel=0.1)


def test_context_overflow_thins_with_a_warning_or_raises(tiny_model) -> None:
    lengths = (20, 20, 20, 20, 5, 0)  # 85 observations, the tiny model takes 60
    obs = _observations(8, lengths)
    with pytest.warns(RuntimeWarning, match="context cap"):
        samples = PFNSurrogate(tiny_model).sample_curves(obs, 10, generator(0))
    assert samples.shape == (6, 10, 20)
    with pytest.raises(ValueError, match="context cap"):
        PFNSurrogate(tiny_model, context_overflow="raise").sample_curves(obs, 10, generator(0))
    kept = thin_context(np.array(lengths), 60)
    assert sum(k.size for k in kept) == 60
    assert [k.size for k in kept][4:] == [5, 0]
    assert all(k[-1] == n - 1 for k, n in zip(kept, lengths, strict=True) if n)
    assert all(np.all(np.diff(k) > 0) for k in kept)
    with pytest.raises(ValueError, match="not even one epoch"):
        thin_context(np.ones(70, dtype=np.int64), 60)


def test_surrogate_rejects_bad_input(tiny_model) -> None:
    surrogate = PFNSurrogate(tiny_model)
    g = generator(0)
    curves = (np.array([0.2, 0.3]), np.array([]))
    with pytest.raises(ValueError, match=r"accepts 1\.\.4"):
        surrogate.sample_curves(CurveObservations(np.full((2, 5), 0.5), curves, 10), 4, g)
    with pytest.raises(ValueError, match="max_horizon"):
        surrogate.sample_curves(CurveObservations(np.full((2, 2), 0.5), curves, 40), 4, g)
    with pytest.raises(ValueError, match="finite"):
        surrogate.sample_curves(
            CurveObservations(np.array([[0.5, np.nan], [0.1, 0.2]]), curves, 10), 4, g
        )
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        surrogate.sample_curves(
            CurveObservations(np.array([[0.5, 1.5], [0.1, 0.2]]), curves, 10), 4, g
        )
    with pytest.raises(ValueError, match="outside"):
        surrogate.sample_curves(
            CurveObservations(np.full((2, 2), 0.5), (np.array([1.2]), np.array([])), 10), 4, g
        )
    with pytest.raises(ValueError, match="non-finite"):
        CurveObservations(np.full((2, 2), 0.5), (np.array([np.nan]), np.array([])), 10)
    with pytest.raises(ValueError, match="num_samples"):
        surrogate.sample_curves(CurveObservations(np.full((2, 2), 0.5), curves, 10), 0, g)
    with pytest.raises(TypeError, match="Generator"):
        surrogate.sample_curves(CurveObservations(np.full((2, 2), 0.5), curves, 10), 4, None)
    with pytest.raises(ValueError, match="sampling"):
        PFNSurrogate(tiny_model, sampling="joint")
    with pytest.raises(ValueError, match="initial_value"):
        PFNSurrogate(tiny_model, initial_value=2.0)
    with pytest.raises(TypeError, match="LearningCurvePFN"):
        PFNSurrogate(object())


# ------------------------------------------------------------------------------ shipped model
def _coverage(bar: BarDistribution, logits: torch.Tensor, y: torch.Tensor, levels) -> torch.Tensor:
    quantiles = bar.icdf(logits, torch.tensor(levels, dtype=logits.dtype))
    return (y[..., None] <= quantiles).double().reshape(-1, len(levels)).mean(0)


LEVELS = (0.1, 0.5, 0.9)


def test_shipped_model_is_calibrated_on_held_out_prior_curves() -> None:
    """Coverage of the 10/50/90 % quantiles on 32 unseen prior batches (256 tasks).

    Tasks share D, T and N within a batch and curves share a task, so coverage varies from
    batch to batch: over 16-batch sets it had a spread (SD) of 0.012 / 0.034 / 0.010 and a pooled
    mean (96 batches) of 0.092 / 0.507 / 0.905. With 32 batches the SD is about 0.024 at the
    median; 0.06 is 2.5 SD plus the measured bias.
    """
    model = load_default_pfn()
    assert checkpoint.default_weights_path().stat().st_size < 5_000_000
    batches = prior_batches(model.config, 32, seed=2024)  # neither training nor its eval stream
    with torch.no_grad():
        logits = torch.cat([model(b).reshape(-1, model.config.num_bars) for b in batches])
    targets = torch.cat([b.y_query.reshape(-1) for b in batches])
    coverage = _coverage(model.bar, logits, targets, LEVELS)
    assert torch.allclose(coverage, torch.tensor(LEVELS, dtype=torch.float64), atol=0.06), coverage


def _real_tasks(
    x: torch.Tensor, values: torch.Tensor, pool: torch.Tensor, seed: int
) -> list[CurveBatch]:
    """4 batches of 8 tasks, each 40 configurations of `pool` cut like a freeze-thaw run."""
    g = generator(seed)
    batches = []
    for _ in range(4):
        rows = torch.stack([pool[torch.randperm(pool.numel(), generator=g)[:40]] for _ in range(8)])
        batches.append(
            cut_tasks(
                x[rows],
                values[rows],
                torch.zeros(8),
                torch.zeros(8, dtype=torch.bool),
                g,
                max_context=300,
                num_queries=128,
            )
        )
    return batches


def test_shipped_model_on_real_fashion_mnist_curves() -> None:
    """Real curves (benchdata: 200 MLPs × 30 epochs on Fashion-MNIST), 50 held-out configurations.

    Prior only, the model is pessimistic there: real MLP curves keep rising slowly, while the
    prior's mostly saturate early or turn down, so it predicts flat continuations. Measured
    coverage 0.05 / 0.24 / 0.72; the loose bound (0.3) only catches a broken pipeline. After the
    paper's transfer step (mixup fine-tuning on the other 150 configurations, 40 steps)
    coverage was 0.17-0.19 / 0.49-0.52 / 0.87-0.92 for 30-60 steps and the held-out NLL fell
    from -0.33 to about -0.8: we require coverage within 0.1 and a 0.2-nat gain.
    """
    import benchdata

    table = benchdata.fashion_mnist_curves()
    x = torch.as_tensor(table.encode(), dtype=torch.float32)
    values = torch.as_tensor(np.array(table.values, dtype=np.float32))
    split = torch.randperm(x.shape[0], generator=generator(0))
    train_rows, test_rows = split[:150], split[150:]
    held_out = _real_tasks(x, values, test_rows, seed=5)
    targets = torch.cat([b.y_query.reshape(-1) for b in held_out])
    nominal = torch.tensor(LEVELS, dtype=torch.float64)
    model = load_default_pfn()

    def coverage_and_nll(m: LearningCurvePFN) -> tuple[torch.Tensor, float]:
        with torch.no_grad():
            logits = torch.cat([m(b).reshape(-1, m.config.num_bars) for b in held_out])
        return _coverage(m.bar, logits, targets, LEVELS), evaluate_nll(m, held_out)

    coverage, before = coverage_and_nll(model)
    assert torch.allclose(coverage, nominal, atol=0.3), coverage
    assert (coverage[1:] > coverage[:-1]).all()
    tuned = finetune_pfn(
        model,
        [(x[train_rows].numpy(), values[train_rows].numpy())],
        FinetuneConfig(steps=40, lr=1e-3),
        progress=False,
    )
    coverage, after = coverage_and_nll(tuned)
    assert torch.allclose(coverage, nominal, atol=0.1), coverage
    assert after < before - 0.2
