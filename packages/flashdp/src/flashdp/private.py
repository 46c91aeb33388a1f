"""``make_private``: swap a model's trainable layers for DP layers, refusing what cannot be
clipped."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import torch
from torch import nn

from flashdp.config import Clipping, LossReduction, PrivacyConfig
from flashdp.controller import DPController
from flashdp.fallback import VmapFallback
from flashdp.layers import DPConv1D, DPEmbedding, DPLayer, DPLayerNorm, DPLinear, DPRMSNorm

SUPPORTED_LAYERS = "nn.Linear, nn.Embedding, nn.LayerNorm, nn.RMSNorm, transformers' GPT-2 Conv1D"
_CONTROLLER_ATTRIBUTE = "_flashdp_controller"
FALLBACKS = ("vmap",)


def _is_hf_conv1d(module: nn.Module) -> bool:
    cls = type(module)
    return cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers.")


def _is_hf_gpt2_model(module: nn.Module) -> bool:
    """Whether ``module`` is a transformers ``GPT2Model`` (or a subclass keeping its forward)."""
    for cls in type(module).__mro__:
        if cls.__name__ == "GPT2Model" and cls.__module__.startswith("transformers."):
            return type(module).forward is cls.forward
    return False


def _cached_length(cache: object) -> int:
    """The number of tokens a GPT-2 key/value cache already holds (0 without one).

    Args:
        cache: a transformers ``Cache``, a legacy tuple of per-layer ``(key, value)`` tensors,
            or ``None``.

    Returns:
        What ``GPT2Model.forward`` offsets its default positions by.
    """
    if cache is None:
        return 0
    get_seq_length = getattr(cache, "get_seq_length", None)
    if get_seq_length is not None:
        return int(get_seq_length())
    return cache[0][0].shape[-2]  # legacy format (transformers < 4.53): keys are (B, H, T, D)


@functools.cache
def _argument_positions(forward: Callable[..., object]) -> dict[str, int]:
    """Positions of a ``forward`` function's arguments in a call, ``self`` excluded."""
    names = list(inspect.signature(forward).parameters)[1:]
    return {name: i for i, name in enumerate(names)}


