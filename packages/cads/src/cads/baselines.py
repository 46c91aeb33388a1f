"""Selection baselines at a fixed size: random, full data, the best single source, and the
classic importance scores.

Scores come from models trained on the whole pool for a fifth of the budget (the paper's cost
accounting assumes 0.2 C for the early training these scores need): a fifth of the steps the
budget buys, rounded, and at least one, whether the budget is given in steps or in FLOPs:

* ``loss``: each example's loss; the lowest are kept (the small-loss criterion against noise).
* ``el2n``: ``‖softmax(f(x)) − onehot(y)‖₂`` averaged over ``score_models`` runs (Paul et al.,
  2021); the highest are kept.
* ``grand``: the norm of each example's loss gradient over all parameters, averaged over runs
  (Paul et al., 2021); the highest are kept.
* ``forgetting``: forgetting events during the scoring run, counted each time an example is in
  a batch: a correct → incorrect flip of its prediction (Toneva et al., 2019); examples never
  classified correctly count as the most forgotten; the highest are kept. Each run lasts at
  least two passes over the pool (beyond the fifth of the budget when the pool is large), so
  that every example is seen twice and can flip; counts are averaged over runs.

Every scoring run trains with the inner configuration's optimizer and schedule.

Ties between equal scores are broken in a seeded random order, never by position in the pool.

``best-source`` trains one model per source for the budget and keeps the source with the lowest
validation loss (selection reads only the validation split).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from cads.budget import (
    ComputeBudget,
    InnerConfig,
    batch_stream,
    first_batch_flops,
    make_optimizer,
    train_under_budget,
)
from cads.selection import Selection
from cads.task import SelectionTask, evaluate, per_example_losses

__all__ = ["BASELINE_METHODS", "run_baseline", "score_examples"]

BASELINE_METHODS = ("random", "full", "best-source", "loss", "el2n", "grand", "forgetting")
SCORES = ("loss", "el2n", "grand", "forgetting")
KEEP_LOWEST = {"loss"}
SCORE_SHARE = 0.2  # of the budget, for the early training the scores need


def _score_budget(task: SelectionTask, budget: ComputeBudget, inner: InnerConfig, seed: int):
    """A fifth of the steps ``budget`` buys, at least one, as a step budget. A FLOP budget is
    turned into steps first (one step's FLOPs counted on the pool's first batch, as the scoring
    runs train on the whole pool), so that it gets the step a step budget would get."""
    flops = None
    if budget.unit == "flops":
        flops = first_batch_flops(task.model_fn(seed), task.loss_fn, task.inputs, task.targets,
                                  torch.arange(len(task)), inner.batch_size)  # fmt: skip
    return ComputeBudget(max(1, round(SCORE_SHARE * budget.steps(flops))))


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _grand(model: torch.nn.Module, task: SelectionTask, chunk: int = 256) -> torch.Tensor:
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in model.named_parameters()}

    def one(p, x, y):
        return task.loss_fn(lambda inp: functional_call(model, p, (inp,)), x[None], y[None])[0]

    per_example = vmap(grad(one), in_dims=(None, 0, 0))
    norms = []
    model.eval()
    for i in range(0, len(task), chunk):
        x, y = task.inputs[i : i + chunk], task.targets[i : i + chunk]
        grads = per_example(params, x.to(_device(model)), y.to(_device(model)))
        norms.append(torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads.values())).cpu())
    model.train()
    return torch.cat(norms)


@torch.no_grad()
def _el2n(model: torch.nn.Module, task: SelectionTask) -> torch.Tensor:
    model.eval()
    parts = []
    for i in range(0, len(task), 1024):
        logits = model(task.inputs[i : i + 1024].to(_device(model)))
        onehot = F.one_hot(task.targets[i : i + 1024].to(logits.device), logits.shape[-1])
        parts.append((logits.softmax(-1) - onehot.to(logits)).norm(dim=-1).cpu())
    model.train()
    return torch.cat(parts)


def _forgetting(task, budget, inner, seed) -> torch.Tensor:
    """Train on the whole pool, recording each presented example's correctness."""
    model = task.model_fn(seed)
    everything = torch.arange(len(task))
    flops = None
    if budget.unit == "flops":  # one step's FLOPs, counted on the first batch
        flops = first_batch_flops(model, task.loss_fn, task.inputs, task.targets, everything,
                                  inner.batch_size)  # fmt: skip
    steps = max(budget.steps(flops), -(-2 * len(task) // inner.batch_size))  # two passes at least
    optimizer, schedule = make_optimizer(model, inner, steps)
    device = _device(model)
    generator = torch.Generator().manual_seed(seed + 1)
    last = torch.zeros(len(task), dtype=torch.bool)
    learned = torch.zeros(len(task), dtype=torch.bool)
    events = torch.zeros(len(task))
    for batch in batch_stream(everything, inner.batch_size, steps, generator):
        x, y = task.inputs[batch].to(device), task.targets[batch].to(device)
        logits = model(x)
        correct = (logits.argmax(-1) == y).cpu()
        events.index_add_(0, batch, (last[batch] & ~correct).float())
        last[batch], learned[batch] = correct, learned[batch] | correct
        loss = F.cross_entropy(logits, y)  # the task's loss: forgetting needs a classifier
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if schedule is not None:
            schedule.step()
    events[~learned] = events.max() + 1
    return events


def score_examples(
    task: SelectionTask,
    score: str,
    budget: ComputeBudget,
    inner: InnerConfig = InnerConfig(),
    *,
    score_models: int = 2,
    seed: int = 0,
) -> torch.Tensor:
    """``(N,)`` importance scores of the pool's examples (see the module docstring)."""
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    if score in ("el2n", "forgetting") and task.metric != "accuracy":
        raise ValueError(f"{score} scores need a classification task (targets (N,))")
    early = _score_budget(task, budget, inner, seed)
    runs = []
    for run in range(score_models):
        if score == "forgetting":
            runs.append(_forgetting(task, early, inner, seed + run))
            continue
        model = task.model_fn(seed + run)
        train_under_budget(
            model,
            task.inputs,
            task.targets,
            torch.arange(len(task)),
            early,
            task.loss_fn,
            inner,
            generator=torch.Generator().manual_seed(seed + run),
        )
        if score == "loss":
            runs.append(per_example_losses(model, task.inputs, task.targets, task.loss_fn))
        elif score == "el2n":
            runs.append(_el2n(model, task))
        else:
            runs.append(_grand(model, task))
    return torch.stack(runs).mean(0)


def _best_source(task, budget, inner, seed) -> tuple[torch.Tensor, list[float]]:
    losses = []
    for j in range(len(task.source_names)):
        model = task.model_fn(seed)
        members = torch.nonzero(task.sources == j).flatten()
        train_under_budget(
            model,
            task.inputs,
            task.targets,
            members,
            budget,
            task.loss_fn,
            inner,
            generator=torch.Generator().manual_seed(seed + 1),
        )
        losses.append(evaluate(model, task.val_inputs, task.val_targets, task.loss_fn)["loss"])
    best = min(range(len(losses)), key=losses.__getitem__)
    return torch.nonzero(task.sources == best).flatten(), losses


def run_baseline(
    task: SelectionTask,
    method: str,
    budget: ComputeBudget,
    size: int | None = None,
    inner: InnerConfig = InnerConfig(),
    *,
    score_models: int = 2,
    seed: int = 0,
) -> Selection:
    """A baseline's selection of ``size`` examples (``full`` and ``best-source`` ignore it)."""
    if method not in BASELINE_METHODS:
        raise ValueError(f"baseline must be one of {BASELINE_METHODS}, got {method!r}")
    needs_size = method not in ("full", "best-source")
    if needs_size and size is None:
        raise ValueError(f"baseline {method!r} needs a selection size")
    if needs_size and not (isinstance(size, int) and 0 < size <= len(task)):
        raise ValueError(f"size must be an integer in 1..{len(task)} (the pool), got {size!r}")
    start = time.perf_counter()
    settings: dict = {
        "inner": {k: getattr(inner, k) for k in inner.__dataclass_fields__},
        "seed": seed,
        "size": size,
    }
    if method == "full":
        indices = torch.arange(len(task))
    elif method == "random":
        generator = torch.Generator().manual_seed(seed)
        indices = torch.sort(torch.randperm(len(task), generator=generator)[:size]).values
    elif method == "best-source":
        indices, losses = _best_source(task, budget, inner, seed)
        settings["source_val_loss"] = dict(zip(task.source_names, losses, strict=True))
        settings["source"] = task.source_names[int(task.sources[indices[0]])]
    else:
        scores = score_examples(task, method, budget, inner, score_models=score_models, seed=seed)
        if not torch.isfinite(scores).all():
            raise ValueError(f"{method} scores are not finite (a diverged scoring run?)")
        shuffle = torch.randperm(len(task), generator=torch.Generator().manual_seed(seed))
        ranked = torch.argsort(scores[shuffle], descending=method not in KEEP_LOWEST, stable=True)
        indices = torch.sort(shuffle[ranked][:size]).values
        settings["score_models"] = score_models
    mask = torch.zeros(len(task), dtype=torch.float64)
    mask[indices] = 1.0
    return Selection(
        method,
        "example",
        mask,
        indices,
        budget,
        [],
        settings,
        task.source_names,
        time.perf_counter() - start,
    )
