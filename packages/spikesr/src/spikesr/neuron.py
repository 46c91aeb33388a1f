"""Multi-step spiking layers: the LIF neuron, threshold-dependent batch norm, and their factory.

Every layer here takes and returns time-major sequences ``(T, B, C, H, W)``. The LIF neuron and
tdBN compute exactly what SpikingJelly 2.0's ``LIFNode(decay_input=False, step_mode="m")`` and
``ThresholdDependentBatchNorm2d`` compute (the tests check both, values and gradients), but they
are stateless: the membrane potential starts at the reset value on every call, so nothing leaks
from one image to the next and there is no ``reset_net`` to forget. ``neuron="spikingjelly"``
builds SpikingJelly's own neuron instead (``pip install --no-deps spikingjelly==2.0.0 loguru``),
and the model resets it on every call.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

Neuron = Literal["lif", "spikingjelly", "relu"]
NEURONS: tuple[str, ...] = ("lif", "spikingjelly", "relu")
TDBN_ALPHA = 1 / math.sqrt(2)  # tdBN's alpha for a block with two summed branches (Zheng et al.)


class _SigmoidSpike(torch.autograd.Function):
    """Heaviside step forward; the derivative of ``sigmoid(alpha x)`` backward (surrogate)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, alpha: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.alpha = alpha
        return (x >= 0).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(ctx.alpha * x)
        return grad * ctx.alpha * s * (1 - s), None


def spike(x: torch.Tensor, alpha: float = 4.0) -> torch.Tensor:
    """``1[x >= 0]``, with the surrogate gradient ``alpha s (1 - s)``, ``s = sigmoid(alpha x)``."""
    return _SigmoidSpike.apply(x, alpha)


class LIF(nn.Module):
    """Multi-step leaky integrate-and-fire neuron with hard reset, input not decayed.

    For each time step ``t`` (``V[-1] = v_reset``):

        H[t] = V[t-1] + (v_reset - V[t-1]) / tau + X[t]
        S[t] = 1[H[t] >= v_threshold]              (sigmoid surrogate gradient, alpha 4)
        V[t] = H[t] (1 - S[t]) + v_reset S[t]      (the reset is not detached)

    Args:
        v_threshold: firing threshold (SpikeSR: 0.15).
        tau: membrane time constant (> 1).
        v_reset: hard-reset potential.
        alpha: sharpness of the sigmoid surrogate.
    """

    def __init__(
        self, v_threshold: float = 0.15, tau: float = 2.0, v_reset: float = 0.0, alpha: float = 4.0
    ):
        super().__init__()
        if tau <= 1:
            raise ValueError(f"tau must be > 1, got {tau}")
        self.v_threshold, self.tau, self.v_reset, self.alpha = v_threshold, tau, v_reset, alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = torch.full_like(x[0], self.v_reset)
        spikes = []
        for x_t in x:
            h = v + (self.v_reset - v) / self.tau + x_t
            s = spike(h - self.v_threshold, self.alpha)
            v = h * (1 - s) + self.v_reset * s
            spikes.append(s)
        return torch.stack(spikes)

    def extra_repr(self) -> str:
        return f"v_threshold={self.v_threshold}, tau={self.tau}, v_reset={self.v_reset}"


class SeqReLU(nn.ReLU):
    """ReLU in place of a LIF neuron: the spiking network's ANN twin."""


class TDBatchNorm(nn.BatchNorm2d):
    """Threshold-dependent batch norm (tdBN): a BatchNorm2d whose statistics run over time and
    batch together, with the scale initialised to ``alpha * v_th`` (the next neuron's threshold).
    """

    def __init__(self, channels: int, v_th: float, alpha: float = TDBN_ALPHA):
        super().__init__(channels)
        self.alpha, self.v_th = alpha, v_th
        nn.init.constant_(self.weight, alpha * v_th)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.flatten(0, 1)).unflatten(0, x.shape[:2])


class SeqConv2d(nn.Conv2d):
    """A Conv2d applied to every time step of a ``(T, B, C, H, W)`` sequence."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.flatten(0, 1)).unflatten(0, x.shape[:2])


def make_neuron(kind: str, v_threshold: float, tau: float) -> nn.Module:
    """The activation of the network: "lif" (ours), "spikingjelly" (its LIFNode), "relu" (ANN)."""
    if kind == "lif":
        return LIF(v_threshold, tau)
    if kind == "relu":
        return SeqReLU()
    if kind == "spikingjelly":
        try:
            from spikingjelly.activation_based import neuron
        except ImportError as error:
            raise ImportError(
                "neuron='spikingjelly' needs SpikingJelly 2.0: "
                "`pip install --no-deps spikingjelly==2.0.0 && pip install loguru` "
                "(with its declared dependencies it would pull torchvision and torchaudio); "
                "neuron='lif' computes the same without it"
            ) from error
        return neuron.LIFNode(tau=tau, v_threshold=v_threshold, decay_input=False, step_mode="m")
    raise ValueError(f"neuron must be one of {NEURONS}, got {kind!r}")


def reset_states(module: nn.Module) -> None:
    """Reset every SpikingJelly neuron inside ``module`` (ours keep no state between calls)."""
    for m in module.modules():
        if hasattr(m, "reset") and type(m).__module__.startswith("spikingjelly"):
            m.reset()
