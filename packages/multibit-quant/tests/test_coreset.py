"""Importance scores against brute force, selection against sorting and sampling statistics."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from multibit_quant import BitwiseCoreset, ForgettingTracker, importance_scores, quantize, select
from multibit_quant.coreset import check_fraction


def classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 6 * 6, 7), nn.ReLU(),
        nn.Linear(7, 4),
    )  # fmt: skip


def data(n: int = 20):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 8, 8, generator=generator), torch.randint(
        0, 4, (n,), generator=generator
    )


def test_el2n_matches_a_loop_over_examples():
    model, (x, y) = classifier().eval(), data()
    scores = importance_scores(model, x, y, "el2n", batch_size=7)
    for i in range(len(x)):
        p = model(x[i : i + 1]).softmax(-1)[0]
        torch.testing.assert_close(
            scores[i], (p - F.one_hot(y[i], 4).float()).norm(), rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize("bias", [True, False])
def test_grad_norm_matches_per_example_autograd_of_the_classifier(bias):
    model, (x, y) = classifier().eval(), data()
    if not bias:
        model[-1] = nn.Linear(7, 4, bias=False)
    scores = importance_scores(model, x, y, "grad_norm", batch_size=6)
    head = model[-1]
    params = [head.weight, head.bias] if bias else [head.weight]
    for i in range(len(x)):
        loss = F.cross_entropy(model(x[i : i + 1]), y[i : i + 1])
        grads = torch.autograd.grad(loss, params)
        norm = torch.cat([g.flatten() for g in grads]).norm()
        torch.testing.assert_close(scores[i], norm, rtol=1e-5, atol=1e-6)


def test_forgetting_counts_transitions_and_ranks_never_learned_first():
    tracker = ForgettingTracker(4)
    passes = [[1, 0, 1, 0], [0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 1, 0]]
    for correct in passes:
        tracker.update(torch.tensor(correct, dtype=torch.bool))
    # example 0: correct->wrong twice; 1 and 3: never learned; 2: forgot once
    assert tracker.events.tolist() == [2, 0, 1, 0]
    scores = tracker.scores()
    assert scores[1] > scores[0] > scores[2]
    assert scores[3] == scores[1]


def test_forgetting_scores_match_a_brute_force_count_over_presentations():
    """Presentations of subsets (as a coreset trains): events counted example by example over
    its own presentations; examples 5 and 6 are never presented and score the mean of the
    presented ones, not as never learned."""
    size = 7
    history = [  # (indices presented, correct)
        ([0, 1, 2, 3], [1, 0, 1, 0]),
        ([2, 4], [0, 1]),
        ([0, 1, 4], [0, 0, 1]),
        ([4, 0, 2, 3], [0, 1, 1, 0]),
        ([0, 4], [0, 1]),
    ]
    tracker = ForgettingTracker(size)
    for indices, correct in history:
        tracker.update(torch.tensor(correct, dtype=torch.bool), torch.tensor(indices))
    sequences: dict[int, list[int]] = {}
    for indices, correct in history:
        for i, c in zip(indices, correct, strict=True):
            sequences.setdefault(i, []).append(c)
    expected = {}
    for i, seq in sequences.items():
        events = sum(a == 1 and b == 0 for a, b in itertools.pairwise(seq))
        expected[i] = events if any(seq) else events + size + 1  # never learned: above all
    mean = sum(expected.values()) / len(expected)
    brute = [expected.get(i, mean) for i in range(size)]
    assert [expected[i] for i in (0, 1, 2, 3, 4)] == [2, 8, 1, 8, 1]  # the history, by hand
    torch.testing.assert_close(tracker.scores(), torch.tensor(brute), rtol=0, atol=1e-6)
    assert tracker.scores()[5] < tracker.scores()[1]  # unseen is not ranked as never learned
    # nothing presented yet: no information at all, every score equal
    assert ForgettingTracker(3).scores().tolist() == [0.0, 0.0, 0.0]


def test_forgetting_reselection_keeps_the_forgotten_examples():
    """Top-k re-selection after one epoch on half the data keeps the examples that were
    forgotten instead of swapping in the ones never presented."""
    coreset = BitwiseCoreset(20, (4,), 0.5, score="forgetting", mode="top", seed=0)
    first = coreset.subsets[4].clone()
    forgotten = torch.arange(len(first)) % 2 == 1
    coreset.observe(4, first, torch.ones(len(first), dtype=torch.bool))
    coreset.observe(4, first, ~forgotten)
    coreset.refresh(quantize(classifier(), bits=[4]), *data(20))
    assert set(first[forgotten].tolist()) <= set(coreset.subsets[4].tolist())


def test_top_selection_is_the_highest_scores():
    scores = torch.tensor([0.3, 0.9, 0.1, 0.5, 0.7, 0.2])
    assert select(scores, 0.5, "top").tolist() == [1, 3, 4]
    assert select(scores, 1.0, "top").tolist() == list(range(6))
    assert len(select(scores, 0.01, "top")) == 1  # ceil: never empty
    # ties are broken at random, not by position
    ties = {tuple(select(torch.zeros(10), 0.3, "top", torch.Generator().manual_seed(s)).tolist())
            for s in range(20)}  # fmt: skip
    assert len(ties) > 10


def test_sampled_selection_draws_in_proportion_to_the_scores():
    """One draw of k = 1 is a categorical draw with probabilities ∝ scores (Gumbel-max):
    frequencies over 20,000 draws within 5 standard errors."""
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0])
    generator = torch.Generator().manual_seed(0)
    draws = torch.tensor([int(select(scores, 0.25, "sample", generator)) for _ in range(20000)])
    frequency = torch.bincount(draws, minlength=4).double() / len(draws)
    p = scores.double() / scores.sum()
    standard_error = (p * (1 - p) / len(draws)).sqrt()
    assert ((frequency - p).abs() <= 5 * standard_error).all(), frequency


def test_bitwise_coreset_subsets_and_refresh():
    model = quantize(classifier(), bits=[2, 8])
    x, y = data(40)
    coreset = BitwiseCoreset(40, (2, 8), 0.25, score="el2n", mode="top", resample_every=2)
    assert [len(s) for s in coreset.subsets.values()] == [10, 10]
    assert not coreset.due(0)
    assert not coreset.due(1)
    assert coreset.due(2)
    coreset.refresh(model, x, y)
    for bits, subset in coreset.subsets.items():
        with model.bits_as(bits):
            scores = importance_scores(model, x, y, "el2n")
        assert subset.tolist() == scores.topk(10).indices.sort().values.tolist()
    assert coreset.scoring_passes == 1


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5, math.nan, "0.5", True])
def test_bad_fractions(fraction):
    with pytest.raises(ValueError, match="coreset fraction"):
        check_fraction(fraction)


def test_bad_scores_and_modes():
    with pytest.raises(ValueError, match="unknown score"):
        BitwiseCoreset(10, (4,), 0.5, score="entropy")
    with pytest.raises(ValueError, match="unknown selection mode"):
        select(torch.ones(4), 0.5, "bottom")
    with pytest.raises(ValueError, match="ForgettingTracker"):
        importance_scores(classifier(), *data(), "forgetting")
