"""The baselines' scores against direct per-example computations, and their selections."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cads
from cads import run_baseline, score_examples
from cads.baselines import _el2n, _grand

TASK = cads.toy_task(per_source=20, seed=3)
INNER = cads.InnerConfig(batch_size=8, lr=0.05)


def test_grand_equals_a_loop_of_per_example_gradient_norms():
    model = TASK.model_fn(1)
    ours = _grand(model, TASK, chunk=7)
    for i in range(len(TASK)):
        loss = F.cross_entropy(model(TASK.inputs[i : i + 1]), TASK.targets[i : i + 1])
        grads = torch.autograd.grad(loss, list(model.parameters()))
        expected = torch.sqrt(sum((g**2).sum() for g in grads))
        assert float(ours[i]) == pytest.approx(float(expected), rel=1e-5)


def test_el2n_is_the_distance_of_softmax_to_the_label():
    model = TASK.model_fn(1)
    ours = _el2n(model, TASK)
    probabilities = model(TASK.inputs).softmax(-1).detach()
    onehot = F.one_hot(TASK.targets, 3).float()
    torch.testing.assert_close(ours, (probabilities - onehot).norm(dim=-1))


def test_scores_average_over_runs():
    one = score_examples(TASK, "loss", cads.ComputeBudget(10), INNER, score_models=1, seed=5)
    two = score_examples(TASK, "loss", cads.ComputeBudget(10), INNER, score_models=2, seed=5)
    other = score_examples(TASK, "loss", cads.ComputeBudget(10), INNER, score_models=1, seed=6)
    torch.testing.assert_close(two, (one + other) / 2)


@pytest.mark.parametrize(("steps_bought", "score"), [(3.5, "loss"), (3.5, "grand"), (14.9, "loss")])
def test_a_flop_budget_scores_like_the_steps_it_buys(steps_bought, score):
    # a fifth of the whole steps bought, at least one: 3.5 steps' FLOPs score for 1 step (0.2 C
    # in FLOPs would buy none), 14.9 for round(0.2 * 14) = 3 (not for 0.2 * 14.9 → 2)
    from cads.budget import first_batch_flops

    flops = first_batch_flops(TASK.model_fn(0), TASK.loss_fn, TASK.inputs, TASK.targets,
                              torch.arange(len(TASK)), INNER.batch_size)  # fmt: skip
    budget = cads.ComputeBudget(steps_bought * flops, "flops")
    steps = cads.ComputeBudget(int(steps_bought))  # the whole steps the FLOPs buy
    ours = score_examples(TASK, score, budget, INNER, score_models=1)
    torch.testing.assert_close(ours, score_examples(TASK, score, steps, INNER, score_models=1))
    assert len(run_baseline(TASK, score, budget, 10, INNER)) == 10


def test_forgetting_counts_flips_and_marks_never_learned():
    scores = score_examples(TASK, "forgetting", cads.ComputeBudget(40), INNER)
    assert (scores >= 0).all()
    assert scores.shape == (len(TASK),)
    # random labels are forgotten (or never learned) more than clean ones
    assert scores[TASK.sources == 1].mean() > scores[TASK.sources == 0].mean()


@pytest.mark.parametrize("method", ["random", "loss", "el2n", "grand", "forgetting"])
def test_sized_baselines_keep_exactly_size_examples(method):
    selection = run_baseline(TASK, method, cads.ComputeBudget(10), 15, INNER)
    assert len(selection) == 15 == int(selection.probabilities.sum())
    assert len(set(selection.indices.tolist())) == 15


def test_small_loss_keeps_clean_examples_and_best_source_is_clean():
    loss = run_baseline(TASK, "loss", cads.ComputeBudget(40), 20, INNER)
    assert (TASK.sources[loss.indices] == 0).float().mean() > 0.7
    best = run_baseline(TASK, "best-source", cads.ComputeBudget(20), None, INNER)
    assert (TASK.sources[best.indices] == 0).all()
    assert len(best) == 20
    assert set(best.settings["source_val_loss"]) == {"clean", "random-labels"}


def test_ties_are_broken_at_random_not_by_position(monkeypatch):
    import cads.baselines

    monkeypatch.setattr(cads.baselines, "score_examples", lambda *a, **k: torch.zeros(len(TASK)))
    first = run_baseline(TASK, "el2n", cads.ComputeBudget(5), 10, INNER, seed=0)
    assert first.indices.tolist() != list(range(10))
    other = run_baseline(TASK, "el2n", cads.ComputeBudget(5), 10, INNER, seed=1)
    assert other.indices.tolist() != first.indices.tolist()


@pytest.mark.parametrize(
    ("method", "size", "message"),
    [
        ("random", None, "needs a selection size"),
        ("random", 0, "size must be an integer in 1..40"),
        ("random", 41, "size must be an integer in 1..40"),
        ("median", 5, "baseline must be one of"),
    ],
)
def test_bad_input(method, size, message):
    with pytest.raises(ValueError, match=message):
        run_baseline(TASK, method, cads.ComputeBudget(5), size)


def test_classification_scores_refuse_a_language_task():
    tokens = torch.zeros(4, 3, dtype=torch.long)
    task = cads.SelectionTask(
        inputs=tokens, targets=tokens, sources=tokens[:, 0], source_names=("a",),
        val_inputs=tokens, val_targets=tokens, test_inputs=tokens, test_targets=tokens,
        model_fn=cads.byte_lm, loss_fn=cads.token_loss, metric="loss",
    )  # fmt: skip
    with pytest.raises(ValueError, match="el2n scores need a classification task"):
        score_examples(task, "el2n", cads.ComputeBudget(2))
