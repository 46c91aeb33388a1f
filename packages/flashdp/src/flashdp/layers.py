"""DP versions of the supported layers: same parameters, clipping fused into the backward.

Each layer's autograd Function computes the input gradient as usual and, in the same backward,
each example's squared gradient norm and the means to form the clipped sum of its trainable
parameters (:class:`~flashdp.clipping.Contribution`), which it hands to the model's
:class:`~flashdp.controller.DPController`. It returns no gradient for the parameters: ``.grad`` is
written only by the controller, with noise, once per logical batch.

The first dimension of every input is the example (batch) dimension; any further leading
dimensions (sequence, ...) belong to the same example.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flashdp import reference
from flashdp.clipping import Contribution, clip_coefficients
from flashdp.controller import EMPTY_BATCH, DPController, mark_forward, refuse_recomputed
from flashdp.ops import (
    linear_weight_clipped_sum_op,
    linear_weight_norm2_op,
    linear_weight_store_clip_op,
)
from flashdp.plan import plan_linear
from kernels_common import Backend, resolve_backend


class DPLayer(nn.Module):
    """Base of the DP layers: the parameters of the layer it replaces plus the controller."""

    def __init__(self, controller: DPController, names: dict[str, str], layer_name: str) -> None:
        super().__init__()
        self._controller = controller
        self._names = names  # attribute ("weight") -> qualified name of a trainable parameter
        self._layer_name = layer_name

    def _per_example_scale(self, batch_size: int) -> float:
        """Factor turning the output gradient of the reduced loss into Σ_b ℓ_b's."""
        return float(batch_size) if self._controller.config.loss_reduction == "mean" else 1.0

    def _record(self, ctx: Any, batch_size: int, contributions: list[Contribution]) -> None:
        refuse_recomputed(ctx, self._controller, f"layer {self._layer_name!r}")
        # A second backward through the same forward (retain_graph=True) would add the same
        # examples' clipped gradients again: 2·C_l per example under one noise draw.
        if getattr(ctx, "flashdp_recorded", False):
            raise RuntimeError(
                f"backward ran twice through the same forward of layer {self._layer_name!r} "
                "(retain_graph=True): every example would be counted twice under one noise "
                "draw; run a new forward for every backward"
            )
        ctx.flashdp_recorded = True
        self._controller.record(self._layer_name, batch_size, contributions)

    def extra_repr(self) -> str:
        return f"{self._layer_name!r}, clipped={sorted(self._names)}"


def _batch_size(layer: DPLayer, tensor: torch.Tensor, min_dim: int) -> int:
    """The number of examples in ``tensor``; an empty batch is allowed in one process (its
    backward releases noise only), not across processes."""
    if tensor.dim() < min_dim:
        raise ValueError(
            f"{layer._layer_name}: input of shape {tuple(tensor.shape)} has no example "
            f"dimension; DP layers need inputs of at least {min_dim} dims with the examples first"
        )
    if tensor.shape[0] == 0 and torch.is_grad_enabled() and layer._controller.distributed:
        raise ValueError(f"{layer._layer_name}: {EMPTY_BATCH}")
    return tensor.shape[0]


def _as_bt(tensor: torch.Tensor, batch: int, width: int) -> torch.Tensor:
    """``(B, ..., width)`` -> ``(B, T, width)`` (a view where the layout allows), also for B = 0."""
    tokens = tensor.numel() // (batch * width) if batch * width else 0
    return tensor.reshape(batch, tokens, width)


def _matmul_contributions(
    layer: DPLayer, x: torch.Tensor, grad: torch.Tensor, has_bias: bool, transposed: bool
) -> list[Contribution]:
    """Contributions of ``y = x Wᵀ + b`` (``transposed``: ``y = x W + b``, GPT-2's Conv1D).

    The output gradient of the reduced loss is used as is (any float dtype, any strides); the
    factor turning it into the per-example gradients goes into the clipping coefficients."""
    batch = x.shape[0]
    x3, g3 = _as_bt(x, batch, x.shape[-1]), _as_bt(grad, batch, grad.shape[-1])
    scale = layer._per_example_scale(batch)
    controller = layer._controller
    config = controller.config
    backend = resolve_backend(config.backend, (x3, g3))
    with_bias = has_bias and "bias" in layer._names
    contributions = []
    bias_grads = None
    if "weight" in layer._names:
        name = layer._names["weight"]
        plan = plan_linear(
            batch,
            x3.shape[1],
            x3.shape[2],
            g3.shape[2],
            clipping=config.clipping,
            device=x.device.type,
            triton=backend is not Backend.REFERENCE,
            workspace_mb=config.workspace_mb,
            method=config.linear_method,
        )
        controller.note_plan(name, plan)
        if plan.method == "store":
            bound = controller.layer_bound(name)

            def coefficients(norm2: torch.Tensor) -> torch.Tensor:
                return clip_coefficients(norm2 * scale**2, bound) * scale

            norm2, summed, bias_grads = linear_weight_store_clip_op(
                x3, g3, coefficients, plan.chunk, with_bias, backend=backend
            )
            contributions.append(
                Contribution(name, norm2 * scale**2, summed.T if transposed else summed)
            )
        else:  # recompute: the Triton kernels; ghost: the PyTorch reference
            ops_backend = Backend.REFERENCE if plan.method == "ghost" else backend

            def weight_sum(coef: torch.Tensor) -> torch.Tensor:
                summed = linear_weight_clipped_sum_op(x3, g3, coef * scale, backend=ops_backend)
                return summed.T if transposed else summed

            norm2 = linear_weight_norm2_op(x3, g3, backend=ops_backend) * scale**2
            contributions.append(Contribution(name, norm2, weight_sum))
    if with_bias:
        if bias_grads is None:
            bias_grads = g3.sum(1, dtype=torch.float32)
        per_example = bias_grads * scale
        contributions.append(
            Contribution(layer._names["bias"], per_example.square().sum(1), per_example.T.mv)
        )
    return contributions


