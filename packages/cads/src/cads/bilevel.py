"""The conventional bilevel solvers CADS is measured against, on the same problem and budget.

* **Bilevel-CADS** (``bilevel-e`` / ``bilevel-s``), the paper's direct policy-gradient baseline:
  every outer step draws ``K`` selections, trains ``K`` fresh models for the whole budget, and
  feeds their validation losses to the score-function estimator. Its cost per step is ``K × C``.
* **Implicit differentiation** (``implicit-e`` / ``implicit-s``): the masks relaxed to weights
  ``w = s`` on each example's loss, a fresh model trained for the budget on the weighted loss,
  then the implicit-function hypergradient at the trained model,

      dL_val/ds = −(∂_s ∇_θ L_trn(θ, w(s)))ᵀ (H + λI)^{-1} ∇_θ L_val(θ),   H = ∇²_θ L_trn,

  with the inverse-Hessian-vector product by conjugate gradients or a Neumann series (Hessian-
  vector products by double backward on one pool batch). As the paper notes, a budget-limited
  inner run is not at a stationary point, so this gradient is itself an approximation. The
  relaxation also cannot say how much data to take: a budgeted run on a subset sees batches
  drawn from it, so its weighted loss is ``Σ w_i ℓ_i / Σ w_i``, unchanged when every weight is
  scaled, and the hypergradient is orthogonal to ``s`` itself (``Σ_i s_i ∂L/∂s_i = 0``); the
  expected size moves only as a side effect of the box and of Adam's per-coordinate steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from cads._util import plain, progress_disabled, random_batch
from cads.budget import ComputeBudget, InnerConfig, train_under_budget
from cads.config import SelectConfig
from cads.estimator import score_function_gradient
from cads.selection import Selection, indices_from_probabilities
from cads.task import SelectionTask, evaluate
from cads.units import Units

__all__ = ["implicit_hypergradient", "run_bilevel", "run_implicit"]


def _dot(a: list[torch.Tensor], b: list[torch.Tensor]) -> torch.Tensor:
    return sum((x * y).sum() for x, y in zip(a, b, strict=True))


def _conjugate_gradient(hvp, rhs: list[torch.Tensor], iterations: int) -> list[torch.Tensor]:
    """CG on ``A x = rhs``, stopped at the first direction of non-positive curvature (a
    network's Hessian is indefinite; Steihaug's rule): the iterate so far, or ``rhs`` itself if
    that happens at once."""
    x = [torch.zeros_like(r) for r in rhs]
    residual = [r.clone() for r in rhs]
    direction = [r.clone() for r in rhs]
    rr = _dot(residual, residual)
    for _ in range(iterations):
        if rr <= 1e-30:
            break
        hd = hvp(direction)
        curvature = _dot(direction, hd)
        if curvature <= 0:
            return x if any(bool(xi.any()) for xi in x) else [r.clone() for r in rhs]
        step = rr / curvature
        x = [xi + step * di for xi, di in zip(x, direction, strict=True)]
        residual = [ri - step * hi for ri, hi in zip(residual, hd, strict=True)]
        rr_new = _dot(residual, residual)
        direction = [ri + (rr_new / rr) * di for ri, di in zip(residual, direction, strict=True)]
        rr = rr_new
    return x


def _neumann(hvp, rhs: list[torch.Tensor], iterations: int, scale: float) -> list[torch.Tensor]:
    # (A)^{-1} v = η Σ_j (I − ηA)^j v, convergent when η‖A‖ < 1
    term = [scale * r for r in rhs]
    total = [t.clone() for t in term]
    for _ in range(iterations):
        hv = hvp(term)
        term = [t - scale * h for t, h in zip(term, hv, strict=True)]
        total = [a + t for a, t in zip(total, term, strict=True)]
    return total


def implicit_hypergradient(
    params: list[torch.Tensor],
    inner_loss: Callable[[], torch.Tensor],
    val_loss: Callable[[], torch.Tensor],
    outer: torch.Tensor,
    *,
    method: str = "cg",
    iterations: int = 20,
    damping: float = 0.0,
    neumann_scale: float = 1e-2,
) -> torch.Tensor:
    """``−(∂_outer ∇_θ L_in)ᵀ (H + λI)^{-1} ∇_θ L_val`` at the current ``params``.

    Args:
        params: the inner parameters ``θ`` (requiring grad).
        inner_loss: computes ``L_in(θ, outer)`` (differentiable in both).
        val_loss: computes ``L_val(θ)`` (no direct dependence on ``outer``).
        outer: the outer variable (a leaf requiring grad).
        method: ``"cg"`` or ``"neumann"``; ``damping``: ``λ``.

    Example:
        ``L_in = ½ (θ − w)²`` has ``θ*(w) = w``, so ``d L_val(θ*(w)) / dw = 2 (w − 2)`` for
        ``L_val = (θ − 2)²``: −3 at the inner optimum ``θ = w = 0.5`` (one conjugate-gradient
        iteration is exact in one dimension).

        >>> import torch
        >>> theta = torch.tensor([0.5], requires_grad=True)
        >>> w = torch.tensor([0.5], requires_grad=True)
        >>> g = implicit_hypergradient(
        ...     [theta],
        ...     lambda: 0.5 * ((theta - w) ** 2).sum(),
        ...     lambda: ((theta - 2) ** 2).sum(),
        ...     w,
        ...     iterations=1,
        ... )
        >>> float(g)
        -3.0
    """
    val_grad = torch.autograd.grad(val_loss(), params)
    inner_grad = torch.autograd.grad(inner_loss(), params, create_graph=True)

    def hvp(vector: list[torch.Tensor]) -> list[torch.Tensor]:
        products = torch.autograd.grad(inner_grad, params, vector, retain_graph=True)
        return [p + damping * v for p, v in zip(products, vector, strict=True)]

    if method == "cg":
        solution = _conjugate_gradient(hvp, list(val_grad), iterations)
    elif method == "neumann":
        solution = _neumann(hvp, list(val_grad), iterations, neumann_scale)
    else:
        raise ValueError(f"method must be 'cg' or 'neumann', got {method!r}")
    (mixed,) = torch.autograd.grad(inner_grad, [outer], solution, allow_unused=True)
    if mixed is None:
        return torch.zeros_like(outer)
    if not torch.isfinite(mixed).all():
        raise ValueError(
            "the implicit hypergradient is not finite: raise the damping or use "
            "fewer inverse-Hessian iterations"
        )
    return -mixed


def _finish(task, budget, level, method, variable, trace, config, inner, seed, start):
    probabilities = variable.value
    indices = indices_from_probabilities(probabilities, level, task.sources, seed)
    settings = {"config": plain(config), "inner": plain(inner), "seed": seed}
    return Selection(
        f"{method}-{level[0]}",
        level,
        probabilities,
        indices,
        budget,
        trace,
        settings,
        task.source_names,
        time.perf_counter() - start,
    )


def run_bilevel(
    task: SelectionTask,
    budget: ComputeBudget,
    level: str = "example",
    config: SelectConfig = SelectConfig(),
    inner: InnerConfig = InnerConfig(),
    *,
    seed: int = 0,
    progress: bool | None = None,
) -> Selection:
    """Bilevel-CADS: ``K`` full inner runs per outer step, validation losses → policy gradient.

    The ``K`` models of one step start from the same initialisation and batch order (common
    random numbers: their losses differ by the selection alone); each step draws new ones.
    """
    from tqdm.auto import tqdm

    start = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    units = Units(task, level, config)
    variable = units.variable(config)
    trace = []
    for step in tqdm(
        range(config.outer_steps),
        desc=f"bilevel-{level[0]} {budget}",
        disable=progress_disabled(progress),
        mininterval=5,
    ):
        s = variable.value
        draws = units.distribution.sample(s, config.samples, generator)
        masks = units.example_masks(draws, generator)
        values = []
        for mask in masks:
            model = task.model_fn(seed * 100_003 + step)
            subset = torch.nonzero(mask).flatten()
            train_under_budget(
                model,
                task.inputs,
                task.targets,
                subset,
                budget,
                task.loss_fn,
                inner,
                generator=torch.Generator().manual_seed(seed * 100_003 + step),
            )
            values.append(evaluate(model, task.val_inputs, task.val_targets, task.loss_fn)["loss"])
        values = torch.tensor(values, dtype=torch.float64)
        grad = score_function_gradient(values, units.distribution.score(draws, s), config.baseline)
        norm = variable.step(grad)
        trace.append(
            {
                "step": step,
                "objective": float(values.mean()),
                "val_loss": float(values.mean()),
                "expected_size": variable.expected_size(),
                "expected_draw_size": units.expected_draw_size(s),  # of this step's draws
                "grad_norm": norm,
            }
        )
        units.anneal(config)
    return _finish(task, budget, level, "bilevel", variable, trace, config, inner, seed, start)


def run_implicit(
    task: SelectionTask,
    budget: ComputeBudget,
    level: str = "example",
    config: SelectConfig = SelectConfig(),
    inner: InnerConfig = InnerConfig(),
    *,
    seed: int = 0,
    progress: bool | None = None,
) -> Selection:
    """Implicit differentiation: one weighted inner run per outer step, then the IFT gradient."""
    from tqdm.auto import tqdm

    start = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    units = Units(task, level, config)
    variable = units.variable(config)
    everything = torch.arange(len(task))
    trace = []
    for step in tqdm(
        range(config.outer_steps),
        desc=f"implicit-{level[0]} {budget}",
        disable=progress_disabled(progress),
        mininterval=5,
    ):
        s = variable.value.requires_grad_(True)
        weights = units.example_weights(s)
        model = task.model_fn(seed * 100_003 + step)
        device = next(model.parameters()).device
        train_under_budget(
            model,
            task.inputs,
            task.targets,
            everything,
            budget,
            task.loss_fn,
            inner,
            generator=torch.Generator().manual_seed(seed * 100_003 + step),
            example_weights=weights.detach(),
        )
        batch = random_batch(len(task), config.pool_batch, generator)
        val = random_batch(len(task.val_inputs), config.val_batch, generator)
        x, y = task.inputs[batch].to(device), task.targets[batch].to(device)
        vx, vy = task.val_inputs[val].to(device), task.val_targets[val].to(device)
        w = weights[batch].to(device)

        def inner_loss(x=x, y=y, w=w, model=model):
            return (w.to(torch.float32) * task.loss_fn(model, x, y)).sum() / w.sum().clamp_min(
                1e-12
            )

        def val_loss(vx=vx, vy=vy, model=model):
            return task.loss_fn(model, vx, vy).mean()

        params = [p for p in model.parameters() if p.requires_grad]
        hyper = implicit_hypergradient(
            params,
            inner_loss,
            val_loss,
            s,
            method=config.ihvp,
            iterations=config.ihvp_iterations,
            damping=config.damping,
            neumann_scale=config.neumann_scale,
        )
        val_value = float(val_loss().detach())
        norm = variable.step(hyper)
        trace.append(
            {
                "step": step,
                "objective": val_value,
                "val_loss": val_value,
                "expected_size": variable.expected_size(),
                "grad_norm": norm,
            }
        )
    return _finish(task, budget, level, "implicit", variable, trace, config, inner, seed, start)
