"""The two cells TFLA computes, as one parametrised formula.

mLSTM (``exp``): exponential input gate, log-weights ``logD_tj = F_t - F_j + i_j`` with
``F = cumsum(logσ(f))``, stabilized by ``m_t = max_j logD_tj``; the output is
``h_t = N_t / (max(|z_t|, exp(-m_t)) + eps)``.

mLSTMsig (``sig``): sigmoid input gate, ``logD_tj = F_t - F_j + logσ(i_j) <= 0``, so no
stabilizer is needed (``m = 0``); the output is ``N_t / (max(|z_t|, 1) + eps)`` when normalized,
``N_t`` otherwise. With ``m = 0`` the mLSTM formula becomes exactly the mLSTMsig one, which is
why every implementation here shares one code path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Variant:
    """``stabilized``: exponential input gate with the max state ``m`` (mLSTM); otherwise the
    sigmoid input gate with ``m = 0`` (mLSTMsig). ``normalize``: divide by the normalizer."""

    stabilized: bool
    normalize: bool

    def __post_init__(self) -> None:
        if self.stabilized and not self.normalize:
            raise ValueError("the mLSTM (exponential input gate) is always normalized")

    def log_input_gate(self, i: torch.Tensor) -> torch.Tensor:
        """``i`` for the mLSTM, ``logσ(i)`` for the mLSTMsig."""
        return i if self.stabilized else F.logsigmoid(i)

    def output(
        self, numerator: torch.Tensor, z: torch.Tensor, m: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """``h`` from the numerator ``(..., DV)``, the normalizer ``z (...)`` and ``m (...)``."""
        return numerator / self.denominator(z, m, eps)[..., None]

    def denominator(self, z: torch.Tensor, m: torch.Tensor, eps: float) -> torch.Tensor:
        """``max(|z|, exp(-m)) + eps``, ``max(|z|, 1) + eps`` or ``1``; shape of ``z``."""
        if self.stabilized:
            return torch.maximum(z.abs(), torch.exp(-m)) + eps
        if self.normalize:
            return z.abs().clamp_min(1.0) + eps
        return torch.ones_like(z)


MLSTM = Variant(stabilized=True, normalize=True)


def mlstmsig(normalize: bool) -> Variant:
    """The mLSTMsig variant, normalized or not."""
    return Variant(stabilized=False, normalize=bool(normalize))
