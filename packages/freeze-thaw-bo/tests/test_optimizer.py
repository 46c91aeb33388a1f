"""The ask/tell state machine: invariants (hypothesis), bad input, workers, save and resume."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from curves_fixtures import KnownCurvesSurrogate, curve_table
from hypothesis import given, settings
from hypothesis import strategies as st

from freeze_thaw_bo import CFBO, Utility, load_optimizer

TABLE = curve_table(n=8, epochs=6, seed=1)


def _cfbo(budget: float = 30, **kwargs) -> CFBO:
    return CFBO(
        TABLE.space,
        Utility(alpha=kwargs.pop("alpha", 0.1), budget=budget),
        budget,
        max_epochs=TABLE.max_epochs,
        candidates=list(TABLE.configs),
        surrogate=KnownCurvesSurrogate(TABLE.values, sigma=0.1),
        num_samples=32,
        **kwargs,
    )


@settings(max_examples=25, deadline=None)
@given(
    budget=st.integers(1, 60),
    workers=st.integers(1, 4),
    order=st.lists(st.integers(0, 3), min_size=60, max_size=60),
)
def test_ask_tell_invariants(budget, workers, order):
    """Prefix order, no finished or pending trial re-suggested, the budget never exceeded."""
    opt = _cfbo(budget=budget, stopping="none")
    held: list[tuple[int, int]] = []
    for pick in order:
        while len(held) < workers:
            trial, epoch = opt.ask()
            if trial is None:
                break
            assert trial not in {t for t, _ in held}, "a pending trial was suggested again"
            assert epoch == len(opt.values[trial]) + 1 <= opt.max_epochs
            held.append((trial, epoch))
        if not held:
            break
        trial, epoch = held.pop(pick % len(held))  # workers finish in any order
        opt.tell(trial, epoch, float(TABLE.values[trial, epoch - 1]))
        assert opt.budget_spent <= budget
    assert opt.budget_spent + len(held) <= budget
    for trial, values in enumerate(opt.values):
        np.testing.assert_array_equal(values, TABLE.values[trial, : len(values)])


def test_tell_rejects_bad_input():
    opt = _cfbo()
    trial, epoch = opt.ask()
    with pytest.raises(ValueError, match="out of order"):
        opt.tell(trial, epoch + 1, 0.5)
    with pytest.raises(ValueError, match="unknown trial"):
        opt.tell(99, 1, 0.5)
    with pytest.raises(ValueError, match="unknown trial"):
        opt.config(-1)
    with pytest.raises(ValueError, match="finite"):
        opt.tell(trial, epoch, math.nan)
    with pytest.raises(ValueError, match="cost"):
        opt.tell(trial, epoch, 0.5, cost=-1.0)
    opt.tell(trial, epoch, 0.5)
    with pytest.raises(ValueError, match="out of order"):
        opt.tell(trial, epoch, 0.5)  # the same epoch twice


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget": 0}, "budget"),
        ({"budget": -3}, "budget"),
        ({"max_epochs": 0}, "max_epochs"),
        ({"stopping": "often"}, "stopping"),
        ({"threshold": 1.5}, "threshold"),
        ({"budget_unit": "hours"}, "budget_unit"),
    ],
)
def test_constructor_rejects_bad_settings(kwargs, match):
    budget = kwargs.pop("budget", 30)
    with pytest.raises(ValueError, match=match):
        CFBO(
            TABLE.space,
            Utility(0.1, budget=30),
            budget,
            **{"max_epochs": 6, "candidates": list(TABLE.configs), **kwargs},
            surrogate=KnownCurvesSurrogate(TABLE.values),
        )


def test_finished_trials_are_never_thawed_and_the_pool_can_run_out():
    opt = _cfbo(budget=1000, stopping="none")
    while (suggestion := opt.ask()).trial_id is not None:
        trial, epoch = suggestion
        assert len(opt.values[trial]) < opt.max_epochs
        opt.tell(trial, epoch, float(TABLE.values[trial, epoch - 1]))
    assert opt.budget_spent == TABLE.values.size  # every epoch of every configuration, once


def test_budget_in_cost_units():
    opt = _cfbo(budget=10, budget_unit="cost", stopping="none")
    spent = 0.0
    while (suggestion := opt.ask()).trial_id is not None:
        cost = 0.5 + 0.25 * suggestion.trial_id
        if spent + cost > 10:
            with pytest.raises(ValueError, match="budget"):
                opt.tell(*suggestion, 0.5, cost=cost)
            break
        opt.tell(*suggestion, float(TABLE.values[suggestion.trial_id, suggestion.epoch - 1]), cost)
        spent += cost
        assert opt.budget_spent == pytest.approx(spent)
    with pytest.raises(ValueError, match="needs a finite cost"):
        _cfbo(budget=10, budget_unit="cost").tell(0, 1, 0.5)


def test_save_and_resume_give_the_same_next_suggestion(tmp_path):
    opt = _cfbo(budget=40, seed=5)
    for _ in range(7):
        trial, epoch = opt.ask()
        opt.tell(trial, epoch, float(TABLE.values[trial, epoch - 1]))
    pending = opt.ask()  # one suggestion held by a worker at save time
    opt.save(tmp_path / "state")
    resumed = load_optimizer(tmp_path / "state", surrogate=KnownCurvesSurrogate(TABLE.values, 0.1))
    assert resumed.pending == {pending.trial_id: pending.epoch}
    for _ in range(10):
        a, b = opt.ask(ignore_stop=True), resumed.ask(ignore_stop=True)
        assert a == b
        if a.trial_id is None:
            break
        value = float(TABLE.values[a.trial_id, a.epoch - 1])
        opt.tell(*a, value)
        resumed.tell(*b, value)
    assert resumed.estimated_regret() == opt.estimated_regret()


def test_load_refuses_missing_or_corrupt_state(tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved optimizer"):
        load_optimizer(tmp_path / "nothing")
    folder = _cfbo().save(tmp_path / "state")
    (folder / "optimizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt"):
        load_optimizer(folder)
    _cfbo().save(folder)
    state = json.loads((folder / "optimizer.json").read_text())
    state["method"] = "nope"
    (folder / "optimizer.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match="unknown method"):
        load_optimizer(folder)
