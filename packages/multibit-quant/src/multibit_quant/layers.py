"""Quantized Conv2d / Linear layers that switch bit-width at run time, and the config they share.

A :class:`QuantConv2d` / :class:`QuantLinear` is the original layer (same ``weight`` and ``bias``
parameters, same state-dict names) plus a weight quantizer and an input-activation quantizer. Its
``bits`` attribute chooses the precision of the next forward: 2 to 8, or ``FP_BITS`` (32) for the
full-precision layer. One set of full-precision weights serves every bit-width.

LSQ keeps one learned step per bit-width it was trained at (per output channel for weights, one
per layer for activations). A bit-width it was not trained at takes the steps of the nearest
trained one rescaled to keep the same clipping range (``s_b = s_t·Q_p(t)/Q_p(b)``): no data is
needed and nothing is fitted. DoReFa and clamp quantizers have no parameters, so any bit-width
works as is.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from multibit_quant.ops import check_bits, fake_quant_activation, fake_quant_weight
from multibit_quant.reference import (
    ACTIVATION_METHODS,
    CORRECTIONS,
    FP_BITS,
    WEIGHT_METHODS,
    lsq_grad_scale,
    lsq_init_step,
    lsq_range,
)

_UNKNOWN, _UNSIGNED, _SIGNED = -1, 0, 1
_MIN_STEP = 1e-8


@dataclass(frozen=True)
class QuantConfig:
    """How a layer quantizes.

    Attributes:
        weight: ``"dorefa"`` (tanh-normalised, as Any-Precision DNNs) or ``"lsq"``.
        activation: ``"clamp"`` (``[0, 1]``, as DoReFa / Any-Precision) or ``"lsq"``.
        correction: weight bias correction, ``"mean_var"`` (default), ``"mean"`` or ``None``.
        quantize_activations: also quantize each layer's input.
        signed_activations: ``None`` decides per layer at its first forward (signed if the input
            has a negative value, e.g. after LayerNorm; unsigned after a ReLU); or force one.
        backend: kernel backend (``None`` follows the tensors, see ``kernels_common``).
    """

    weight: str = "dorefa"
    activation: str = "clamp"
    correction: str | None = "mean_var"
    quantize_activations: bool = True
    signed_activations: bool | None = None
    backend: str | None = None

    def __post_init__(self) -> None:
        if self.weight not in WEIGHT_METHODS:
            raise ValueError(f"weight must be one of {WEIGHT_METHODS}, got {self.weight!r}")
        if self.activation not in ACTIVATION_METHODS:
            raise ValueError(
                f"activation must be one of {ACTIVATION_METHODS}, got {self.activation!r}"
            )
        if self.correction not in CORRECTIONS:
            raise ValueError(f"correction must be one of {CORRECTIONS}, got {self.correction!r}")
        if self.signed_activations not in (None, True, False):
            raise ValueError(
                f"signed_activations must be None, True or False, got {self.signed_activations!r}"
            )


def check_bit_setting(bits: object) -> int:
    """A bit-width a layer can run at: 2 to 8, or 32 (full precision)."""
    if isinstance(bits, numbers.Integral) and not isinstance(bits, bool) and bits == FP_BITS:
        return FP_BITS
    return check_bits(bits, "bits (or 32 for full precision)")


def nearest_bits(bits: int, trained: tuple[int, ...]) -> int:
    """The trained bit-width closest to ``bits`` (the higher one on a tie)."""
    return min(trained, key=lambda t: (abs(t - bits), -t))


class QuantLayer(nn.Module):
    """Mixin of :class:`QuantConv2d` and :class:`QuantLinear`: bit-width state and quantizers."""

    weight: nn.Parameter

    def _setup(self, trained_bits: tuple[int, ...], config: QuantConfig) -> None:
        self.config = config
        self.trained_bits = tuple(sorted({check_bit_setting(b) for b in trained_bits}))
        self.bits = max(self.trained_bits)
        quantized = [b for b in self.trained_bits if b != FP_BITS]
        signed = {None: _UNKNOWN, False: _UNSIGNED, True: _SIGNED}[config.signed_activations]
        # on the weight's device: quantize() may wrap a model already on an accelerator
        device, dtype = self.weight.device, self.weight.dtype
        self.register_buffer("act_sign", torch.tensor(signed, dtype=torch.int8, device=device))
        self.weight_steps = nn.ParameterDict()
        self.act_steps = nn.ParameterDict()
        rows = self.weight.shape[0]
        for b in quantized:
            if config.weight == "lsq":
                flat = self.weight.detach().reshape(rows, -1)
                self.weight_steps[str(b)] = nn.Parameter(lsq_init_step(flat, b, dim=1))
            if config.quantize_activations and config.activation == "lsq":
                # set from the first batch quantized (LSQ's data-dependent init)
                self.act_steps[str(b)] = nn.Parameter(torch.zeros(1, dtype=dtype, device=device))
        self._signed: bool | None = None
        self._act_ready = False
        self.register_load_state_dict_post_hook(_forget_cached_state)

    @property
    def quantized_bits(self) -> tuple[int, ...]:
        return tuple(b for b in self.trained_bits if b != FP_BITS)

    def _step(self, steps: nn.ParameterDict, bits: int, signed: bool) -> torch.Tensor:
        """The LSQ step at ``bits``, kept positive (an optimizer step may push it below 0)."""
        if str(bits) in steps:
            return steps[str(bits)].clamp_min(_MIN_STEP)
        if not self.quantized_bits:
            raise ValueError(
                f"LSQ has no trained bit-width to derive the {bits}-bit step from: this layer "
                "was only trained in full precision"
            )
        nearest = nearest_bits(bits, self.quantized_bits)
        ratio = lsq_range(nearest, signed)[1] / lsq_range(bits, signed)[1]
        return steps[str(nearest)].detach().clamp_min(_MIN_STEP) * ratio

    def _signed_input(self, x: torch.Tensor) -> bool:
        # cached on the Python side: reading the buffer would synchronise a GPU every forward
        if self._signed is None:
            if int(self.act_sign) == _UNKNOWN:
                self.act_sign.fill_(_SIGNED if bool((x < 0).any()) else _UNSIGNED)
            self._signed = int(self.act_sign) == _SIGNED
        return self._signed

    def _init_act_steps(self, x: torch.Tensor, signed: bool) -> None:
        """LSQ's data-dependent init of every trained bit-width's step, from the first batch
        quantized (steps loaded from a checkpoint are nonzero and kept)."""
        with torch.no_grad():
            for key, step in self.act_steps.items():
                if float(step.detach()) == 0.0:
                    step.copy_(lsq_init_step(x, int(key), signed).reshape(1))
        self._act_ready = True

    def quantized_input(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's input at the current bit-width."""
        if self.bits == FP_BITS or not self.config.quantize_activations:
            return x
        signed = self._signed_input(x)
        step = grad_scale = None
        if self.config.activation == "lsq":
            if not self._act_ready:
                self._init_act_steps(x, signed)
            step = self._step(self.act_steps, self.bits, signed)
            # LSQ's N_F: the features of one example (a batch-independent scale)
            grad_scale = lsq_grad_scale(
                x[0].numel() if x.dim() > 1 else x.numel(), self.bits, signed
            )
        return fake_quant_activation(
            x, self.bits, self.config.activation, step, signed, grad_scale,
            backend=self.config.backend, check_step=False,  # clamped positive, no GPU sync
        )  # fmt: skip

    def quantized_weight(self, bits: int | None = None) -> torch.Tensor:
        """The weight as the layer uses it at ``bits`` (default: the current bit-width)."""
        bits = self.bits if bits is None else bits
        if bits == FP_BITS:
            return self.weight
        step = self._step(self.weight_steps, bits, True) if self.config.weight == "lsq" else None
        flat = fake_quant_weight(
            self.weight.reshape(self.weight.shape[0], -1),
            bits,
            self.config.weight,
            step,
            self.config.correction,
            backend=self.config.backend,
            check_step=False,  # clamped positive by _step; reading it would sync a GPU
        )
        return flat.view_as(self.weight)

    @classmethod
    def from_module(cls, layer: nn.Module, trained_bits: tuple[int, ...], config: QuantConfig):
        """Wrap ``layer`` (an ``nn.Conv2d`` for :class:`QuantConv2d`, an ``nn.Linear`` for
        :class:`QuantLinear`): the new layer holds the same weight and bias parameters."""
        wrapped = cls.__new__(cls)
        nn.Module.__init__(wrapped)  # its own, empty hook tables
        fresh = set(wrapped.__dict__)
        wrapped.__dict__.update({k: v for k, v in layer.__dict__.items() if k not in fresh})
        wrapped._parameters = dict(layer._parameters)
        wrapped._buffers = dict(layer._buffers)
        wrapped._non_persistent_buffers_set = set(layer._non_persistent_buffers_set)
        wrapped.training = layer.training
        wrapped._setup(trained_bits, config)
        return wrapped

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, bits={self.bits}, trained_bits={self.trained_bits}, "
            f"weight={self.config.weight}, activation={self.config.activation}, "
            f"correction={self.config.correction}"
        )


class QuantConv2d(QuantLayer, nn.Conv2d):
    """``nn.Conv2d`` with weights fake-quantized per output channel and a quantized input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(self.quantized_input(x), self.quantized_weight(), self.bias)


class QuantLinear(QuantLayer, nn.Linear):
    """``nn.Linear`` with weights fake-quantized per output row and a quantized input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.quantized_input(x), self.quantized_weight(), self.bias)


def _forget_cached_state(module: QuantLayer, incompatible_keys) -> None:
    """After a load, read the input sign and the activation steps again from the buffers."""
    module._signed = None
    module._act_ready = False
