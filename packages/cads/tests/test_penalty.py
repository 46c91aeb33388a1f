"""CADS's penalty-based step against a by-hand computation of the paper's formulas, and the
planted-noise behaviour of CADS-E and CADS-S."""

from __future__ import annotations

import pytest
import torch

import cads
from cads import BernoulliMasks, LossSurrogate, SelectConfig, score_function_gradient

SURROGATE = LossSurrogate((8.0, 40.0, 96.0), (0.2, 0.6, 0.9))


@pytest.mark.parametrize(("samples", "baseline"), [(3, "leave_one_out"), (1, "none")])
def test_one_outer_step_follows_the_papers_gradients(samples, baseline):
    """One step of CADS-E, recomputed draw by draw: ∇_θ = 1/K Σ_k [∇L_val + 2α(L_k − l_k)∇L_k]
    (each term its own backward pass), ∇_s by the score function of L_val + α(L_k − l_k)²,
    Adam's first step on each, s clipped to [eps, 1 − eps]. Without a baseline one draw is
    enough (its estimate is unbiased), and s moves."""
    task = cads.toy_task(per_source=48, seed=2)
    config = SelectConfig(
        outer_steps=1,
        samples=samples,
        baseline=baseline,
        alpha=2.5,
        pool_batch=None,
        val_batch=None,
        lr=0.05,
        model_lr=0.01,
        clip_norm=None,
    )
    selection = cads.run_cads(
        task, cads.ComputeBudget(10), "example", config, seed=4, surrogate=SURROGATE, progress=False
    )

    generator = torch.Generator().manual_seed(4)
    s = torch.full((len(task),), 0.5, dtype=torch.float64)
    masks = BernoulliMasks().sample(s, samples, generator)
    model = task.model_fn(4)
    grads = [torch.zeros_like(p) for p in model.parameters()]
    values = []
    for mask in masks:
        members = mask.bool()
        train = task.loss_fn(model, task.inputs[members], task.targets[members]).mean()
        val = task.loss_fn(model, task.val_inputs, task.val_targets).mean()
        gap = train - float(SURROGATE(members.sum().double()))
        values.append(float((val + 2.5 * gap**2).detach()))
        for term, weight in ((val, 1.0), (train, 2 * 2.5 * float(gap.detach()))):
            for g, d in zip(
                grads, torch.autograd.grad(term, list(model.parameters())), strict=True
            ):
                g += weight * d / samples
    g_s = score_function_gradient(
        torch.tensor(values, dtype=torch.float64), BernoulliMasks().score(masks, s), baseline
    )
    if samples == 1:  # no baseline: f(m) ∇ log p(m | s), by hand
        torch.testing.assert_close(g_s, values[0] * (masks[0] - s) / (s * (1 - s)))
    # Adam's first step moves each coordinate by lr · g / (|g| + 1e-8): the direction; the
    # gradient's size is in the trace (its norm before clipping)
    expected = (s - 0.05 * g_s / (g_s.abs() + 1e-8)).clamp(1e-3, 1 - 1e-3)
    torch.testing.assert_close(selection.probabilities, expected, rtol=0, atol=1e-9)
    trace = selection.trace[0]
    # the losses are float32, summed in another order here: agreement to float32 rounding
    assert trace["grad_norm"] == pytest.approx(float(g_s.norm()), rel=1e-6)
    assert trace["objective"] == pytest.approx(sum(values) / samples, rel=1e-6)
    assert trace["draws_used"] == samples
    assert bool((selection.probabilities != 0.5).any())
    # the jointly trained model took Adam's first step along the by-hand gradient
    reference = task.model_fn(4)
    optimizer = torch.optim.Adam(reference.parameters(), lr=0.01)
    for p, g in zip(reference.parameters(), grads, strict=True):
        p.grad = g
    optimizer.step()
    for ours, theirs in zip(selection.model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-7)
    # and the step is not a no-op: the model moved by about the learning rate
    assert not torch.allclose(reference.weight, task.model_fn(4).weight, atol=5e-3)
    assert selection.settings["surrogate"] == SURROGATE.to_json()


def test_batch_estimate_of_the_squared_gap_is_unbiased():
    """Over batches drawn with replacement from a fixed pool, the two-halves estimate averages
    to the exact ``(L − l)²`` of each draw (squaring one batch mean would not: it adds the
    mean's variance, larger for small subsets); 20,000 batches, 5 standard errors."""
    from cads.penalty import pool_sample, squared_gaps

    generator = torch.Generator().manual_seed(0)
    losses = torch.rand(400, generator=generator, dtype=torch.float64) * 3
    masks = torch.stack([torch.arange(400) < 20, torch.arange(400) % 2 == 0]).double()  # 5%, 50%
    targets = torch.tensor([1.2, 1.4], dtype=torch.float64)
    exact, valid = squared_gaps(losses, masks, targets, exact=True)
    assert valid.all()
    torch.testing.assert_close(exact, ((masks @ losses) / masks.sum(1) - targets) ** 2)
    estimates, naive = [], []
    for _ in range(20_000):
        batch = pool_sample(400, 100, generator)
        value, ok = squared_gaps(losses[batch], masks[:, batch], targets, exact=False)
        if ok.all():
            estimates.append(value)
            members = masks[:, batch]
            naive.append(((members @ losses[batch]) / members.sum(1) - targets) ** 2)
    estimates, naive = torch.stack(estimates), torch.stack(naive)
    standard_error = estimates.std(0) / len(estimates) ** 0.5
    assert ((estimates.mean(0) - exact).abs() < 5 * standard_error).all()
    assert naive.mean(0)[0] - exact[0] > 10 * standard_error[0]  # the bias the halves remove


