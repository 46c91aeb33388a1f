"""The budget-reachable loss surrogate: the natural spline against scipy's, the measured points
against independent training runs."""

from __future__ import annotations

import pytest
import torch

from cads import (
    InnerConfig,
    LossSurrogate,
    SelectionTask,
    fit_loss_surrogate,
    toy_task,
    train_under_budget,
)
from cads.models import _seeded
from cads.surrogate import natural_cubic_spline, surrogate_sizes
from cads.task import per_example_losses

SIZES = (10.0, 25.0, 60.0, 120.0, 300.0)
LOSSES = (0.05, 0.21, 0.48, 0.71, 0.93)


@pytest.mark.parametrize("interpolation", ["pchip", "cubic"])
@pytest.mark.parametrize("losses", [LOSSES, (0.3, 0.2, 0.5, 0.45, 0.9)])  # monotone, and not
def test_interpolants_match_scipy(interpolation, losses):
    interpolate = pytest.importorskip("scipy.interpolate")
    surrogate = LossSurrogate(SIZES, losses, interpolation)
    log_losses = torch.log(torch.tensor(losses, dtype=torch.float64) + 1e-10).numpy()
    reference = (interpolate.PchipInterpolator(SIZES, log_losses) if interpolation == "pchip"
                 else interpolate.CubicSpline(SIZES, log_losses, bc_type="natural"))  # fmt: skip
    grid = torch.linspace(SIZES[0], SIZES[-1], 301, dtype=torch.float64)
    expected = torch.exp(torch.tensor(reference(grid.numpy()))) - 1e-10
    torch.testing.assert_close(surrogate(grid), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("interpolation", ["pchip", "cubic"])
def test_interpolates_the_measured_points_and_continues_linearly(interpolation):
    surrogate = LossSurrogate(SIZES, LOSSES, interpolation)
    torch.testing.assert_close(
        surrogate(torch.tensor(SIZES)),
        torch.tensor(LOSSES, dtype=torch.float64),
        rtol=1e-12,
        atol=0,
    )
    # beyond the ends, log l continues along the end tangent: equal steps, equal log ratios
    far = surrogate(torch.tensor([300.0, 400.0, 500.0]))
    ratios = torch.log(far[1:] / far[:-1])
    torch.testing.assert_close(ratios[0], ratios[1], rtol=1e-9, atol=0)
    assert torch.isfinite(surrogate(torch.tensor([0.0, 1e5]))).all()


def test_two_knots_is_a_line_in_log_space():
    m = natural_cubic_spline(
        torch.tensor([0.0, 1.0], dtype=torch.float64), torch.tensor([1.0, 3.0], dtype=torch.float64)
    )
    assert (m == 0).all()


def test_fit_measures_budgeted_training_losses():
    """Each point is a fresh model trained for the budget on a random subset of that size, its
    mean training loss on the subset: recomputed here, run by run, with the same seeds."""
    task = toy_task(per_source=40)
    inner = InnerConfig(batch_size=8, lr=0.05)
    fractions = (0.1, 0.5, 1.0)
    fitted = fit_loss_surrogate(task, 30, inner, fractions=fractions, seed=3)
    generator = torch.Generator().manual_seed(3)
    for size, loss in zip(fitted.sizes, fitted.losses, strict=True):
        subset = torch.randperm(len(task), generator=generator)[: int(size)]
        model = task.model_fn(3)
        train_under_budget(
            model, task.inputs, task.targets, subset, 30, task.loss_fn, inner, generator=generator
        )
        expected = per_example_losses(
            model, task.inputs[subset], task.targets[subset], task.loss_fn
        ).mean()
        assert loss == pytest.approx(float(expected), rel=1e-6)
    assert fitted.sizes == (8.0, 40.0, 80.0)  # 10% of 80 is below one batch: raised to 8
    # a small subset is memorised within the budget, a large one is not
    assert fitted.losses[0] < fitted.losses[-1]


def test_fit_measures_in_training_mode_as_cads_reads_the_loss():
    """With dropout the surrogate's loss is the one CADS's penalty compares it with: the
    training-mode loss (dropout on), recomputed here with the same seeds and random stream; the
    evaluation-mode loss of the same model differs."""
    base = toy_task(per_source=32)

    def model_fn(seed):
        return _seeded(seed, lambda: torch.nn.Sequential(
            torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(64, 3)
        ))  # fmt: skip

    task = SelectionTask(base.inputs, base.targets, base.sources, base.source_names,
                         base.val_inputs, base.val_targets, base.test_inputs, base.test_targets,
                         model_fn)  # fmt: skip
    inner = InnerConfig(batch_size=8, lr=0.01)
    torch.manual_seed(7)  # dropout's random stream
    fitted = fit_loss_surrogate(task, 20, inner, fractions=(0.2, 1.0), seed=1)
    torch.manual_seed(7)
    generator = torch.Generator().manual_seed(1)
    for size, loss in zip(fitted.sizes, fitted.losses, strict=True):
        subset = torch.randperm(len(task), generator=generator)[: int(size)]
        model = model_fn(1)
        train_under_budget(
            model, task.inputs, task.targets, subset, 20, task.loss_fn, inner, generator=generator
        )
        with torch.no_grad():
            training = task.loss_fn(model, task.inputs[subset], task.targets[subset]).mean()
        assert loss == pytest.approx(float(training), rel=1e-6)
        evaluation = per_example_losses(model, task.inputs[subset], task.targets[subset],
                                        task.loss_fn).mean()  # fmt: skip
        assert abs(loss - float(evaluation)) > 0.01


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: LossSurrogate((1.0,), (0.5,)), "at least 2"),
        (lambda: LossSurrogate((2.0, 1.0), (0.5, 0.4)), "strictly increasing"),
        (lambda: LossSurrogate((1.0, 2.0), (0.5, float("nan"))), "finite"),
        (lambda: surrogate_sizes(100, 8, (0.0, 0.5)), "fractions must lie"),
        (lambda: surrogate_sizes(10, 16, (0.1, 0.5)), "fewer than 2 distinct"),
    ],
)
def test_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def _reachable_loss(task, size: int, seed: int, inner: InnerConfig, budget: int) -> float:
    subset = torch.randperm(len(task), generator=torch.Generator().manual_seed(seed))[:size]
    model = task.model_fn(seed)
    train_under_budget(model, task.inputs, task.targets, subset, budget, task.loss_fn, inner,
                       generator=torch.Generator().manual_seed(seed))  # fmt: skip
    losses = per_example_losses(model, task.inputs[subset], task.targets[subset], task.loss_fn)
    return float(losses.mean())


