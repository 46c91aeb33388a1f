"""Benchmark of the LR-annealing fit against a plain ``scipy.optimize.curve_fit`` of the same law.

Both fit the law on noisy constant + cosine curves generated from known parameters and predict a
held-out WSD curve; the table gives the time ratio and each method's worst prediction error
against the true curve. ``curve_fit`` (Levenberg–Marquardt on raw losses, one start at a generic
guess) is what one writes without this package.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

from scaling_laws import schedules
from scaling_laws.lr_annealing import LRAnnealingLaw, areas, fit

__all__ = ["run"]

logger = logging.getLogger(__name__)

TRUTH = LRAnnealingLaw(L0=2.74, A=0.45, alpha=0.6, C=0.4)


def _curves(total: int, noise: float, seed: int, spikes: float = 0.0):
    """Constant and cosine curves with log-normal noise; a fraction ``spikes`` of the steps gets
    a +20% loss spike (the outliers real training curves have)."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, total + 1)
    curves = []
    for lrs in (schedules.constant(total, 2e-3), schedules.cosine(total, 2e-3)):
        losses = TRUTH.predict(lrs) * np.exp(rng.normal(0, noise, total))
        losses[rng.random(total) < spikes] *= 1.2
        curves.append((lrs, steps, losses))
    return curves


def _curve_fit_law(curves) -> LRAnnealingLaw:
    from scipy.optimize import curve_fit

    s1, s2, y = [], [], []
    for lrs, steps, losses in curves:
        a1, a2 = areas(lrs)
        s1.append(a1[steps - 1])
        s2.append(a2[steps - 1])
        y.append(losses)
    x = np.vstack([np.concatenate(s1), np.concatenate(s2)])

    def model(x, l0, a, alpha, c):
        return l0 + a * x[0] ** (-alpha) - c * x[1]

    params, _ = curve_fit(model, x, np.concatenate(y), p0=(1.0, 1.0, 0.5, 1.0), maxfev=20000)
    return LRAnnealingLaw(*map(float, params))


def run(
    device: str = "cpu", out: str | Path | None = None, *, quick: bool = False, repeat: int = 5
):
    from kernels_common.bench import compare

    if device != "cpu":
        raise ValueError("the fitting benchmark runs on the CPU (numpy/scipy)")
    total = 2000 if quick else 10_000
    held_out = schedules.wsd(total, 2e-3, decay_fraction=0.2)
    exact = TRUTH.predict(held_out)
    candidates = {}
    for label, spikes in (("", 0.0), (" +2% spikes", 0.02)):
        curves = _curves(total, noise=0.005, seed=0, spikes=spikes)
        candidates[f"scipy curve_fit{label}"] = lambda c=curves: torch.from_numpy(
            _curve_fit_law(c).predict(held_out)
        )
        candidates[f"scaling_laws.fit{label}"] = lambda c=curves: torch.from_numpy(
            fit(c).predict(held_out)
        )
    table = compare(
        candidates,
        baseline="scipy curve_fit",
        title=f"LR-annealing fit on 2 x {total} noisy steps, predict WSD",
        warmup=1,
        repeat=repeat,
        memory=False,
    )
    # worst relative error of the held-out prediction against the true curve, after step 100
    errors = {
        name: float(np.max(np.abs(fn().numpy()[100:] / exact[100:] - 1)))
        for name, fn in candidates.items()
    }
    logger.info("worst relative error of the held-out prediction: %s", errors)
    if out is not None:
        table.save(out, "bench_scaling_laws")
        Path(out, "bench_scaling_laws_errors.json").write_text(json.dumps(errors, indent=1))
    return table, errors