class _MatmulFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x, weight, bias, layer: DPLayer, transposed: bool) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.layer, ctx.transposed, ctx.has_bias = layer, transposed, bias is not None
        mark_forward(ctx)
        if transposed:
            out = x @ weight
            return out if bias is None else out + bias
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x = None
        if ctx.needs_input_grad[0]:
            # under autocast the forward ran in a lower precision than the saved weight
            weight = weight.to(grad.dtype)
            grad_x = grad @ (weight.T if ctx.transposed else weight)
        layer = ctx.layer
        layer._record(
            ctx, x.shape[0], _matmul_contributions(layer, x, grad, ctx.has_bias, ctx.transposed)
        )
        return grad_x, None, None, None, None


class DPLinear(DPLayer):
    """``nn.Linear`` with per-example clipping: input ``(B, *, in_features)``."""

    def __init__(self, source: nn.Linear, controller, names, layer_name) -> None:
        super().__init__(controller, names, layer_name)
        self.in_features, self.out_features = source.in_features, source.out_features
        self.weight = source.weight
        self.bias = source.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _batch_size(self, x, 2)
        return _MatmulFunction.apply(x, self.weight, self.bias, self, False)


class DPConv1D(DPLayer):
    """Hugging Face GPT-2 ``Conv1D`` (``y = x W + b``, ``W: (nx, nf)``) with per-example
    clipping: input ``(B, *, nx)``."""

    def __init__(self, source: nn.Module, controller, names, layer_name) -> None:
        super().__init__(controller, names, layer_name)
        self.nf = source.nf
        self.nx = source.weight.shape[0]
        self.weight = source.weight
        self.bias = source.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _batch_size(self, x, 2)
        return _MatmulFunction.apply(x, self.weight, self.bias, self, True)


