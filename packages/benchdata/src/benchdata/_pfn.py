"""LC-PFN's curve normalization, as the CFBO authors apply it when they load a benchmark."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


def pfn_normalize(
    *, lb: float, ub: float, soft_lb: float, soft_ub: float, minimize: bool
) -> Callable[[np.ndarray | float], np.ndarray]:
    """LC-PFN's `pfn_normalize` (the CFBO authors' copy), forward map only, in numpy.

    [soft_lb, soft_ub] is mapped linearly onto [-1, 1], where a sigmoid is nearly linear; the
    sigmoid is then scaled so that the hard bounds [lb, ub] (either may be infinite) land on 0 and
    1. With `minimize` the result is flipped (1 - y), so lower raw values score higher.
    """
    if not (lb <= soft_lb < soft_ub <= ub):
        raise ValueError(
            f"cannot normalize: need lb <= soft_lb < soft_ub <= ub, got {lb}, {soft_lb}, "
            f"{soft_ub}, {ub} (are all values equal?)"
        )

    def lin_soft(x):
        return 2.0 / (soft_ub - soft_lb) * (x - soft_lb) - 1.0

    def sigmoid(x):
        with np.errstate(over="ignore"):  # far below the soft range: exp overflows, sigmoid is 0
            return 1.0 / (1.0 + np.exp(-lin_soft(np.asarray(x, dtype=np.float64))))

    if math.isfinite(lb) and math.exp(min(-lin_soft(lb), 709.0)) > 1e300:
        lb = -math.inf  # as LC-PFN: a lower bound far below the soft range would overflow
    e_lb = math.exp(-lin_soft(lb)) if math.isfinite(lb) else math.inf
    e_ub = math.exp(-lin_soft(ub)) if math.isfinite(ub) else 0.0
    if math.isinf(lb) and math.isinf(ub):
        a, b = 1.0, 0.0
    elif math.isinf(lb):
        a, b = 1.0 + e_ub, 0.0
    elif math.isinf(ub):
        a = 1.0 / (1.0 - 1.0 / (1.0 + e_lb))
        b = 1.0 - a
    else:
        a = (1.0 + e_ub + e_lb + e_ub * e_lb) / (e_lb - e_ub)
        b = -a / (1.0 + e_lb)

    def forward(x):
        y = a * sigmoid(x) + b
        return 1.0 - y if minimize else y

    return forward