def test_surrogate_predicts_the_reachable_loss_on_a_grid():
    """The one-dimensional function CADS estimates, against a grid of direct measurements: the
    reachable training loss (mean of 8 seeds) at the paper's fractions of a 200-example pool, the
    surrogate fitted on them, checked at 5 sizes in between. The allowance is the measurements'
    own noise: 3 combined standard errors (the held-out point's and the knots' mean)."""
    task = toy_task(per_source=100, seed=5)
    inner = InnerConfig(batch_size=8, lr=0.05)
    knots = surrogate_sizes(len(task), inner.batch_size)
    held = (15, 40, 80, 120, 160)

    def measure(sizes):
        runs = torch.tensor([[_reachable_loss(task, n, s, inner, 40) for s in range(8)]
                             for n in sizes], dtype=torch.float64)  # fmt: skip
        return runs.mean(1), runs.std(1) / 8**0.5

    (knot_mean, knot_error), (held_mean, held_error) = measure(knots), measure(held)
    allowance = 3 * torch.sqrt(held_error**2 + knot_error.mean() ** 2)
    sizes = tuple(float(n) for n in knots)
    fitted = LossSurrogate(sizes, tuple(knot_mean.tolist()))  # pchip, the default
    gap = (fitted(torch.tensor(held, dtype=torch.float64)) - held_mean).abs()
    assert (gap <= allowance).all(), (gap, allowance)
    # the natural cubic spline overshoots between these noisy, steep points: why pchip is the
    # default (the README quotes this gap)
    natural = LossSurrogate(sizes, tuple(knot_mean.tolist()), "cubic")
    natural_gap = (natural(torch.tensor(held, dtype=torch.float64)) - held_mean).abs()
    assert natural_gap.max() > 0.2 > allowance.max()
