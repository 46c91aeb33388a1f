"""The DiLoCo paper's scaling laws: f(N) = A·N^α per method and f(N, M) = A·N^α·M^β jointly.

Inputs are sweep results: model sizes N, replica counts M and the fitted quantity (evaluation
loss, optimal inner lr, optimal batch size). Fits are least squares in log space with bootstrap
intervals (:func:`scaling_laws.fit_power_law`).

Example:
    >>> import numpy as np
    >>> from scaling_laws.diloco import fit_joint_law
    >>> n = np.array([35e6, 35e6, 180e6, 180e6, 550e6, 550e6])
    >>> m = np.array([1, 4, 1, 4, 1, 4])
    >>> law = fit_joint_law(n, m, 19.226 * n**-0.0985 * m**0.0116, n_bootstrap=0)
    >>> [round(e, 4) for e in law.exponents]
    [-0.0985, 0.0116]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scaling_laws.power_law import PowerLaw, fit_power_law

__all__ = ["PAPER_JOINT_LAWS", "PAPER_LOSS_LAWS", "fit_joint_law", "fit_model_size_law"]

# f(N) = A · N^α for the evaluation loss, per method (A, α)
PAPER_LOSS_LAWS = {
    "data_parallel": (18.129, -0.0953),
    "M=1": (18.363, -0.0961),
    "M=2": (18.768, -0.0969),
    "M=4": (19.762, -0.0992),
    "M=8": (21.051, -0.1018),
}
# f(N, M) = A · N^α · M^β (A, α, β)
PAPER_JOINT_LAWS = {
    "loss": (19.226, -0.0985, 0.0116),
    "inner_lr": (22256.0, -0.8827, 0.2929),
    "batch_size": (0.00709, 0.4695, 0.3399),
}


def fit_model_size_law(
    params: Sequence[float], values: Sequence[float], *, n_bootstrap: int = 1000, seed: int = 0
) -> PowerLaw:
    """f(N) = A · N^α from one method's sweep (N, value) pairs."""
    return fit_power_law(
        np.asarray(params, float),
        np.asarray(values, float),
        n_bootstrap=n_bootstrap,
        seed=seed,
        names=("N",),
    )


def fit_joint_law(
    params: Sequence[float],
    replicas: Sequence[float],
    values: Sequence[float],
    *,
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> PowerLaw:
    """f(N, M) = A · N^α · M^β across model sizes and replica counts (needs ≥ 2 of each)."""
    x = np.column_stack([np.asarray(params, float), np.asarray(replicas, float)])
    if len(np.unique(x[:, 0])) < 2 or len(np.unique(x[:, 1])) < 2:
        raise ValueError("the joint law needs at least two model sizes and two replica counts")
    return fit_power_law(
        x, np.asarray(values, float), n_bootstrap=n_bootstrap, seed=seed, names=("N", "M")
    )
