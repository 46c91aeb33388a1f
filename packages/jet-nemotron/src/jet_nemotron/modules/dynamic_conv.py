"""Dynamic short convolution: a causal depthwise conv whose kernel is generated per token.

The generator maps the block's input ``x_t`` to a kernel ``K_t ∈ R^{D×W}``:
``Linear(hidden → D / reduction, no bias) → SiLU → Linear(→ D·W, bias)``. Its output bias is the
static kernel the conv starts from.

Initialisation. The reference block zero-initialises both generator weights so that it starts as
a static conv; but then the gradient of each weight is a product with the other (zero) one, and
neither ever moves. (The reference *model* then re-draws every linear weight from
``N(0, initializer_range)`` and zeroes every bias, static kernel included: its generators learn,
but do not start as a static conv.) Here the first weight is drawn from ``N(0, init_std)`` and
only the second is zero: the block starts as exactly the static conv given by the bias
(``N(0, init_std)``), the second weight gets a gradient at once (``SiLU(W1 x) ≠ 0``) and the first
one from the step after.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from jet_nemotron.ops.dynamic_conv import dynamic_causal_conv, dynamic_causal_conv_step


class DynamicShortConvolution(nn.Module):
    """Per-token causal depthwise convolution followed by SiLU.

    Args:
        hidden_size: channels ``D`` of the convolved input (the JetBlock's value dim).
        generator_input_size: width of the generator's input (the block's hidden size).
        kernel_size: ``W`` (the paper uses 4).
        generator_reduction: the generator's bottleneck is ``D // generator_reduction``.
        init_std: standard deviation of the first generator weight and of the static kernel
            (the output bias); the reference uses the model's ``initializer_range``.

    Example:
        >>> import torch
        >>> conv = DynamicShortConvolution(16, generator_input_size=8)
        >>> y, state = conv(torch.randn(2, 5, 16), torch.randn(2, 5, 8), use_cache=True)
        >>> y.shape, state.shape
        (torch.Size([2, 5, 16]), torch.Size([2, 16, 4]))
    """

    def __init__(
        self,
        hidden_size: int,
        generator_input_size: int,
        kernel_size: int = 4,
        generator_reduction: int = 8,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        if hidden_size < generator_reduction:
            raise ValueError(
                f"hidden_size={hidden_size} must be at least generator_reduction="
                f"{generator_reduction} (the generator's bottleneck would be empty)"
            )
        self.hidden_size = hidden_size
        self.kernel_size = kernel_size
        bottleneck = hidden_size // generator_reduction
        self.kernel_generator = nn.Sequential()
        self.kernel_generator.add_module("w1", nn.Linear(generator_input_size, bottleneck, False))
        self.kernel_generator.add_module("act", nn.SiLU())
        self.kernel_generator.add_module("w2", nn.Linear(bottleneck, hidden_size * kernel_size))
        nn.init.normal_(self.kernel_generator.w1.weight, std=init_std)
        nn.init.zeros_(self.kernel_generator.w2.weight)
        nn.init.normal_(self.kernel_generator.w2.bias, std=init_std)

    def kernels(self, generator_input: torch.Tensor) -> torch.Tensor:
        """``(..., hidden) -> (..., D, W)`` per-token kernels."""
        flat = self.kernel_generator(generator_input)
        return flat.unflatten(-1, (self.hidden_size, self.kernel_size))

    def forward(
        self,
        x: torch.Tensor,
        generator_input: torch.Tensor,
        conv_state: torch.Tensor | None = None,
        use_cache: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x (B, T, D)``, ``generator_input (B, T, hidden)``, ``conv_state (B, D, W)`` (the last
        ``W`` inputs) or ``None`` -> ``(SiLU(conv(x)) (B, T, D), new state or None)``. One token
        with a state takes the fused decode step."""
        kernels = self.kernels(generator_input).to(x.dtype)
        if conv_state is not None and x.shape[1] == 1:
            y, state = dynamic_causal_conv_step(x[:, 0], kernels[:, 0], conv_state.to(x.dtype))
            return F.silu(y)[:, None], (state if use_cache else None)
        y, state = dynamic_causal_conv(
            x, kernels, conv_state=conv_state, output_final_state=use_cache
        )
        return F.silu(y), state
