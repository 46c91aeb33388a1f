"""Recurrent states of the mLSTM and the mLSTMsig, as named tuples (they unpack like the anchor's).

The mLSTM state is stabilized: the true matrix memory is ``C * exp(m)`` and the true normalizer
``n * exp(m)``. A sequence that starts without a state starts from ``C = 0``, ``n = 0`` and
``m = -inf`` (no contribution at all), which makes the chunkwise, recurrent and parallel forms the
same function, denominator ``eps`` included.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class MLSTMState(NamedTuple):
    """``C: (B, NH, DQK, DV)``, ``n: (B, NH, DQK)``, ``m: (B, NH, 1)``, float32."""

    C: torch.Tensor
    n: torch.Tensor
    m: torch.Tensor


class MLSTMSigState(NamedTuple):
    """``C: (B, NH, DQK, DV)``, ``n: (B, NH, DQK)``, float32 (no stabilizer: gates are <= 1)."""

    C: torch.Tensor
    n: torch.Tensor