class _EmbeddingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, indices, weight, layer: DPEmbedding) -> torch.Tensor:
        ctx.save_for_backward(indices)
        ctx.layer = layer
        mark_forward(ctx)
        return F.embedding(indices, weight, layer.padding_idx)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        (indices,) = ctx.saved_tensors
        layer: DPEmbedding = ctx.layer
        batch = indices.shape[0]
        flat = indices.reshape(batch, indices.numel() // batch if batch else 0)
        g3 = _as_bt(grad, batch, grad.shape[-1]).float() * layer._per_example_scale(batch)
        pad = layer.padding_idx

        def clipped_sum(coef: torch.Tensor) -> torch.Tensor:
            return reference.embedding_clipped_sum(flat, g3, coef, layer.num_embeddings, pad)

        norm2 = reference.embedding_norm2(flat, g3, pad)
        layer._record(ctx, batch, [Contribution(layer._names["weight"], norm2, clipped_sum)])
        return None, None, None


class DPEmbedding(DPLayer):
    """``nn.Embedding`` with per-example clipping: indices ``(B, *)``."""

    def __init__(self, source: nn.Embedding, controller, names, layer_name) -> None:
        super().__init__(controller, names, layer_name)
        self.num_embeddings, self.embedding_dim = source.num_embeddings, source.embedding_dim
        self.padding_idx = source.padding_idx
        self.weight = source.weight

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        _batch_size(self, indices, 1)
        return _EmbeddingFunction.apply(indices, self.weight, self)


class _NormFunction(torch.autograd.Function):
    """LayerNorm / RMSNorm over the trailing ``normalized_shape``. The forward saves each row's
    statistics (float32), from which the backward forms the input gradient and the per-example
    parameter gradients without recomputing the forward; the layer supplies the three parts."""

    @staticmethod
    def forward(ctx: Any, x, weight, bias, layer: _DPNorm) -> torch.Tensor:
        out, stats = layer._forward(x, weight, bias)
        ctx.save_for_backward(x, weight, bias, *stats)
        ctx.layer = layer
        mark_forward(ctx)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        x, weight, bias, *stats = ctx.saved_tensors
        layer: _DPNorm = ctx.layer
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = layer._grad_input(grad, x, weight, bias, stats)
        batch = x.shape[0]
        width = math.prod(layer.normalized_shape)
        rows = [s.reshape(batch, s.numel() // batch if batch else 0, 1) for s in stats]
        g3 = _as_bt(grad, batch, width).float() * layer._per_example_scale(batch)
        per_example = layer._per_example(_as_bt(x, batch, width).float(), g3, rows)
        contributions = []
        for attribute, per_example_grad in per_example.items():
            if attribute in layer._names:
                shape = layer.normalized_shape

                def clipped_sum(coef: torch.Tensor, g=per_example_grad, shape=shape):
                    return (g.T @ coef).reshape(shape)

                contributions.append(
                    Contribution(
                        layer._names[attribute], per_example_grad.square().sum(1), clipped_sum
                    )
                )
        layer._record(ctx, batch, contributions)
        return grad_x, None, None, None


class _DPNorm(DPLayer):
    """Base of the normalisation layers: input ``(B, *, *normalized_shape)``."""

    normalized_shape: tuple[int, ...]
    weight: nn.Parameter | None
    bias: nn.Parameter | None

    def _forward(self, x, weight, bias) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The output and the float32 per-row statistics the backward needs."""
        raise NotImplementedError

    def _grad_input(self, grad, x, weight, bias, stats) -> torch.Tensor:
        raise NotImplementedError

    def _per_example(self, x3, g3, stats) -> dict[str, torch.Tensor]:
        """``(B, D)`` per-example gradients by attribute, from float32 ``(B, T, D)`` x and g and
        the ``(B, T, 1)`` statistics."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _batch_size(self, x, len(self.normalized_shape) + 1)
        return _NormFunction.apply(x, self.weight, self.bias, self)


class DPLayerNorm(_DPNorm):
    """``nn.LayerNorm`` with per-example clipping: input ``(B, *, *normalized_shape)``."""

    def __init__(self, source: nn.LayerNorm, controller, names, layer_name) -> None:
        super().__init__(controller, names, layer_name)
        self.normalized_shape = tuple(source.normalized_shape)
        self.eps = source.eps
        self.weight = source.weight
        self.bias = source.bias

    def _forward(self, x, weight, bias):
        out, mean, rstd = torch.native_layer_norm(x, self.normalized_shape, weight, bias, self.eps)
        return out, (mean, rstd)

    def _grad_input(self, grad, x, weight, bias, stats) -> torch.Tensor:
        mean, rstd = stats
        return torch.ops.aten.native_layer_norm_backward(
            grad, x, self.normalized_shape, mean, rstd, weight, bias, [True, False, False]
        )[0]

    def _per_example(self, x3, g3, stats) -> dict[str, torch.Tensor]:
        grad_weight, grad_bias = reference.layer_norm_per_example(x3, g3, *stats)
        return {"weight": grad_weight, "bias": grad_bias}


class DPRMSNorm(_DPNorm):
    """``nn.RMSNorm`` with per-example clipping: input ``(B, *, *normalized_shape)``."""

    def __init__(self, source: nn.RMSNorm, controller, names, layer_name) -> None:
        super().__init__(controller, names, layer_name)
        self.normalized_shape = tuple(source.normalized_shape)
        self.eps = source.eps
        self.weight = source.weight
        self.bias = None

    def _dims(self) -> tuple[int, ...]:
        return tuple(range(-len(self.normalized_shape), 0))

    def _forward(self, x, weight, bias):
        # F.rms_norm computes in float32 at least, and eps=None is that type's machine epsilon
        compute = torch.promote_types(x.dtype, torch.float32)
        eps = torch.finfo(compute).eps if self.eps is None else self.eps
        rstd = torch.rsqrt(x.to(compute).square().mean(self._dims(), keepdim=True) + eps)
        return F.rms_norm(x, self.normalized_shape, weight, self.eps), (rstd,)

    def _grad_input(self, grad, x, weight, bias, stats) -> torch.Tensor:
        # y = x̂ ⊙ w with x̂ = x·rstd: dx = rstd·(ĝ − x̂·mean(ĝ ⊙ x̂)), ĝ = g ⊙ w
        (rstd,) = stats
        normalized = x.to(rstd.dtype) * rstd
        scaled = grad.to(rstd.dtype)
        if weight is not None:
            scaled = scaled * weight.to(rstd.dtype)
        mean = (scaled * normalized).mean(self._dims(), keepdim=True)
        return (rstd * (scaled - normalized * mean)).to(x.dtype)

    def _per_example(self, x3, g3, stats) -> dict[str, torch.Tensor]:
        return {"weight": reference.rms_norm_per_example(x3, g3, *stats)}