def _fill_gpt2_positions(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Forward pre-hook of a ``GPT2Model`` whose position embedding ``wpe`` is private.

    Without ``position_ids``, GPT-2 builds them of shape ``(1, T)``, one row broadcast over the
    batch, so ``wpe`` would see 1 example where the other DP layers see B. This hook passes the
    positions GPT-2 would compute itself (``cache_position`` where the forward takes it, else
    ``arange(P, P + T)`` after the P tokens of the key/value cache), repeated for each of the B
    examples: the same embeddings, with the examples first. Explicit ``position_ids`` are left
    alone, and so are calls the model itself rejects (neither or both of ``input_ids`` and
    ``inputs_embeds``).

    Args:
        module: the ``GPT2Model``.
        args: its positional arguments.
        kwargs: its keyword arguments.

    Returns:
        The arguments with ``position_ids`` filled in, or ``None`` to leave them unchanged.
    """
    index = _argument_positions(type(module).forward)

    def argument(name: str) -> object:
        return args[index[name]] if index.get(name, len(args)) < len(args) else kwargs.get(name)

    if argument("position_ids") is not None:
        return None
    input_ids, inputs_embeds = argument("input_ids"), argument("inputs_embeds")
    if input_ids is not None and inputs_embeds is None:  # GPT-2 views the ids as (-1, T)
        batch, length = math.prod(input_ids.shape[:-1]), input_ids.shape[-1]
        device = input_ids.device
    elif inputs_embeds is not None and input_ids is None and inputs_embeds.dim() == 3:
        (batch, length), device = inputs_embeds.shape[:2], inputs_embeds.device
    else:
        return None
    cache_position = argument("cache_position") if "cache_position" in index else None
    if cache_position is not None:  # transformers 4.5x: the positions are the cache positions
        positions = cache_position
    else:  # the cache argument is ``cache`` from transformers 5, ``past_key_values`` before
        cache = argument("cache")
        past = _cached_length(argument("past_key_values") if cache is None else cache)
        positions = torch.arange(past, past + length, device=device)
    positions = positions.expand(batch, -1)
    if index.get("position_ids", len(args)) < len(args):
        at = index["position_ids"]
        return (*args[:at], positions, *args[at + 1 :]), kwargs
    return args, {**kwargs, "position_ids": positions}


def _dp_class(module: nn.Module) -> type[DPLayer] | None:
    """The DP layer for exactly this type (subclasses may change ``forward``: not supported)."""
    if type(module) is nn.Linear:
        return DPLinear
    if type(module) is nn.LayerNorm:
        return DPLayerNorm
    if type(module) is nn.RMSNorm:
        return DPRMSNorm
    if type(module) is nn.Embedding:
        unsupported = {
            "max_norm": module.max_norm is not None,
            "scale_grad_by_freq": module.scale_grad_by_freq,
            "sparse": module.sparse,
        }
        bad = [name for name, on in unsupported.items() if on]
        if bad:
            raise ValueError(f"nn.Embedding with {', '.join(bad)} is not supported by flashdp")
        return DPEmbedding
    if _is_hf_conv1d(module):
        return DPConv1D
    return None


def _check_replaceable(name: str, module: nn.Module, own: dict[str, str]) -> None:
    """The DP layer reproduces the module's plain forward from ``weight`` and ``bias`` only."""
    extra = sorted(set(own) - {"weight", "bias"})
    if extra or not isinstance(module.weight, nn.Parameter):
        raise ValueError(
            f"module {name!r} holds trainable parameters {extra or sorted(own)} that its plain "
            "forward does not use as weight/bias (a reparametrization such as spectral_norm "
            "or weight_norm): not supported by flashdp; remove it or freeze the module"
        )
    kinds = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
    hooks = [kind for kind in kinds if getattr(module, kind, None)]
    if hooks:
        raise ValueError(
            f"module {name!r} has hooks ({', '.join(h.strip('_') for h in hooks)}) that its DP "
            "replacement would silently drop; remove them before make_private or freeze the "
            "module"
        )


def _trainable_shared(model: nn.Module) -> dict[int, list[str]]:
    owners: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if parameter.requires_grad:
            owners.setdefault(id(parameter), []).append(name)
    return {key: names for key, names in owners.items() if len(names) > 1}


def _resolve_bounds(
    names: list[str], clipping: Clipping, max_grad_norm: float, layer_norms
) -> tuple[tuple[str, float], ...]:
    if clipping == "flat":
        if layer_norms is not None:
            raise ValueError("layer_norms is only used with clipping='per_layer'")
        return ()
    if layer_norms is None:
        bound = max_grad_norm / math.sqrt(len(names))
        return tuple((name, bound) for name in names)
    if not isinstance(layer_norms, Mapping):
        raise TypeError("layer_norms must map parameter names to bounds C_l")
    missing = sorted(set(names) - set(layer_norms))
    unknown = sorted(set(layer_norms) - set(names))
    if missing or unknown:
        raise ValueError(
            f"layer_norms must give exactly the trainable parameters; missing {missing}, "
            f"unknown {unknown}"
        )
    return tuple((name, float(layer_norms[name])) for name in names)


def make_private(
    model: nn.Module,
    *,
    max_grad_norm: float,
    noise_multiplier: float,
    clipping: Clipping = "per_layer",
    layer_norms: Mapping[str, float] | None = None,
    expected_batch_size: int | None = None,
    target_modules: list[str] | None = None,
    loss_reduction: LossReduction = "mean",
    sample_rate: float | None = None,
    generator: torch.Generator | None = None,
    backend: str | None = None,
    fallback: Literal["vmap"] | None = None,
    fallback_modules: Sequence[str] | None = None,
    workspace_mb: float | None = None,
    linear_method: str = "auto",
) -> nn.Module:
    """Make ``model`` differentially private: its trainable layers become DP layers in place.

    After ``loss.backward()`` (or at the end of :meth:`DPController.accumulate`) every trainable
    parameter's ``.grad`` is ``(Σ_b clip(g_b) + N(0, σ²C²)) / B``: the sum of the examples'
    clipped gradients plus Gaussian noise of standard deviation ``noise_multiplier *
    max_grad_norm`` on every coordinate (the Gaussian mechanism for L2 sensitivity C), divided
    by ``expected_batch_size`` (or by the number of examples when it is ``None``). Parameter
    objects and the state dict are unchanged.

    Args:
        model: a module whose trainable parameters all belong to supported layers
            (``nn.Linear``, ``nn.Embedding``, ``nn.LayerNorm``, ``nn.RMSNorm``, GPT-2 ``Conv1D``);
            frozen parameters may live anywhere. Every layer input has the examples first
            (a Hugging Face ``GPT2Model`` whose ``wpe`` becomes private is given its default
            ``position_ids`` as ``(B, T)`` when called without them).
        max_grad_norm: C, the bound of one example's whole gradient.
        noise_multiplier: σ.
        clipping: ``"per_layer"``: each parameter tensor l is clipped to C_l inside its layer's
            backward (C_l = C/√L for L trainable tensors, or ``layer_norms``); ``"flat"``: the
            whole gradient is clipped to C once all per-example norms are known.
        layer_norms: explicit C_l per trainable parameter name; their L2 norm must not exceed
            ``max_grad_norm``.
        expected_batch_size: the gradient's denominator B (set it with Poisson sampling).
        target_modules: names of the modules to make private (default: all supported layers
            holding trainable parameters); every trainable parameter outside them is refused.
        loss_reduction: ``"mean"`` if backward is called on the mean over the micro-batch of the
            per-example losses, ``"sum"`` for their sum.
        sample_rate: Poisson sampling rate q; enables ε tracking (``get_controller(model)``);
            requires ``expected_batch_size``.
        generator: random generator for the noise (on the parameters' device).
        backend: backend of the fused linear clipping (``"reference"``, ``"triton"``...).
        fallback: ``None`` (default): trainable parameters outside supported layers are refused.
            ``"vmap"``: every module that directly holds such parameters (a custom adapter's raw
            ``nn.Parameter`` s, an ``nn.Conv2d``...) runs one example at a time under
            ``torch.func.vmap``, and the per-example gradients of all trainable parameters in its
            subtree are clipped, summed and noised with the rest (:mod:`flashdp.fallback`;
            ``B × |θ_module|`` memory, so meant for small modules such as adapters).
        fallback_modules: further modules to run through the vmap fallback as a whole (``""``:
            the model itself), e.g. a module whose forward uses a parameter held by another;
            requires ``fallback="vmap"``.
        workspace_mb: bound, in MiB, of the per-example weight gradients a linear layer may
            store at once to clip them in one GEMM (per-layer clipping; :mod:`flashdp.plan`
            picks the method per layer, :meth:`DPController.plan` says which); 0 never stores;
            ``None``: 256 MiB on CUDA, 4 MiB on the CPU.
        linear_method: ``"auto"`` (default): each linear weight's method by the cost model;
            ``"store"``, ``"ghost"`` or ``"recompute"``: that method for every weight (an error
            at the backward where it is not available, e.g. ``recompute`` without Triton).

    Returns:
        The model (the DP layer itself if ``model`` is a single supported layer).

    Raises:
        ValueError: a trainable parameter outside a supported layer (without the fallback), a
            parameter shared by two layers (outside one fallback module), an unsupported layer
            option, or invalid settings.

    Example:
        >>> import torch
        >>> model = make_private(
        ...     torch.nn.Linear(4, 2), max_grad_norm=1.0, noise_multiplier=0.0, loss_reduction="sum"
        ... )
        >>> model(torch.randn(3, 4)).sum().backward()
        >>> model.weight.grad.shape
        torch.Size([2, 4])
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, nn.parallel.DistributedDataParallel):
        inner = make_private(
            model.module,
            max_grad_norm=max_grad_norm,
            noise_multiplier=noise_multiplier,
            clipping=clipping,
            layer_norms=layer_norms,
            expected_batch_size=expected_batch_size,
            target_modules=target_modules,
            loss_reduction=loss_reduction,
            sample_rate=sample_rate,
            generator=generator,
            backend=backend,
            fallback=fallback,
            fallback_modules=fallback_modules,
            workspace_mb=workspace_mb,
            linear_method=linear_method,
        )
        model.module = inner  # a new object only when the wrapped model is a single layer
        controller = get_controller(inner)
        object.__setattr__(model, _CONTROLLER_ATTRIBUTE, controller)
        controller.attach(model)
        return model
    if hasattr(model, _CONTROLLER_ATTRIBUTE) or isinstance(model, DPLayer):
        raise ValueError("model is already private")
    if fallback is not None and fallback not in FALLBACKS:
        raise ValueError(f"fallback must be None or one of {FALLBACKS}, got {fallback!r}")
    if fallback_modules is not None and fallback is None:
        raise ValueError("fallback_modules needs fallback='vmap'")
    if isinstance(fallback_modules, str):
        raise TypeError("fallback_modules must be a list of module names, not a string")
    modules = dict(model.named_modules())
    explicit = [] if fallback_modules is None else list(fallback_modules)
    for option, names in (("target_modules", target_modules or []), ("fallback_modules", explicit)):
        unknown = sorted(set(names) - set(modules))
        if unknown:
            raise ValueError(f"{option} not found in the model: {unknown}")
    wanted = set(modules) if target_modules is None else set(target_modules)

    layers: dict[str, tuple[nn.Module, type[DPLayer], dict[str, str]]] = {}
    uncovered: dict[str, dict[str, str]] = {}  # owner module -> its uncovered parameters
    for module_name, module in modules.items():
        own = {
            attribute: f"{module_name}.{attribute}" if module_name else attribute
            for attribute, p in module.named_parameters(recurse=False)
            if p.requires_grad
        }
        if not own or module_name not in wanted:
            continue
        dp_class = _dp_class(module)
        if dp_class is None:
            uncovered[module_name] = own
        else:
            layers[module_name] = (module, dp_class, own)
    roots = _fallback_roots(explicit + (list(uncovered) if fallback else []))
    if fallback is None and uncovered:
        raise ValueError(_uncovered_message(modules, uncovered))
    layers = {k: v for k, v in layers.items() if not any(_inside(k, r) for r in roots)}
    for module_name, (module, _, own) in layers.items():
        _check_replaceable(module_name, module, own)
    fallbacks = {root: _subtree_trainable(modules[root], root) for root in roots}
    covered = {name for _, _, own in layers.values() for name in own.values()}
    covered.update(name for names in fallbacks.values() for name in names.values())

    shared = [
        names
        for names in _trainable_shared(model).values()
        if not any(all(_inside(name, root) for name in names) for root in roots)
    ]
    if shared:
        raise ValueError(
            "trainable parameters shared by several modules would be clipped once per use: "
            f"{sorted(shared)}; untie them (tie_word_embeddings=False), freeze them, or run one "
            "module holding all their uses through the fallback (fallback='vmap', "
            "fallback_modules=[its name]; '' for the whole model)"
        )
    escaping = [
        name for name, p in model.named_parameters() if p.requires_grad and name not in covered
    ]
    if escaping:
        raise ValueError(
            f"trainable parameters outside a supported DP layer ({SUPPORTED_LAYERS}"
            f"{'' if target_modules is None else ', listed in target_modules'}): {escaping}. "
            "Freeze them (requires_grad_(False)) or use supported layers"
        )
    if not layers and not any(fallbacks.values()):
        raise ValueError("model has no trainable parameters to make private")

    parameters = dict(model.named_parameters())
    names = [name for name in parameters if name in covered]
    config = PrivacyConfig(
        max_grad_norm=max_grad_norm,
        noise_multiplier=noise_multiplier,
        clipping=clipping,
        layer_norms=_resolve_bounds(names, clipping, max_grad_norm, layer_norms),
        expected_batch_size=expected_batch_size,
        loss_reduction=loss_reduction,
        sample_rate=sample_rate,
        backend=backend,
        workspace_mb=workspace_mb,
        linear_method=linear_method,
    )
    controller = DPController(config, {name: parameters[name] for name in names}, generator)
    for name in names:
        controller.guard(parameters[name], name)
    for module_name, names_in_module in fallbacks.items():
        module = modules[module_name]
        # the forward is replaced on the instance: the module keeps its type, methods, state dict
        module.forward = VmapFallback(
            module, controller, names_in_module, module_name or type(module).__name__
        )
    controller.fallback_modules = tuple(fallbacks)
    root = model
    for module_name, (module, dp_class, own) in layers.items():
        replacement = dp_class(module, controller, own, module_name or type(module).__name__)
        if not module_name:
            root = replacement
            continue
        parent_name, _, child = module_name.rpartition(".")
        setattr(modules[parent_name], child, replacement)
    for module in modules.values():
        if _is_hf_gpt2_model(module) and isinstance(module.wpe, DPEmbedding):
            module.register_forward_pre_hook(_fill_gpt2_positions, with_kwargs=True)
    object.__setattr__(root, _CONTROLLER_ATTRIBUTE, controller)
    controller.watch(root)
    return root


def _inside(name: str, root: str) -> bool:
    """Whether module or parameter ``name`` lies in the subtree of module ``root``."""
    return root == "" or name == root or name.startswith(root + ".")


def _fallback_roots(candidates: list[str]) -> list[str]:
    """The outermost of the candidate modules: a module runs under one vmap, with its subtree."""
    unique = sorted(set(candidates))
    return [m for m in unique if not any(o != m and _inside(m, o) for o in unique)]


def _subtree_trainable(module: nn.Module, prefix: str) -> dict[str, str]:
    """Path relative to ``module`` -> qualified name, for its subtree's trainable parameters."""
    return {
        relative: f"{prefix}.{relative}" if prefix else relative
        for relative, p in module.named_parameters()
        if p.requires_grad
    }


def _uncovered_message(modules: dict[str, nn.Module], uncovered: dict[str, dict[str, str]]) -> str:
    listed = "; ".join(
        f"module {name!r} ({type(modules[name]).__name__}): {sorted(own.values())}"
        for name, own in uncovered.items()
    )
    return (
        f"trainable parameters outside a supported DP layer ({SUPPORTED_LAYERS}): {listed}. "
        "Freeze them (requires_grad_(False)), use supported layers, or pass fallback='vmap' to "
        "make_private to clip these modules' per-example gradients computed under "
        "torch.func.vmap (slower, B x |module parameters| memory)"
    )


def get_controller(model: nn.Module) -> DPController:
    """The :class:`DPController` of a model returned by :func:`make_private`."""
    controller = getattr(model, _CONTROLLER_ATTRIBUTE, None)
    if controller is None:
        raise ValueError("model was not made private with flashdp.make_private")
    return controller
