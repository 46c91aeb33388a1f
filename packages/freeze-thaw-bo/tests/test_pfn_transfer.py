"""Transfer of the learning-curve PFN: the authors' learning-curve mixup and fine-tuning.

Oracles: the convex-combination structure of mixup, and held-out NLL on a curve family the prior
does not contain.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pfn_fixtures import TINY, generator, one_thread
from pfn_fixtures import tiny_model as trained_tiny_model

from freeze_thaw_bo.pfn.batch import cut_tasks
from freeze_thaw_bo.pfn.model import LearningCurvePFN
from freeze_thaw_bo.pfn.train import FinetuneConfig, evaluate_nll, finetune_pfn, mixup_tables


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from one_thread()


@pytest.fixture(scope="module")
def tiny_model(_one_thread) -> LearningCurvePFN:
    return trained_tiny_model()


def _saturating_table(seed: int, n: int = 40, epochs: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """A 'real-ish' table: y = a(x) − b(x)·exp(−t/τ(x)) + noise, smooth in x, not the prior."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(n, 2))
    shift = rng.uniform(-0.1, 0.1)
    a = 0.55 + 0.35 * np.sin(2.5 * x[:, 0] + shift) * (1 - 0.5 * x[:, 1])
    b = 0.3 + 0.2 * x[:, 1]
    tau = 1.0 + 6.0 * x[:, 0]
    t = np.arange(1, epochs + 1)
    values = a[:, None] - b[:, None] * np.exp(-t[None, :] / tau[:, None])
    values = values + 0.01 * rng.standard_normal(values.shape)
    return x, np.clip(values, 0.0, 1.0)


def _mixing_weight(mixed: torch.Tensor, own: torch.Tensor, other: torch.Tensor) -> float:
    """The λ that best writes `mixed` as λ·own + (1 − λ)·other (least squares)."""
    d = (own - other).reshape(-1).double()
    return float(((mixed - other).reshape(-1).double() @ d) / (d @ d))


def test_mixup_forms_convex_combinations() -> None:
    """The authors' recipe: meta mixup mixes whole tables' curves with one λ per table on a shared
    grid; hyperparameter mixup mixes a row's configuration and curve with one λ per row."""
    x0, y0 = (torch.as_tensor(v, dtype=torch.float32) for v in _saturating_table(0))
    y1 = torch.as_tensor(_saturating_table(1)[1], dtype=torch.float32)
    tables = [(x0, y0), (x0, y1)]
    mixed_any = False
    for seed in range(4):
        meta = mixup_tables(tables, generator(seed), meta=True, hparam=False)
        for (x, mixed), own, other in zip(meta, (y0, y1), (y1, y0), strict=True):
            assert torch.equal(x, x0)
            if torch.allclose(mixed, own, atol=1e-6):  # paired with itself
                continue
            lam = _mixing_weight(mixed, own, other)
            assert -1e-6 <= lam <= 1.0 + 1e-6
            assert torch.allclose(mixed, lam * own + (1 - lam) * other, atol=1e-5)
            mixed_any = True
    assert mixed_any
    ((x_mixed, y_mixed),) = mixup_tables(tables[:1], generator(1), meta=False, hparam=True)
    for i in range(x0.shape[0]):
        candidates = []
        for j in range(x0.shape[0]):
            if j == i:
                continue
            lam = _mixing_weight(x_mixed[i], x0[i], x0[j])
            convex = -1e-6 <= lam <= 1 + 1e-6
            if convex and torch.allclose(x_mixed[i], lam * x0[i] + (1 - lam) * x0[j], atol=1e-5):
                candidates.append(
                    torch.allclose(y_mixed[i], lam * y0[i] + (1 - lam) * y0[j], atol=1e-5)
                )
        self_paired = torch.allclose(x_mixed[i], x0[i], atol=1e-6) and torch.allclose(
            y_mixed[i], y0[i], atol=1e-6
        )
        assert self_paired or any(candidates), i


def test_finetune_with_mixup_lowers_held_out_nll(tiny_model) -> None:
    tables = [_saturating_table(seed) for seed in range(4)]
    x_test, y_test = (torch.as_tensor(v, dtype=torch.float32) for v in _saturating_table(99))
    g = generator(21)
    held_out = [
        cut_tasks(
            x_test[None],
            y_test[None],
            torch.zeros(1),
            torch.zeros(1, dtype=torch.bool),
            g,
            max_context=TINY.max_context,
            num_queries=64,
        )
        for _ in range(24)
    ]
    before = evaluate_nll(tiny_model, held_out)
    tuned = finetune_pfn(
        tiny_model,
        tables,
        FinetuneConfig(steps=40, batch_size=8, num_queries=32, lr=1e-3),
        progress=False,
    )
    after = evaluate_nll(tuned, held_out)
    assert evaluate_nll(tiny_model, held_out) == before  # the input model is not modified
    # the prior's curves are far more varied than this family; fitting it must gain clearly
    assert after < before - 0.2
    with pytest.raises(ValueError, match="share D and T"):
        finetune_pfn(tiny_model, [tables[0], (tables[1][0], tables[1][1][:, :8])])
    with pytest.raises(ValueError, match="lie in"):
        finetune_pfn(tiny_model, [(tables[0][0], tables[0][1] + 2.0)])
