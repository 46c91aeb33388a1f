"""``quantize(model, bits=[...])``: one network, many bit-widths, switched with ``set_bits``.

``quantize`` swaps a model's ``nn.Conv2d`` / ``nn.Linear`` layers for :class:`QuantConv2d` /
:class:`QuantLinear` in place of the originals (same parameters), except the first and the last
(by default, as in DoReFa, LSQ and Any-Precision DNNs: the input layer and the classifier stay in
full precision), and returns a :class:`MultiBitModel`. BatchNorm layers stay as they are: with
weight bias correction one BatchNorm serves every bit-width. :func:`switch_batchnorm` gives the
Any-Precision baseline its one BatchNorm per trained bit-width instead.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from multibit_quant.layers import (
    QuantConfig,
    QuantConv2d,
    QuantLayer,
    QuantLinear,
    check_bit_setting,
    nearest_bits,
)


class SwitchBatchNorm2d(nn.Module):
    """One ``BatchNorm2d`` per trained bit-width, chosen by ``bits`` (Any-Precision DNNs).

    An untrained bit-width uses the BatchNorm of the nearest trained one (there is none of its
    own, and this package does no recalibration).
    """

    def __init__(self, bn: nn.BatchNorm2d, trained_bits: Iterable[int]) -> None:
        super().__init__()
        self.trained_bits = tuple(sorted(set(trained_bits)))
        self.norms = nn.ModuleDict({str(b): copy.deepcopy(bn) for b in self.trained_bits})
        self.bits = max(self.trained_bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norms[str(nearest_bits(self.bits, self.trained_bits))](x)


class MultiBitModel(nn.Module):
    """A model whose quantized layers run at a bit-width chosen at run time.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> net = nn.Sequential(
        ...     nn.Conv2d(1, 4, 3),
        ...     nn.ReLU(),
        ...     nn.Conv2d(4, 4, 3),
        ...     nn.Flatten(),
        ...     nn.Linear(4 * 24 * 24, 10),
        ... )
        >>> model = quantize(net, bits=[2, 4, 8])
        >>> model.set_bits(3)  # an untrained bit-width works too
        >>> model(torch.randn(2, 1, 28, 28)).shape
        torch.Size([2, 10])
    """

    def __init__(self, model: nn.Module, trained_bits: tuple[int, ...], config: QuantConfig):
        super().__init__()
        self.model = model
        self.trained_bits = trained_bits
        self.config = config
        self.bits = max(trained_bits)

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def quant_layers(self) -> list[QuantLayer]:
        return [m for m in self.model.modules() if isinstance(m, QuantLayer)]

    @property
    def quantized_names(self) -> list[str]:
        """Qualified names of the quantized layers (what ``quantize`` chose)."""
        return [name for name, m in self.model.named_modules() if isinstance(m, QuantLayer)]

    def set_bits(self, bits: int) -> MultiBitModel:
        """Run every quantized layer (and switchable BatchNorm) at ``bits``: 2–8, or 32."""
        bits = check_bit_setting(bits)
        for module in self.model.modules():
            if isinstance(module, QuantLayer | SwitchBatchNorm2d):
                module.bits = bits
        self.bits = bits
        return self

    @contextlib.contextmanager
    def bits_as(self, bits: int) -> Iterator[MultiBitModel]:
        """Run at ``bits`` inside the block, then return to the previous bit-width."""
        previous = self.bits
        self.set_bits(bits)
        try:
            yield self
        finally:
            self.set_bits(previous)

    def extra_repr(self) -> str:
        return f"bits={self.bits}, trained_bits={self.trained_bits}"


def _check_trained_bits(bits: Iterable[int]) -> tuple[int, ...]:
    values = list(bits) if not isinstance(bits, int) else [bits]
    if not values:
        raise ValueError("bits must name at least one bit-width (2-8, or 32)")
    return tuple(sorted({check_bit_setting(b) for b in values}))


def quantize(
    model: nn.Module,
    bits: Iterable[int] = (2, 4, 8),
    config: QuantConfig | None = None,
    *,
    keep_first: bool = True,
    keep_last: bool = True,
    exclude: Iterable[str] = (),
) -> MultiBitModel:
    """Make ``model`` a multi-bit network (its layers are replaced in place).

    Args:
        model: any ``nn.Module`` with ``nn.Conv2d`` / ``nn.Linear`` layers.
        bits: the bit-widths it will be trained at (2–8; 32 for full precision). Any other
            bit-width from 2 to 8 can be set later (``set_bits``), untrained.
        config: :class:`QuantConfig` (default: DoReFa weights, clamp activations, mean-and-
            variance bias correction).
        keep_first: leave the first Conv2d/Linear (in module order) in full precision.
        keep_last: leave the last Conv2d/Linear (in module order) in full precision.
        exclude: qualified names of further layers to leave in full precision.

    Returns:
        The :class:`MultiBitModel` around ``model``, set to the highest of ``bits``.

    Raises:
        ValueError: no layer left to quantize, unknown ``exclude`` names, bad bit-widths.
    """
    trained = _check_trained_bits(bits)
    config = QuantConfig() if config is None else config
    candidates = [
        (name, module)
        for name, module in model.named_modules()
        if type(module) in (nn.Conv2d, nn.Linear)
    ]
    names = {name for name, _ in candidates}
    unknown = sorted(set(exclude) - names)
    if unknown:
        raise ValueError(f"exclude names {unknown} are not Conv2d/Linear layers of the model")
    skip = set(exclude)
    if candidates and keep_first:
        skip.add(candidates[0][0])
    if candidates and keep_last:
        skip.add(candidates[-1][0])
    targets = [name for name, _ in candidates if name not in skip]
    if not targets:
        raise ValueError(
            f"{type(model).__name__} has no Conv2d/Linear layer left to quantize "
            f"(found {len(candidates)}; the first and last stay in full precision unless "
            "keep_first/keep_last are False)"
        )
    return quantize_layers(model, trained, config, targets)


def quantize_layers(
    model: nn.Module, bits: Iterable[int], config: QuantConfig, names: Iterable[str]
) -> MultiBitModel:
    """:func:`quantize` with the layers to quantize named explicitly (rebuilding a checkpoint)."""
    trained = _check_trained_bits(bits)
    for name in names:
        module = model.get_submodule(name)
        if type(module) not in (nn.Conv2d, nn.Linear):
            raise ValueError(f"{name!r} is a {type(module).__name__}, not a Conv2d/Linear layer")
        wrapper = QuantConv2d if isinstance(module, nn.Conv2d) else QuantLinear
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, leaf, wrapper.from_module(module, trained, config))
    return MultiBitModel(model, trained, config)


def switch_batchnorm(model: MultiBitModel) -> MultiBitModel:
    """Give every ``BatchNorm2d`` one copy per trained bit-width (the Any-Precision baseline)."""
    for name, module in list(model.model.named_modules()):
        if isinstance(module, nn.BatchNorm2d):
            parent_name, _, leaf = name.rpartition(".")
            parent = model.model.get_submodule(parent_name) if parent_name else model.model
            setattr(parent, leaf, SwitchBatchNorm2d(module, model.trained_bits))
    return model.set_bits(model.bits)


def trained_and_untrained(trained: Iterable[int], evaluate: Iterable[int]) -> dict[int, bool]:
    """``{bits: was it trained}`` for the bit-widths to evaluate."""
    trained = set(trained)
    return {b: b in trained for b in sorted({check_bit_setting(b) for b in evaluate})}
