"""The QCS solver descends a known objective, stays on its budgets, and handles the edges."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_llama, tiny_task

import qcs
import qcs.solver as solver
from qcs import LoraSettings, QCSConfig, TrainConfig, Workbench, run_qcs

BAD = {0, 1, 2, 3}


@pytest.fixture
def bench():
    tokenizer, pool, validation = tiny_task()
    return Workbench(tiny_llama(len(tokenizer)), pool, validation, LoraSettings(layers=1))


def _known_objective(monkeypatch, bench, value):
    """Replace the inner training by a record of the drawn coreset and the validation loss by
    ``value(indices, weights)``: the solver must then minimise that function."""
    drawn = {"indices": [], "weights": None}

    def fake_finetune(scorer, indices, config, *, token_weights=None, seed=0):
        drawn["indices"], drawn["weights"] = indices.tolist(), token_weights
        return [0.0]

    monkeypatch.setattr(solver, "finetune", fake_finetune)
    monkeypatch.setattr(bench.validation, "mean_loss",
                        lambda indices=None: value(drawn["indices"], drawn["weights"]))  # fmt: skip


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_sequence_policy_avoids_the_costly_sequences(monkeypatch, bench, optimizer):
    _known_objective(monkeypatch, bench, lambda idx, _w: float(len(set(idx) & BAD)))
    lr = 0.05 if optimizer == "adam" else 0.02
    config = QCSConfig(budget=0.5, token_level=False, outer_steps=40, samples=4, lr=lr,
                       optimizer=optimizer)  # fmt: skip
    selection = run_qcs(bench.pool, bench.validation, config, seed=1)
    assert set(selection.indices.tolist()) == {4, 5, 6, 7}
    assert abs(float(selection.scores.sum()) - 4) < 1e-9  # on the budget throughout
    assert selection.token_weights is None


def test_token_policy_down_weights_the_costly_tokens(monkeypatch, bench):
    # the loss grows with the weight of every drawn sequence's first response token
    _known_objective(monkeypatch, bench,
                     lambda idx, w: sum(float(w[i][0]) for i in idx))  # fmt: skip
    config = QCSConfig(budget=1.0, token_ratio=0.5, outer_steps=40, samples=4, token_lr=0.05)
    selection = run_qcs(bench.pool, bench.validation, config, seed=2)
    lengths = bench.pool.data.response_lengths
    for i, w in selection.token_weights.items():
        assert abs(float(w[0]) - 0.1) < 1e-6  # ε on the costly token
        assert int((w > 0.5).sum()) == max(1, round(0.5 * int(lengths[i])))


def test_edges_every_token_and_the_whole_pool(bench):
    """Targets the clip box cannot reach exactly (ρ = 1, budget 1) still run and round right."""
    config = QCSConfig(budget=1.0, token_ratio=1.0, outer_steps=2, samples=2,
                       inner=TrainConfig(steps=1, batch_size=8))  # fmt: skip
    selection = run_qcs(bench.pool, bench.validation, config)
    assert len(selection) == len(bench.pool.data)
    assert all(torch.allclose(w, torch.full_like(w, 0.9)) for w in selection.token_weights.values())


def test_refuses_scorers_over_different_models(bench):
    tokenizer, pool, validation = tiny_task()
    other = Workbench(tiny_llama(len(tokenizer)), pool, validation, LoraSettings(layers=1))
    with pytest.raises(ValueError, match="share one model"):
        run_qcs(bench.pool, other.validation, QCSConfig(outer_steps=1, samples=2))


@pytest.mark.gpu
def test_every_method_runs_on_the_gpu():
    """The same code on CUDA: cached prefixes, QCS, LESS's projection and IFD on the device."""
    tokenizer, pool, validation = tiny_task()
    model = tiny_llama(len(tokenizer)).to("cuda")
    bench = Workbench(model, pool, validation, LoraSettings(layers=1))
    config = QCSConfig(outer_steps=2, samples=2, inner=TrainConfig(steps=1, batch_size=4))
    for method in ("qcs", "less", "ifd"):
        less = qcs.LessConfig(warmup_fraction=0.5, projection_dim=32)
        selection = bench.select(method, 0.5, config=config, less=less)
        assert len(selection) == 4
        assert bench.evaluate(selection, TrainConfig(steps=2, batch_size=4))["val_loss"] > 0
