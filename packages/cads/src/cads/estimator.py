"""The Hessian-free outer gradient: a score-function (policy-gradient) estimator.

For draws ``x ~ p(· | s)`` (masks over examples, or sampling ratios over sources; see
:mod:`cads.distributions`),

    ∇_s E_x[f(x)] = E_x[f(x) ∇_s log p(x | s)],

which needs only values of ``f`` (a validation loss after inner training, or CADS's penalised
objective), never its derivative through the inner optimisation. With ``K`` draws, a baseline
``b_j`` subtracted from each ``f(x_j)`` leaves the estimate unbiased when it does not depend on
``x_j``: the leave-one-out mean of the other ``K − 1`` values does not; the mean of all ``K``
(the paper's self-critical form) equals it scaled by ``(K − 1)/K``, so it shrinks the estimate by
that factor.
"""

from __future__ import annotations

import torch

__all__ = ["BASELINES", "MIN_DRAWS", "score_function_gradient"]

BASELINES = ("leave_one_out", "mean", "none")
# the fewest draws each baseline can use: one draw has no other draws for a leave-one-out mean,
# and is its own mean (a zero estimate); without a baseline one draw's estimate is unbiased
MIN_DRAWS = {"leave_one_out": 2, "mean": 2, "none": 1}


def score_function_gradient(
    values: torch.Tensor, scores: torch.Tensor, baseline: str = "leave_one_out"
) -> torch.Tensor:
    """Estimate of ``∇_s E_{x ~ p(·|s)}[f(x)]`` from ``K`` independent draws.

    Args:
        values: ``(K,)`` the objective ``f(x_j)`` of each draw.
        scores: ``(K, n)`` the score functions ``∇_s log p(x_j | s)`` of the draws.
        baseline: ``"leave_one_out"`` (unbiased, needs ``K ≥ 2``), ``"mean"`` (the mean of all
            ``K``, as the paper writes it; needs ``K ≥ 2``) or ``"none"`` (unbiased from one
            draw on).

    Returns:
        ``(n,)``: ``1/K Σ_j (f(x_j) − b_j) ∇_s log p(x_j | s)``.

    Example:
        >>> import torch
        >>> from cads.distributions import BernoulliMasks
        >>> s = torch.full((4,), 0.5, dtype=torch.float64)
        >>> masks = BernoulliMasks().sample(s, 8, torch.Generator().manual_seed(0))
        >>> grad = score_function_gradient(masks.sum(1), BernoulliMasks().score(masks, s))
        >>> grad.shape
        torch.Size([4])
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be (K, n), got shape {tuple(scores.shape)}")
    if values.shape != scores.shape[:1]:
        raise ValueError(
            f"values must be ({scores.shape[0]},), one per draw, got {tuple(values.shape)}"
        )
    if not torch.isfinite(values).all():
        raise ValueError("values hold NaN or infinite entries (a diverged inner run?)")
    count = values.numel()
    values = values.to(scores.dtype)
    if baseline == "leave_one_out":
        if count < 2:
            raise ValueError("the leave-one-out baseline needs at least 2 draws (K >= 2)")
        values = values - (values.sum() - values) / (count - 1)
    elif baseline == "mean":
        if count < 2:
            raise ValueError(
                "the mean baseline needs at least 2 draws (K >= 2): with one it equals the "
                "draw's value and the estimate is zero"
            )
        values = values - values.mean()
    elif baseline != "none":
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    return (values.unsqueeze(1) * scores).mean(0)
