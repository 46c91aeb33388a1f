"""Learning-rate schedules as per-step arrays.

Every builder returns a float64 array ``lrs`` of shape ``(total_steps,)``: ``lrs[i]`` is the
learning rate used by optimizer step ``i + 1``. Warmup is linear from ``lr / warmup_steps`` up to
``lr`` over the first ``warmup_steps`` steps. These arrays feed :func:`scaling_laws.areas`, the
LR-annealing law's ``predict`` and any training loop (``group["lr"] = lrs[step]``).

Example:
    >>> from scaling_laws import schedules
    >>> lrs = schedules.wsd(1000, 1e-3, warmup_steps=50, decay_fraction=0.2)
    >>> lrs.shape, float(lrs[500]), float(lrs[-1])
    ((1000,), 0.001, 0.0)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["WSD_SHAPES", "constant", "cosine", "from_array", "linear", "multistep", "wsd"]

WSD_SHAPES = ("linear", "cosine", "sqrt")


def _check(total_steps: int, lr: float, warmup_steps: int, final_lr: float = 0.0) -> None:
    if not isinstance(total_steps, int | np.integer) or total_steps < 1:
        raise ValueError(f"total_steps must be a positive integer, got {total_steps!r}")
    if not np.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    if not 0 <= warmup_steps < total_steps:
        raise ValueError(
            f"warmup_steps must be in [0, total_steps={total_steps}), got {warmup_steps}"
        )
    if not np.isfinite(final_lr) or not 0 <= final_lr <= lr:
        raise ValueError(f"final_lr must be in [0, lr={lr}], got {final_lr!r}")


def _warmup(lrs: np.ndarray, lr: float, warmup_steps: int) -> np.ndarray:
    if warmup_steps:
        lrs[:warmup_steps] = lr * np.arange(1, warmup_steps + 1) / warmup_steps
    return lrs


def _decay(progress: np.ndarray, shape: str) -> np.ndarray:
    """Fraction of the peak-to-final gap still left at ``progress`` in [0, 1]."""
    if shape == "linear":
        return 1.0 - progress
    if shape == "cosine":
        return 0.5 * (1.0 + np.cos(np.pi * progress))
    if shape == "sqrt":
        return 1.0 - np.sqrt(progress)
    raise ValueError(f"shape must be one of {WSD_SHAPES}, got {shape!r}")


def _annealed(
    total_steps: int, lr: float, warmup_steps: int, final_lr: float, start: int, shape: str
) -> np.ndarray:
    """Constant ``lr`` until step ``start``, then ``shape`` decay to ``final_lr`` at the end."""
    lrs = np.full(total_steps, float(lr))
    length = total_steps - start
    if length > 0:
        progress = np.arange(1, length + 1) / length
        lrs[start:] = final_lr + (lr - final_lr) * _decay(progress, shape)
    return _warmup(lrs, lr, warmup_steps)


def constant(total_steps: int, lr: float, *, warmup_steps: int = 0) -> np.ndarray:
    """Constant ``lr`` after a linear warmup."""
    _check(total_steps, lr, warmup_steps)
    return _warmup(np.full(total_steps, float(lr)), lr, warmup_steps)


def cosine(
    total_steps: int, lr: float, *, warmup_steps: int = 0, final_lr: float = 0.0
) -> np.ndarray:
    """Warmup, then cosine decay from ``lr`` to ``final_lr`` at the last step."""
    _check(total_steps, lr, warmup_steps, final_lr)
    return _annealed(total_steps, lr, warmup_steps, final_lr, warmup_steps, "cosine")


def linear(
    total_steps: int, lr: float, *, warmup_steps: int = 0, final_lr: float = 0.0
) -> np.ndarray:
    """Warmup, then linear decay from ``lr`` to ``final_lr`` at the last step."""
    _check(total_steps, lr, warmup_steps, final_lr)
    return _annealed(total_steps, lr, warmup_steps, final_lr, warmup_steps, "linear")


def wsd(
    total_steps: int,
    lr: float,
    *,
    warmup_steps: int = 0,
    decay_fraction: float = 0.2,
    shape: str = "linear",
    final_lr: float = 0.0,
) -> np.ndarray:
    """Warmup-stable-decay: constant ``lr``, then the last ``decay_fraction`` of the steps anneal
    to ``final_lr`` with ``shape`` (``"linear"``, ``"cosine"`` or ``"sqrt"``)."""
    _check(total_steps, lr, warmup_steps, final_lr)
    if not 0.0 <= decay_fraction <= 1.0:
        raise ValueError(f"decay_fraction must be in [0, 1], got {decay_fraction!r}")
    if shape not in WSD_SHAPES:
        raise ValueError(f"shape must be one of {WSD_SHAPES}, got {shape!r}")
    start = max(warmup_steps, total_steps - round(decay_fraction * total_steps))
    return _annealed(total_steps, lr, warmup_steps, final_lr, start, shape)


def multistep(
    total_steps: int,
    lr: float,
    *,
    milestones: Sequence[float] = (0.8, 0.9),
    gamma: float = 0.316,
    warmup_steps: int = 0,
) -> np.ndarray:
    """Step decay: the lr is multiplied by ``gamma`` at each milestone.

    Milestones below 1 are fractions of ``total_steps``, others are step indices (the first step
    that uses the lowered lr, 0-based).
    """
    _check(total_steps, lr, warmup_steps)
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
    lrs = np.full(total_steps, float(lr))
    for milestone in sorted(milestones):
        index = round(milestone * total_steps) if milestone < 1 else int(milestone)
        if not warmup_steps <= index <= total_steps:
            raise ValueError(
                f"milestone {milestone} is step {index}, outside [warmup_steps, total_steps]"
            )
        lrs[index:] *= gamma
    return _warmup(lrs, lr, warmup_steps)


def from_array(lrs: Sequence[float] | np.ndarray) -> np.ndarray:
    """Validate a user schedule: 1-D, finite, non-negative, at least one step."""
    array = np.asarray(lrs, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"lrs must be a non-empty 1-D sequence, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError("lrs contains NaN or infinite values")
    if np.any(array < 0):
        raise ValueError(f"lrs must be non-negative, found {array.min()!r}")
    return array
