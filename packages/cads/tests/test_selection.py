"""Selections save and load exactly; damaged files are errors; the chosen examples follow the
learned distribution; a selection is judged by a fresh model trained for the budget."""

from __future__ import annotations

import json

import pytest
import torch

import cads
from cads import Selection, indices_from_probabilities


def small_selection(level="source"):
    task = cads.toy_task(per_source=24)
    config = cads.SelectConfig(outer_steps=3, samples=2, fractions=(0.3, 1.0))
    inner = cads.InnerConfig(batch_size=8)
    method = "cads-s" if level == "source" else "cads-e"
    return task, cads.select(task, 6, method, config=config, inner=inner, progress=False)


@pytest.mark.parametrize("level", ["source", "example"])
def test_save_load_round_trip(tmp_path, level):
    _, selection = small_selection(level)
    loaded = Selection.load(selection.save(tmp_path / "sel"))
    torch.testing.assert_close(loaded.probabilities, selection.probabilities, rtol=0, atol=0)
    assert torch.equal(loaded.indices, selection.indices)
    assert (loaded.method, loaded.level, loaded.budget) == (
        selection.method,
        selection.level,
        selection.budget,
    )
    assert loaded.trace == selection.trace
    assert loaded.settings == selection.settings


def test_missing_and_damaged_files_are_errors(tmp_path):
    _, selection = small_selection()
    folder = selection.save(tmp_path / "sel")
    (folder / "selection.json").write_text('{"format_version": 1, "meth')
    with pytest.raises(ValueError, match="not a readable selection"):
        Selection.load(folder)
    (folder / "selection.json").write_text('{"format_version": 7}')
    with pytest.raises(ValueError, match="format_version 7, expected 1"):
        Selection.load(folder)
    (folder / "selection.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"no selection\.json"):
        Selection.load(folder)
    selection.save(folder)
    (folder / "selection.safetensors").write_bytes(b"\x00\x01")
    with pytest.raises(ValueError, match="not a readable selection"):
        Selection.load(folder)


def test_indices_follow_the_probabilities():
    s = torch.tensor([0.9, 0.1, 0.8, 0.7, 0.05], dtype=torch.float64)
    # example level: the round(Σ s) = 3 most probable examples
    assert indices_from_probabilities(s, "example", torch.zeros(5)).tolist() == [0, 2, 3]
    sources = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    ratios = torch.tensor([0.5, 1 / 3], dtype=torch.float64)
    chosen = indices_from_probabilities(ratios, "source", sources, seed=1)
    # source level: round(r_j n_j) examples of each source
    assert (sources[chosen] == 0).sum() == 2
    assert (sources[chosen] == 1).sum() == 2
    assert torch.equal(chosen, indices_from_probabilities(ratios, "source", sources, seed=1))


def test_evaluate_selection_trains_a_fresh_model_for_the_budget():
    task, selection = small_selection()
    result = cads.evaluate_selection(task, selection, 6, cads.InnerConfig(batch_size=8))
    assert result["steps"] == 6
    assert result["size"] == len(selection)
    model = task.model_fn(0)
    cads.train_under_budget(
        model,
        task.inputs,
        task.targets,
        selection.indices,
        6,
        task.loss_fn,
        cads.InnerConfig(batch_size=8),
        generator=torch.Generator().manual_seed(1),
    )
    expected = cads.evaluate(model, task.test_inputs, task.test_targets, task.loss_fn)
    assert result["test_accuracy"] == expected["accuracy"]
    assert result["test_loss"] == pytest.approx(expected["loss"], rel=1e-6)


def test_evaluate_refuses_empty_or_foreign_selections():
    task, _ = small_selection()
    with pytest.raises(ValueError, match="empty"):
        cads.evaluate_selection(task, torch.tensor([], dtype=torch.long), 5)
    with pytest.raises(ValueError, match=r"must lie in \[0, 48\)"):
        cads.evaluate_selection(task, torch.tensor([0, 48]), 5)
    with pytest.raises(ValueError, match=r"must lie in \[0, 48\)"):
        cads.evaluate_selection(task, torch.tensor([-1, 3]), 5)


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        (torch.tensor([0.7, 3.9]), "must be integers, got dtype torch.float32"),
        (torch.tensor([0.0, 3.0]), "must be integers, got dtype torch.float32"),
        (torch.tensor([True, False]), "must be integers, got dtype torch.bool"),
        (torch.tensor([[0, 1], [2, 3]]), r"must be a vector \(k,\), got \(2, 2\)"),
        (torch.tensor([0, 0, 0, 0]), "must be distinct: 4 indices name 1 examples"),
        ([5, 2, 5], "must be distinct: 3 indices name 2 examples"),
    ],
)
def test_evaluate_refuses_float_or_repeated_indices(indices, message):
    task, _ = small_selection()
    with pytest.raises(ValueError, match=message):
        cads.evaluate_selection(task, indices, 5)


def test_selection_json_is_plain(tmp_path):
    _, selection = small_selection()
    meta = json.loads((selection.save(tmp_path / "s") / "selection.json").read_text())
    assert meta["budget"] == {"amount": 6, "unit": "steps"}
    assert meta["source_names"] == ["clean", "random-labels"]
