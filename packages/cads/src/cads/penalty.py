"""CADS: the penalty-based single-level relaxation (CADS-E over examples, CADS-S over sources).

The bilevel problem ``min_s E_{m~p(·|s)} L_val(θ_C(m))`` needs, for every draw, a model trained
for the whole budget. CADS instead trains one model ``θ`` jointly with ``s`` on

    L_CADS(θ, s) = E_{m ~ p(·|s)} [ L_val(θ) + α (L_trn(θ, m) − l(|m|))² ],

where ``l(|m|)`` is the training loss a model reaches on ``|m|`` examples within the budget
(:mod:`cads.surrogate`, fitted once). The penalty replaces the inner problem's optimality: it
asks ``θ`` to fit each drawn subset exactly as well as the budget allows, no better and no worse.
Per outer step, with ``K`` draws,

    ∇_θ ≈ 1/K Σ_k [∇L_val(θ) + 2α (L_trn(θ, m_k) − l_k) ∇L_trn(θ, m_k)],
    ∇_s ≈ 1/K Σ_k [(L_val(θ) + α (L_trn(θ, m_k) − l_k)²) − b_k] ∇_s log p(m_k | s),

one Adam step on each. ``L_val(θ)`` is the same for every draw, so the baseline cancels it from
``∇_s``: the selection moves towards subsets whose current training loss matches what the budget
can reach. ``L_trn(θ, m_k)`` is the mean loss of ``m_k``'s members in the pool, in training
mode (as the surrogate measures ``l``, so that dropout or BatchNorm shift both alike): with
``pool_batch=None`` over the whole pool (exact, the paper's one pass per subset), otherwise
over one shared batch drawn with replacement, with the squared gap estimated without bias from
the batch's two independent halves (:func:`squared_gaps`). Either way all ``K`` draws cost one
forward and one backward pass together. A draw with no member in one of the halves (a small
subset) gets its exact gap from all its members instead; only an empty draw is left out of both
updates, and ``s`` is not updated in a step with fewer usable draws than the baseline needs
(two for the leave-one-out and mean baselines, one without: each draw's estimate of its
objective is unbiased, so one draw gives an unbiased gradient; ``draws_used`` in the trace).
"""

from __future__ import annotations

import time

import torch

from cads._util import plain, progress_disabled, random_batch
from cads.budget import ComputeBudget, InnerConfig
from cads.config import SelectConfig
from cads.estimator import MIN_DRAWS, score_function_gradient
from cads.selection import Selection, indices_from_probabilities
from cads.surrogate import LossSurrogate, fit_loss_surrogate
from cads.task import SelectionTask
from cads.units import Units

__all__ = ["pool_sample", "run_cads", "squared_gaps"]


def pool_sample(count: int, size: int | None, generator: torch.Generator) -> torch.Tensor:
    """The pool examples one CADS step reads: all of them (``size`` None or not smaller than the
    pool), else ``size`` drawn independently with replacement, so that the two halves of the
    batch are independent and :func:`squared_gaps` is unbiased."""
    if size is None or size >= count:
        return torch.arange(count)
    return torch.randint(0, count, (size,), generator=generator)


