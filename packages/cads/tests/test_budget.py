"""The inner loop spends exactly its budget: steps counted, FLOPs against a closed form."""

from __future__ import annotations

import math

import pytest
import torch

from cads import (
    ComputeBudget,
    InnerConfig,
    classification_loss,
    count_step_flops,
    train_under_budget,
)
from cads.budget import batch_stream


class Counting(torch.nn.Module):
    """A linear classifier that records the batches it sees in training mode."""

    def __init__(self, dim: int = 5, classes: int = 3) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(dim, classes, bias=False)
        self.seen: list[torch.Tensor] = []

    def forward(self, x):
        if self.training:
            self.seen.append(x[:, 0].clone())
        return self.linear(x)


def pool(n: int = 40, dim: int = 5):
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(0))
    x[:, 0] = torch.arange(n, dtype=torch.float32)  # the first feature names the example
    return x, torch.arange(n) % 3


@pytest.mark.parametrize(
    ("subset_size", "steps", "batch"), [(40, 7, 8), (5, 9, 8), (1, 3, 4), (23, 10, 6)]
)
def test_exactly_the_budget_whatever_the_subset(subset_size, steps, batch):
    x, y = pool()
    subset = torch.arange(subset_size) * (40 // subset_size)
    model = Counting()
    log = train_under_budget(
        model,
        x,
        y,
        subset,
        ComputeBudget(steps),
        classification_loss,
        InnerConfig(batch_size=batch),
    )
    assert log.steps == len(model.seen) == steps
    assert log.flops is None  # a step budget counts FLOPs only when asked (flops_per_step)
    assert all(len(b) == batch for b in model.seen)  # every step costs the same
    seen = torch.cat(model.seen).long()
    assert set(seen.tolist()) <= set(subset.tolist())  # nothing outside the selection
    assert log.passes == pytest.approx(steps * batch / subset_size)


def test_batch_stream_is_consecutive_shuffled_passes():
    subset = torch.arange(10, 20)
    stream = batch_stream(subset, 4, 10, torch.Generator().manual_seed(0)).flatten()
    for p in range(4):  # 40 draws = 4 whole passes: each a permutation of the subset
        assert sorted(stream[10 * p : 10 * (p + 1)].tolist()) == list(range(10, 20))


def test_flops_of_a_linear_step_match_the_closed_form():
    """Linear(d → c) without bias on a batch of B: forward 2Bdc, weight gradient 2Bdc (the
    input needs no gradient) = 4Bdc."""
    x, y = pool()
    model = Counting()
    assert count_step_flops(model, classification_loss, x[:8], y[:8]) == 4 * 8 * 5 * 3


def test_flop_budget_spends_whole_steps_never_more():
    x, y = pool()
    per_step = 4 * 8 * 5 * 3
    budget = ComputeBudget(10.5 * per_step, "flops")
    model = Counting()
    log = train_under_budget(
        model, x, y, torch.arange(40), budget, classification_loss, InnerConfig(batch_size=8)
    )
    assert log.steps == len(model.seen) == 10  # the FLOPs were counted on a copy
    assert log.flops == 10 * per_step <= budget.amount
    assert log.budget_left == pytest.approx(0.5 * per_step)


def test_counting_flops_leaves_the_model_and_the_random_state_alone():
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Dropout(0.5), torch.nn.Linear(8, 3))  # fmt: skip
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = pool()
    state = torch.random.get_rng_state()
    assert count_step_flops(model, classification_loss, x[:8], y[:8]) > 0
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_empty_selection_trains_nothing():
    x, y = pool()
    model = Counting()
    before = model.linear.weight.clone()
    log = train_under_budget(
        model, x, y, torch.tensor([], dtype=torch.long), ComputeBudget(5), classification_loss
    )
    assert log.steps == 0
    assert math.isnan(log.final_loss)
    torch.testing.assert_close(model.linear.weight, before, rtol=0, atol=0)


def test_weighted_loss_is_the_weighted_mean():
    """Weights 0 on half the pool: the same updates as training on the other half alone with a
    batch stream over the whole pool (the zero-weight examples contribute nothing)."""
    x, y = pool()
    weights = (torch.arange(40) % 2).double()
    a, b = Counting(), Counting()
    b.load_state_dict(a.state_dict())
    config = InnerConfig(batch_size=8, optimizer="sgd", schedule="constant", lr=0.1)
    train_under_budget(
        a,
        x,
        y,
        torch.arange(40),
        ComputeBudget(3),
        classification_loss,
        config,
        example_weights=weights,
    )
    # the same batches, losses averaged over their odd examples only
    stream = batch_stream(torch.arange(40), 8, 3, torch.Generator().manual_seed(0))
    optimizer = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
    for batch in stream:
        keep = batch[batch % 2 == 1]
        loss = classification_loss(b, x[keep], y[keep]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.testing.assert_close(a.linear.weight, b.linear.weight, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ComputeBudget(0), "positive number"),
        (lambda: ComputeBudget(-3), "positive number"),
        (lambda: ComputeBudget(float("nan")), "positive number"),
        (lambda: ComputeBudget(2.5), "whole number"),
        (lambda: ComputeBudget(10, "epochs"), "unit"),
        (lambda: ComputeBudget(10.0, "flops").steps(100.0), "buys no step"),
        (lambda: InnerConfig(batch_size=0), "batch_size"),
        (lambda: InnerConfig(lr=float("inf")), "lr"),
        (lambda: InnerConfig(optimizer="lbfgs"), "optimizer"),
    ],
)
def test_bad_budgets_and_configs(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_subset_out_of_range_is_refused():
    x, y = pool()
    with pytest.raises(ValueError, match=r"subset indices must lie in \[0, 40\)"):
        train_under_budget(
            Counting(), x, y, torch.tensor([3, 40]), ComputeBudget(1), classification_loss
        )
