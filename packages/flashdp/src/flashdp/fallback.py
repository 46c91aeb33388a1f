"""The opt-in generic path (``make_private(..., fallback="vmap")``) for modules whose trainable
parameters no fused DP layer covers: adapters holding raw ``nn.Parameter`` s, per-head norms,
convolutions.

The module keeps its type, parameters and state dict; its ``forward`` is replaced (on the
instance) by a :class:`VmapFallback` that runs the original forward one example at a time under
``torch.func.vmap`` (``randomness="different"``: dropout and noise are drawn per example). Each
trainable parameter ``p`` enters that forward as ``p.expand(B, *p.shape)`` through an autograd
Function whose backward therefore receives exactly the per-example gradients ``(B, *p.shape)``:
nothing is recomputed. It hands them to the model's :class:`~flashdp.controller.DPController`,
which sums the calls of one backward pass per example, then clips, accumulates, noises and
accounts exactly as for the fused layers. The cost is ``B × |θ_module|`` memory for those
gradients, which is why the path is opt-in and meant for small modules (adapters).

Every example sees a batch of one (its own inputs with a leading dimension of 1), so code written
for batched inputs runs unchanged. What cannot run one example at a time fails loudly: ``.item()``
or data-dependent Python control flow, in-place updates of buffers, and BatchNorm in training mode
(which mixes the examples of a batch).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from flashdp.controller import (
    EMPTY_BATCH,
    DPController,
    mark_forward,
    refuse_batch_norm_in_training,
    refuse_recomputed,
)

_TENSOR = object()  # where a tensor goes back into a fallback module's output


class _PerExample(torch.autograd.Function):
    """``p -> p.expand(B, *p.shape)``; the backward receives the per-example gradients."""

    @staticmethod
    def forward(ctx: Any, parameter, runner: VmapFallback, name: str, batch: int):
        ctx.runner, ctx.name = runner, name
        mark_forward(ctx)
        return parameter.expand(batch, *parameter.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        ctx.runner._record(ctx, grad)
        # no gradient for the parameter itself: ``.grad`` is written only by the controller
        return None, None, None, None


class _OriginalForward(nn.Module):
    """Runs ``module``'s original forward without its hooks, for ``functional_call`` (the hooks
    already ran once, on the whole batch, around the replaced forward)."""

    def __init__(self, module: nn.Module, forward) -> None:
        super().__init__()
        self.inner = module
        object.__setattr__(self, "_forward", forward)

    def forward(self, *args, **kwargs):
        return self._forward(*args, **kwargs)


class VmapFallback:
    """The replaced ``forward`` of one fallback module (see the module docstring).

    Args:
        module: the module; its ``forward`` attribute is set to this object.
        controller: the model's controller.
        names: path of every trainable parameter of the module's subtree relative to the module
            (``"router.weight"``) -> its qualified name in the model.
        layer_name: the module's name in the model, for errors and the controller.
    """

    def __init__(
        self, module: nn.Module, controller: DPController, names: dict[str, str], layer_name: str
    ) -> None:
        self.module = module
        self.controller = controller
        self.names = names
        self.layer_name = layer_name
        self.original_forward = module.forward
        self._call_original = _OriginalForward(module, self.original_forward)
        self._paths = _substitution_paths(module, names)

    def _where(self) -> str:
        return f"fallback module {self.layer_name!r} ({type(self.module).__name__})"

    def _record(self, ctx: Any, grad: torch.Tensor) -> None:
        refuse_recomputed(ctx, self.controller, self._where())
        if getattr(ctx, "flashdp_recorded", False):
            raise RuntimeError(
                f"backward ran twice through the same forward of {self._where()} "
                "(retain_graph=True): every example would be counted twice under one noise "
                "draw; run a new forward for every backward"
            )
        ctx.flashdp_recorded = True
        batch = grad.shape[0]
        scale = float(batch) if self.controller.config.loss_reduction == "mean" else 1.0
        self.controller.record_per_example(
            self.layer_name, self.names[ctx.name], grad.float() * scale
        )

    def _batch_dims(self, leaves: list[Any]) -> tuple[int, list[int | None]]:
        """The batch size B and, per input leaf, 0 (examples first) or None (shared)."""
        leading = [x.shape[0] for x in leaves if isinstance(x, torch.Tensor) and x.dim() > 0]
        if not leading:
            raise ValueError(
                f"{self._where()} got no tensor input with an example dimension; the fallback "
                "runs the module one example at a time and needs the examples first"
            )
        batch = max(leading)
        if batch == 0:
            raise ValueError(f"{self._where()}: {EMPTY_BATCH}")
        dims: list[int | None] = []
        for index, x in enumerate(leaves):
            if not isinstance(x, torch.Tensor) or x.dim() == 0 or (x.shape[0] == 1 < batch):
                dims.append(None)  # a non-tensor, a scalar, or one tensor shared by all examples
            elif x.shape[0] == batch:
                dims.append(0)
            else:
                raise ValueError(
                    f"{self._where()}: tensor input #{index} has shape {tuple(x.shape)} but the "
                    f"batch has {batch} examples; every tensor input needs the examples in its "
                    "first dimension (or a first dimension of 1 to be shared by all examples)"
                )
        return batch, dims

    def __call__(self, *args, **kwargs):
        trainable = {
            relative: parameter
            for relative in self.names
            if (parameter := self.module.get_parameter(relative)).requires_grad
        }
        if not torch.is_grad_enabled() or not trainable:
            return self.original_forward(*args, **kwargs)  # nothing to clip
        refuse_batch_norm_in_training(self.module, self._where())
        leaves, spec = tree_flatten((args, kwargs))
        batch, dims = self._batch_dims(leaves)
        per_example = {
            relative: _PerExample.apply(parameter, self, relative, batch)
            for relative, parameter in trainable.items()
        }
        expanded = {
            f"inner.{path}": per_example[relative]
            for path, relative in self._paths.items()
            if relative in per_example
        }

        def one_example(params: dict[str, torch.Tensor], inputs: list[Any]):
            inputs = [
                x.unsqueeze(0) if dim == 0 else x for x, dim in zip(inputs, dims, strict=True)
            ]
            call_args, call_kwargs = tree_unflatten(inputs, spec)
            out = functional_call(
                self._call_original, params, tuple(call_args), call_kwargs, tie_weights=False
            )
            # vmap returns tensors only: the rest of the output (None, ints...) rides outside
            out_leaves, structure["spec"] = tree_flatten(tree_map(self._drop_example_dim, out))
            structure["rest"] = [
                _TENSOR if isinstance(leaf, torch.Tensor) else leaf for leaf in out_leaves
            ]
            return tuple(leaf for leaf in out_leaves if isinstance(leaf, torch.Tensor))

        structure: dict[str, Any] = {}
        try:
            tensors = vmap(one_example, in_dims=(0, dims), randomness="different")(expanded, leaves)
        except RuntimeError as error:
            raise RuntimeError(
                f"{self._where()} cannot run one example at a time under torch.func.vmap: "
                f"{error}. The vmap fallback needs a forward that treats examples "
                "independently: no .item() or data-dependent Python control flow, no in-place "
                "updates of buffers"
            ) from error
        remaining = iter(tensors)
        out_leaves = [next(remaining) if x is _TENSOR else x for x in structure["rest"]]
        return tree_unflatten(out_leaves, structure["spec"])

    def _drop_example_dim(self, out: Any) -> Any:
        if not isinstance(out, torch.Tensor):
            return out
        if out.dim() == 0 or out.shape[0] != 1:
            raise ValueError(
                f"{self._where()} returned a tensor of shape {tuple(out.shape)} for one example; "
                "the fallback needs every output to keep the examples in its first dimension"
            )
        return out.squeeze(0)


def _substitution_paths(module: nn.Module, names: dict[str, str]) -> dict[str, str]:
    """Where ``functional_call`` puts each parameter of ``names``: one path per (module object,
    attribute) holding it -> its name in ``names``.

    A parameter tied between two modules gets both paths (both uses see its per-example copy);
    a submodule registered under two paths gets one (``functional_call``'s own weight tying sets
    and restores such a module's attribute once per path, and leaves the substituted tensor in
    place of the parameter).
    """
    canonical = {id(module.get_parameter(relative)): relative for relative in names}
    paths = {}
    for prefix, child in module.named_modules():  # each module object once
        for attribute, parameter in child.named_parameters(recurse=False, remove_duplicate=False):
            if id(parameter) in canonical:
                path = f"{prefix}.{attribute}" if prefix else attribute
                paths[path] = canonical[id(parameter)]
    return paths
