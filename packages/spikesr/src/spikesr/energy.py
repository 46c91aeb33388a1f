"""Energy from synaptic operations: spike-driven layers cost accumulates, the rest multiply-adds.

A convolution or linear layer whose input is the output of a spiking neuron (a LIF layer, ours
or SpikingJelly's) only adds a weight where a spike arrives, so it costs ``MACs x firing rate``
accumulates (ACs); any other layer, and the attention products of the DSA, cost their full
multiply-adds (MACs). With the 45 nm figures the paper uses, ``E = 0.9 pJ x ACs + 4.6 pJ x MACs``.
Batch norms fold into the preceding convolution at inference and neurons are not counted, as is
usual. The ANN twin (ReLU in place of LIF) gives its own MACs through the same meter.
"""

from __future__ import annotations

import contextvars
import math
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

E_AC_PJ = 0.9
E_MAC_PJ = 4.6

_METER: contextvars.ContextVar[EnergyMeter | None] = contextvars.ContextVar("meter", default=None)


def add_macs(count: float, name: str = "attention") -> None:
    """Record ``count`` multiply-adds of a functional product (no-op outside a meter)."""
    meter = _METER.get()
    if meter is not None:
        meter.macs[name] = meter.macs.get(name, 0.0) + float(count)


@dataclass
class EnergyMeter:
    """Counts the synaptic operations of every forward pass run inside ``with meter.track(model)``.

    Attributes:
        macs: multiply-adds by layer name (``"attention"`` for the DSA's products).
        acs: accumulates by layer name (spike-driven layers).
        rates: firing rate of each spike-driven layer's input (the last pass).
    """

    macs: dict[str, float] = field(default_factory=dict)
    acs: dict[str, float] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)

    @property
    def total_macs(self) -> float:
        return sum(self.macs.values())

    @property
    def total_acs(self) -> float:
        return sum(self.acs.values())

    @property
    def energy_pj(self) -> float:
        """``0.9 pJ x ACs + 4.6 pJ x MACs``."""
        return E_AC_PJ * self.total_acs + E_MAC_PJ * self.total_macs

    # the spike tensors alive in this pass (weakly held: a freed tensor leaves the set, so a later
    # tensor at the same address is never taken for spikes)
    _spikes: weakref.WeakValueDictionary = field(
        default_factory=weakref.WeakValueDictionary, repr=False
    )

    def _record(self, name: str, module: nn.Module, x: torch.Tensor, out: torch.Tensor) -> None:
        if isinstance(module, nn.Conv1d | nn.Conv2d):
            fan_in = module.in_channels // module.groups * math.prod(module.kernel_size)
            dense = out.numel() * fan_in
        else:
            dense = out.numel() * module.in_features
        if self._spikes.get(id(x)) is x:
            rate = float(x.float().mean())
            self.rates[name] = rate
            self.acs[name] = self.acs.get(name, 0.0) + dense * rate
        else:
            self.macs[name] = self.macs.get(name, 0.0) + float(dense)

    def track(self, model: nn.Module) -> _Tracking:
        """Context manager: hooks every conv / linear of ``model``, collects functional MACs."""
        return _Tracking(self, model)


def is_spiking_neuron(module: nn.Module) -> bool:
    """Our LIF, or any SpikingJelly neuron (its ``...Node`` classes)."""
    from spikesr.neuron import LIF

    kind = type(module)
    return isinstance(module, LIF) or (
        kind.__module__.startswith("spikingjelly") and kind.__name__.endswith("Node")
    )


class _Tracking:
    def __init__(self, meter: EnergyMeter, model: nn.Module):
        self.meter, self.model, self.handles, self.token = meter, model, [], None

    def __enter__(self) -> EnergyMeter:
        spikes = self.meter._spikes
        for name, module in self.model.named_modules():
            if is_spiking_neuron(module):
                hook = lambda m, args, out: spikes.__setitem__(id(out), out)  # noqa: E731
                self.handles.append(module.register_forward_hook(hook))
            elif isinstance(module, nn.Conv1d | nn.Conv2d | nn.Linear):
                hook = lambda m, args, out, name=name: self.meter._record(name, m, args[0], out)  # noqa: E731
                self.handles.append(module.register_forward_hook(hook))
        self.token = _METER.set(self.meter)
        return self.meter

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        self.meter._spikes.clear()
        _METER.reset(self.token)


@torch.no_grad()
def measure_energy(model: nn.Module, images: torch.Tensor) -> EnergyMeter:
    """Run ``model(images)`` once in eval mode and return its operation counts (for the batch)."""
    meter = EnergyMeter()
    was_training = model.training
    model.eval()
    try:
        with meter.track(model):
            model(images)
    finally:
        model.train(was_training)
    return meter