def squared_gaps(
    losses: torch.Tensor, members: torch.Tensor, targets: torch.Tensor, exact: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Estimates of ``(L_trn(θ, m_k) − l_k)²`` for ``K`` draws from one batch's losses.

    Args:
        losses: ``(B,)`` per-example losses of a batch: the whole pool, or ``B`` examples drawn
            independently with replacement (:func:`pool_sample`).
        members: ``(K, B)`` 0/1: which batch examples each draw selected.
        targets: ``(K,)`` the surrogate's ``l(|m_k|)``.
        exact: the batch is the whole pool, so each draw's mean loss is exact and is squared.
            Otherwise squaring a batch estimate would add its variance, larger for small
            subsets, and bias the selection towards large ones; the product of the gaps of the
            batch's two halves, independent given the draw, is unbiased instead (its gradient
            too: ``g_B ∇L_A + g_A ∇L_B`` for ``2 g ∇L``).

    Returns:
        ``(K,)`` the estimates, and ``(K,)`` bool: whether the draw had members to estimate
        from (in both halves); the others are 0 and must not be used.
    """

    def gap(part: slice) -> tuple[torch.Tensor, torch.Tensor]:
        counts = members[:, part].sum(1)
        return (members[:, part] @ losses[part]) / counts.clamp_min(1) - targets, counts > 0

    if exact:
        whole, valid = gap(slice(None))
        return torch.where(valid, whole**2, 0.0), valid
    half = len(losses) // 2
    (first, valid_first), (second, valid_second) = gap(slice(0, half)), gap(slice(half, None))
    valid = valid_first & valid_second
    return torch.where(valid, first * second, 0.0), valid


def run_cads(
    task: SelectionTask,
    budget: ComputeBudget,
    level: str = "example",
    config: SelectConfig = SelectConfig(),
    inner: InnerConfig = InnerConfig(),
    *,
    seed: int = 0,
    surrogate: LossSurrogate | None = None,
    progress: bool | None = None,
) -> Selection:
    """CADS-E (``level="example"``) or CADS-S (``level="source"``) for one budget.

    Args:
        surrogate: a fitted ``l(|m|)`` for this task, budget and inner configuration (fitted
            here, and counted in ``seconds``, when ``None``).
        progress: tqdm bar (``None``: only on a terminal).
    """
    from tqdm.auto import tqdm

    start = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    units = Units(task, level, config)
    bar = tqdm(
        total=(0 if surrogate else len(config.fractions)) + config.outer_steps,
        desc=f"cads-{level[0]} {budget}",
        disable=progress_disabled(progress),
        mininterval=5,
    )
    if surrogate is None:
        surrogate = fit_loss_surrogate(
            task,
            budget,
            inner,
            fractions=config.fractions,
            interpolation=config.interpolation,
            seed=seed,
            progress=bar,
        )
    model = task.model_fn(seed)
    device = next(model.parameters()).device
    model_optimizer = torch.optim.Adam(model.parameters(), lr=config.model_lr)
    variable = units.variable(config)
    trace = []
    model.train()
    for step in range(config.outer_steps):
        s = variable.value
        draws = units.distribution.sample(s, config.samples, generator)
        masks = units.example_masks(draws, generator)  # (K, N)
        sizes = masks.sum(1).double()
        targets = surrogate(sizes)  # l(|m_k|), (K,)
        batch = pool_sample(len(task), config.pool_batch, generator)
        val = random_batch(len(task.val_inputs), config.val_batch, generator)
        losses = task.loss_fn(model, task.inputs[batch].to(device), task.targets[batch].to(device))
        val_loss = task.loss_fn(
            model, task.val_inputs[val].to(device), task.val_targets[val].to(device)
        ).mean()
        members = masks[:, batch].to(losses.dtype).to(device)  # (K, B)
        squared_gap, valid = squared_gaps(
            losses, members, targets.to(losses), len(batch) == len(task)
        )
        # a draw with no member in a half of the batch (a small subset): its exact gap instead,
        # from all its members; only an empty draw is left out
        small = torch.nonzero(~valid.cpu() & (sizes > 0)).flatten().tolist()
        if small:
            squared_gap, valid = squared_gap.clone(), valid.clone()
        for k in small:
            own = torch.nonzero(masks[k]).flatten()
            exact = task.loss_fn(model, task.inputs[own].to(device), task.targets[own].to(device))
            squared_gap[k] = (exact.mean() - targets[k].to(exact)) ** 2
            valid[k] = True
        penalty = config.alpha * squared_gap  # (K,)
        objective = val_loss + penalty
        model_optimizer.zero_grad(set_to_none=True)
        (val_loss + (penalty[valid].mean() if valid.any() else 0.0)).backward()
        model_optimizer.step()
        values = objective.detach().double().cpu()
        keep = valid.cpu()
        norm = None  # no update of s with fewer usable (non-empty) draws than the baseline needs
        if int(keep.sum()) >= MIN_DRAWS[config.baseline]:
            scores = units.distribution.score(draws[keep], s)
            norm = variable.step(score_function_gradient(values[keep], scores, config.baseline))
        trace.append(
            {
                "step": step,
                "objective": float(values[keep].mean()) if keep.any() else float(val_loss),
                "val_loss": float(val_loss.detach()),
                "penalty": float(penalty.detach()[valid].mean()) if keep.any() else 0.0,
                "draws_used": int(keep.sum()),
                "expected_size": variable.expected_size(),
                "expected_draw_size": units.expected_draw_size(s),  # of this step's draws
                "grad_norm": norm,
                "sigma": getattr(units.distribution, "sigma", None),
            }
        )
        units.anneal(config)
        bar.update(1)
    bar.close()
    probabilities = variable.value
    indices = indices_from_probabilities(probabilities, level, task.sources, seed)
    settings = {
        "config": plain(config),
        "inner": plain(inner),
        "seed": seed,
        "surrogate": surrogate.to_json(),
    }
    selection = Selection(
        f"cads-{level[0]}",
        level,
        probabilities,
        indices,
        budget,
        trace,
        settings,
        task.source_names,
        time.perf_counter() - start,
    )
    selection.model = model  # the jointly trained θ (the paper returns s* and θ*)
    return selection