def test_small_draws_get_their_exact_gap_and_count():
    """With a pool batch of 2, most draws have no member in one half: each non-empty draw is
    still used (its exact gap from all its members), so every step updates s."""
    task = cads.toy_task(per_source=16)
    config = SelectConfig(outer_steps=4, samples=3, pool_batch=2)
    inner = cads.InnerConfig(batch_size=4)
    selection = cads.select(task, 3, "cads-e", config=config, inner=inner, progress=False)
    assert [row["draws_used"] for row in selection.trace] == [3, 3, 3, 3]
    assert all(row["grad_norm"] is not None for row in selection.trace)
    with pytest.raises(ValueError, match="pool_batch must be at least 2"):
        SelectConfig(pool_batch=1)


def test_planted_noise_cads_s_lowers_the_noisy_source():
    task = cads.toy_task(per_source=64, seed=0)
    inner = cads.InnerConfig(batch_size=16, lr=0.05)
    config = SelectConfig(outer_steps=40, samples=4)
    selection = cads.select(task, 20, "cads-s", config=config, inner=inner, progress=False)
    clean, noisy = selection.probabilities.tolist()
    assert noisy < 0.5 <= clean  # both started at 0.5
    sigmas = [row["sigma"] for row in selection.trace]
    assert sigmas[-1] == pytest.approx(0.1 * 0.99**39)  # annealed once per step


def test_planted_noise_cads_e_lowers_the_noisy_examples():
    task = cads.toy_task(per_source=64, seed=0)
    inner = cads.InnerConfig(batch_size=16, lr=0.05)
    config = SelectConfig(outer_steps=80, samples=4)
    selection = cads.select(task, 20, "cads-e", config=config, inner=inner, progress=False)
    clean = selection.probabilities[task.sources == 0].mean()
    noisy = selection.probabilities[task.sources == 1].mean()
    assert noisy < clean


def test_a_size_constraint_is_kept_exactly():
    task = cads.toy_task(per_source=32)
    config = SelectConfig(outer_steps=5, samples=3, size=20.0)
    inner = cads.InnerConfig(batch_size=8)
    selection = cads.select(task, 5, "cads-e", config=config, inner=inner, progress=False)
    assert float(selection.probabilities.sum()) == pytest.approx(20.0, abs=1e-9)
    assert len(selection) == 20
    for row in selection.trace:
        assert row["expected_size"] == pytest.approx(20.0, abs=1e-9)


def test_cads_s_size_constrains_the_selection_and_the_trace_gives_the_draws_size():
    """At the source level the projection keeps Σ n_j s_j = size, the size of the selection
    returned (round(s_j n_j) per source); the draws r_j ~ TN(s_j, σ, [0, 1]) hold
    Σ n_j E[r_j] on average, scipy's truncated-normal mean, larger near s_j = 0."""
    stats = pytest.importorskip("scipy.stats")
    task = cads.toy_task(per_source=32)
    config = SelectConfig(outer_steps=3, samples=2, size=10.0)
    inner = cads.InnerConfig(batch_size=8)
    selection = cads.select(task, 5, "cads-s", config=config, inner=inner, progress=False)
    assert abs(len(selection) - 10) <= 1  # two sources, each count rounded
    centre, sigma = 10 / 64, 0.1  # the first step's s (0.5 projected onto the size) and σ_0
    law = stats.truncnorm(-centre / sigma, (1 - centre) / sigma, centre, sigma)
    first = selection.trace[0]
    assert first["expected_draw_size"] == pytest.approx(64 * law.mean(), rel=1e-10)
    assert first["expected_draw_size"] > 10.5  # the gap the trace reports
    for row in selection.trace:
        assert row["expected_size"] == pytest.approx(10.0, abs=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"samples": 1}, "at least 2|samples >= 2"),
        ({"samples": 1, "baseline": "mean"}, "mean baseline needs samples >= 2.*gradient on s"),
        ({"init": 1.0}, "init"),
        ({"alpha": 0.0}, "alpha"),
        ({"baseline": "median"}, "baseline"),
        ({"ihvp": "lissa"}, "ihvp"),
        ({"outer_steps": 0}, "outer_steps"),
        ({"sigma_decay": 1.5}, "sigma_decay"),
    ],
)
def test_bad_configs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SelectConfig(**kwargs)


def test_size_larger_than_the_pool_is_refused():
    task = cads.toy_task(per_source=8)
    with pytest.raises(ValueError, match="exceeds the pool"):
        cads.select(task, 5, "cads-e", config=SelectConfig(size=100.0), progress=False)
