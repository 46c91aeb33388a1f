"""``PrivacyEngine``: Opacus' entry point on top of :func:`flashdp.make_private`.

An Opacus training script switches to flashdp by its import: ``make_private`` returns the
model, optimizer and data loader, and the training loop and ``get_epsilon`` stay as they are.
The model is made private in place (its trainable layers become DP layers, see
:func:`flashdp.make_private`); the optimizer is a thin wrapper that refuses to step without a
released logical batch; the data loader draws every example independently with probability
q = 1/len(data_loader) (Poisson sampling, as Opacus' ``DPDataLoader``), which the RDP accountant
assumes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from flashdp.accountant import RDPAccountant, get_noise_multiplier
from flashdp.config import LossReduction
from flashdp.controller import DPController
from flashdp.data_loader import DPDataLoader, batches_per_epoch
from flashdp.distributed import is_fsdp
from flashdp.private import get_controller, make_private

ACCOUNTANTS = ("rdp",)
ENGINE_CLIPPING = ("flat", "per_layer")
# Opacus options whose default is what flashdp does; another value is refused with the reason.
_OPACUS_DEFAULTS: dict[str, tuple[object, str]] = {
    "grad_sample_mode": (
        "hooks",
        "flashdp computes the clipped gradients inside each layer's backward; Opacus' other "
        "modes (ghost clipping, functorch) have no counterpart here",
    ),
    "wrap_model": (
        True,
        "flashdp makes the model private in place and returns it; it has no hooks object to "
        "clean up",
    ),
    "rand_on_empty": (
        False,
        "an empty Poisson batch is released as noise only; a batch of random examples would "
        "train on fabricated data",
    ),
}


class DPOptimizer(Optimizer):
    """The user's optimizer, stepping only on a freshly released logical batch.

    ``param_groups``, ``state``, ``defaults``, ``zero_grad``, ``state_dict`` and
    ``load_state_dict`` are the wrapped optimizer's (learning-rate schedulers work on it).
    ``step()`` refuses unless exactly one logical batch was released (one backward outside
    ``controller.accumulate()``, or one such block) since the previous step: with none, it would
    apply stale gradients; with several, the gradients of several noised batches would be summed.

    Args:
        optimizer: the optimizer over the private model's parameters.
        module: the private model.
    """

    def __init__(self, optimizer: Optimizer, module: nn.Module) -> None:
        # Optimizer.__init__ is not called: the groups, state and defaults stay the wrapped one's.
        self.original_optimizer = optimizer
        self._module = module
        self._controller: DPController = get_controller(module)
        self._steps_at_last_step = self._controller.steps

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups."""
        return self.original_optimizer.param_groups

    @property
    def state(self) -> Any:
        """The wrapped optimizer's per-parameter state."""
        return self.original_optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:
        """The wrapped optimizer's default hyper-parameters."""
        return self.original_optimizer.defaults

    @property
    def noise_multiplier(self) -> float:
        """σ of the private model."""
        return self._controller.config.noise_multiplier

    @property
    def max_grad_norm(self) -> float:
        """C, the bound of one example's whole clipped gradient."""
        return self._controller.config.max_grad_norm

    @property
    def expected_batch_size(self) -> int | None:
        """The gradient's denominator (``None``: the number of examples in the batch)."""
        return self._controller.config.expected_batch_size

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of the private model's parameters to the wrapped optimizer.

        Args:
            param_group: as for :meth:`torch.optim.Optimizer.add_param_group`.

        Raises:
            ValueError: a parameter of the group is not one of the private model's.
        """
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        _check_optimizer_parameters(params, self._module)
        self.original_optimizer.add_param_group(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients, as the wrapped optimizer does.

        Args:
            set_to_none: set ``.grad`` to ``None`` instead of zeroing it.
        """
        self.original_optimizer.zero_grad(set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Step the wrapped optimizer on the logical batch released since the previous step.

        Args:
            closure: optional; recomputes the loss and runs its backward (called once, with
                gradients enabled, before the check).

        Returns:
            The closure's loss, or ``None``.

        Raises:
            RuntimeError: no logical batch, or more than one, was released since the previous
                step.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        released = self._controller.steps - self._steps_at_last_step
        self._steps_at_last_step = self._controller.steps
        if released == 0:
            raise RuntimeError(
                "optimizer.step() without a released logical batch since the previous step: "
                "the gradients are stale (or empty). Call loss.backward() outside "
                "controller.accumulate() (or leave the accumulate() block) before every step"
            )
        if released > 1:
            raise RuntimeError(
                f"{released} logical batches were released since the previous step, each with "
                "its own noise and accountant step, and their gradients were summed. For "
                "gradient accumulation over micro-batches run their backward passes inside one "
                "flashdp.get_controller(model).accumulate() block; zero the gradients before "
                "the next batch"
            )
        self.original_optimizer.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict."""
        return self.original_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the wrapped optimizer's state dict.

        Args:
            state_dict: from :meth:`state_dict`.
        """
        self.original_optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"DPOptimizer({self.original_optimizer!r})"


def _check_optimizer_parameters(params: Sequence[torch.Tensor], module: nn.Module) -> None:
    owned = {id(p) for p in module.parameters()}
    foreign = sum(1 for p in params if id(p) not in owned)
    if foreign:
        raise ValueError(
            f"{foreign} optimizer parameter(s) are not parameters of the module: their "
            "gradients would never be clipped or noised. Build the optimizer over "
            "module.parameters()"
        )


def _optimizer_parameters(optimizer: Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _per_layer_bounds(
    max_grad_norm: Sequence[float], optimizer: Optimizer, module: nn.Module
) -> tuple[float, dict[str, float]]:
    """Opacus' per-parameter bounds, in the optimizer's order of its trainable parameters, as
    flashdp's ``layer_norms`` by parameter name, and their L2 norm C."""
    trainable = [p for p in _optimizer_parameters(optimizer) if p.requires_grad]
    names = {id(p): name for name, p in module.named_parameters() if p.requires_grad}
    if len(max_grad_norm) != len(trainable):
        raise ValueError(
            f"per-layer max_grad_norm has {len(max_grad_norm)} bounds for the optimizer's "
            f"{len(trainable)} trainable parameters: give one bound per parameter, in the "
            "optimizer's order (or one float C for C_l = C/√L)"
        )
    if {id(p) for p in trainable} != set(names):
        raise ValueError(
            "per-layer bounds need the optimizer to hold every trainable parameter of the "
            "module (flashdp clips them all); freeze the others or pass one float C"
        )
    bounds = {names[id(p)]: float(bound) for p, bound in zip(trainable, max_grad_norm, strict=True)}
    return math.sqrt(sum(bound**2 for bound in bounds.values())), bounds


class PrivacyEngine:
    """Opacus' ``PrivacyEngine`` for flashdp: make a model, optimizer and data loader private,
    and report ε.

    Args:
        accountant: ``"rdp"`` only (the Rényi-DP accountant of the Poisson-subsampled Gaussian
            mechanism; Opacus' default ``"prv"`` and its ``"gdp"`` are not implemented).
        secure_mode: ``False`` only: flashdp has no cryptographically secure noise source.

    Raises:
        ValueError: another accountant, or ``secure_mode=True``.

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
        >>> model = torch.nn.Linear(4, 2)
        >>> engine = PrivacyEngine()
        >>> model, optimizer, loader = engine.make_private(
        ...     module=model,
        ...     optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        ...     data_loader=DataLoader(data, batch_size=8),
        ...     noise_multiplier=1.0,
        ...     max_grad_norm=1.0,
        ...     sampling_generator=torch.Generator().manual_seed(0),
        ... )
        >>> for x, y in loader:
        ...     optimizer.zero_grad()
        ...     torch.nn.functional.cross_entropy(model(x), y).backward()
        ...     optimizer.step()
        >>> 0 < engine.get_epsilon(1e-5) < 10
        True
    """

    def __init__(self, *, accountant: str = "rdp", secure_mode: bool = False) -> None:
        if accountant not in ACCOUNTANTS:
            raise ValueError(
                f"accountant {accountant!r} is not supported: flashdp implements only 'rdp' "
                "(Rényi DP of the Poisson-subsampled Gaussian mechanism), and ε is reported by "
                "it; pass accountant='rdp' (Opacus' 'prv' gives a slightly smaller ε)"
            )
        if secure_mode:
            raise ValueError(
                "secure_mode=True is not supported: flashdp draws its noise and its Poisson "
                "batches from PyTorch's pseudo-random generators and has no cryptographically "
                "secure source; use secure_mode=False"
            )
        self._controller: DPController | None = None

    @property
    def accountant(self) -> RDPAccountant:
        """The RDP accountant of the private model (``get_epsilon(delta)``, ``history``).

        Raises:
            RuntimeError: before :meth:`make_private`, or without Poisson sampling.
        """
        controller = self._private_controller()
        if controller.accountant is None:
            raise RuntimeError(_NOT_POISSON)
        return controller.accountant

    def _private_controller(self) -> DPController:
        if self._controller is None:
            raise RuntimeError("no model was made private yet: call make_private first")
        return self._controller

    def _check_unused(self) -> None:
        if self._controller is not None:
            raise RuntimeError(
                "this PrivacyEngine has already made a model private and accounts for it; "
                "create a new PrivacyEngine for another model"
            )

    def make_private(
        self,
        *,
        module: nn.Module,
        optimizer: Optimizer,
        data_loader: DataLoader,
        noise_multiplier: float,
        max_grad_norm: float | Sequence[float],
        criterion: object = None,
        batch_first: bool = True,
        loss_reduction: LossReduction = "mean",
        poisson_sampling: bool = True,
        clipping: Literal["flat", "per_layer"] = "flat",
        noise_generator: torch.Generator | None = None,
        sampling_generator: torch.Generator | None = None,
        backend: str | None = None,
        fallback: Literal["vmap"] | None = None,
        fallback_modules: Sequence[str] | None = None,
        workspace_mb: float | None = None,
        **opacus_options: Any,
    ) -> tuple[nn.Module, DPOptimizer, DataLoader]:
        """Make the model private in place, wrap the optimizer, Poisson-sample the data.

        Every backward outside ``flashdp.get_controller(module).accumulate()`` then releases
        one logical batch: ``.grad = (Σ_b clip(g_b) + N(0, σ²C²)) / B`` with B = ⌊q·N⌋ (as Opacus)
        under Poisson sampling (the number of examples in the batch otherwise), and one
        accountant step at rate q.

        Args:
            module: the model; its trainable parameters must belong to layers flashdp supports
                (see :func:`flashdp.make_private`), or to modules run through ``fallback``.
            optimizer: an optimizer over ``module``'s parameters.
            data_loader: a loader over a map-style dataset.
            noise_multiplier: σ.
            max_grad_norm: C; with ``clipping="per_layer"`` also a list of per-parameter bounds
                C_l in the optimizer's order of its trainable parameters (as Opacus), C being
                their L2 norm. A float C gives C_l = C/√L for L trainable tensors.
            criterion: accepted for Opacus' signature and unused, as in Opacus' default
                ``grad_sample_mode="hooks"``: the clipping happens in the backward of any loss.
            batch_first: ``True`` only: flashdp needs the examples in the first dimension.
            loss_reduction: ``"mean"`` or ``"sum"``: how the loss reduces the examples' losses.
            poisson_sampling: ``True``: the returned loader draws each example independently
                with q = 1/len(data_loader), and ε is tracked. ``False``: ``data_loader`` is
                returned as is and ε is not tracked (:meth:`get_epsilon` says why).
            clipping: ``"flat"`` (Opacus' default: the whole per-example gradient to C) or
                ``"per_layer"``.
            noise_generator: random generator of the noise (on the parameters' device).
            sampling_generator: random generator of the Poisson sampling (default: the loader's
                ``generator``, else one seeded from PyTorch's global generator).
            backend: backend of the fused linear clipping (``"reference"``, ``"triton"``...).
            fallback: ``"vmap"`` to clip modules no fused layer covers (see
                :func:`flashdp.make_private`).
            fallback_modules: further modules to run through the fallback.
            workspace_mb: bound of the per-example gradients a linear layer may store at once
                (see :func:`flashdp.make_private`).
            **opacus_options: Opacus' ``grad_sample_mode``, ``wrap_model`` and
                ``rand_on_empty`` at their defaults (another value is refused).

        Returns:
            ``(module, optimizer, data_loader)``: the private model, a :class:`DPOptimizer`
            and the loader (a :class:`~flashdp.data_loader.DPDataLoader` under Poisson sampling).

        Raises:
            RuntimeError: this engine already made a model private.
            ValueError: an option flashdp cannot honour, a model already private, optimizer
                parameters outside the module, or invalid privacy settings.
            TypeError: an unknown option, or a batch without an empty form.
        """
        self._check_unused()
        _check_opacus_options(opacus_options)
        if not batch_first:
            raise ValueError(
                "batch_first=False is not supported: flashdp's layers need the examples in the "
                "first dimension of every input"
            )
        if clipping not in ENGINE_CLIPPING:
            raise ValueError(
                f"clipping must be one of {ENGINE_CLIPPING}, got {clipping!r}"
                + (" (adaptive clipping is not implemented)" if clipping == "adaptive" else "")
            )
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if isinstance(module, nn.parallel.DistributedDataParallel) or is_fsdp(module):
            raise ValueError(
                "PrivacyEngine trains in one process; under DDP or FSDP2 call "
                "flashdp.make_private and sample with flashdp.DistributedPoissonSampler (see "
                "the README, Several processes)"
            )
        if not isinstance(optimizer, Optimizer) or isinstance(optimizer, DPOptimizer):
            raise TypeError(
                f"optimizer must be a plain torch.optim.Optimizer, got {type(optimizer).__name__}"
            )
        try:
            get_controller(module)
        except ValueError:
            pass
        else:
            raise ValueError(
                "module is already private (flashdp.make_private or another PrivacyEngine): "
                "pass the original, non-private model"
            )
        _check_optimizer_parameters(_optimizer_parameters(optimizer), module)
        layer_norms = None
        if isinstance(max_grad_norm, Sequence) and not isinstance(max_grad_norm, str):
            if clipping != "per_layer":
                raise ValueError(
                    "a list of bounds needs clipping='per_layer'; flat clipping takes one "
                    "float max_grad_norm"
                )
            max_grad_norm, layer_norms = _per_layer_bounds(max_grad_norm, optimizer, module)

        if poisson_sampling:
            data_loader = DPDataLoader.from_data_loader(
                data_loader, sampling_generator=sampling_generator
            )
            sample_rate = data_loader.sample_rate
            expected_batch_size = data_loader.expected_batch_size
        else:
            if sampling_generator is not None:
                raise ValueError("sampling_generator needs poisson_sampling=True")
            sample_rate = expected_batch_size = None
        module = make_private(
            module,
            max_grad_norm=max_grad_norm,
            noise_multiplier=noise_multiplier,
            clipping=clipping,
            layer_norms=layer_norms,
            expected_batch_size=expected_batch_size,
            loss_reduction=loss_reduction,
            sample_rate=sample_rate,
            generator=noise_generator,
            backend=backend,
            fallback=fallback,
            fallback_modules=fallback_modules,
            workspace_mb=workspace_mb,
        )
        self._controller = get_controller(module)
        self._controller.single_process = True  # its loader samples for one process
        return module, DPOptimizer(optimizer, module), data_loader

    def make_private_with_epsilon(
        self,
        *,
        module: nn.Module,
        optimizer: Optimizer,
        data_loader: DataLoader,
        target_epsilon: float,
        target_delta: float,
        epochs: int,
        max_grad_norm: float | Sequence[float],
        poisson_sampling: bool = True,
        epsilon_tolerance: float = 0.01,
        **options: Any,
    ) -> tuple[nn.Module, DPOptimizer, DataLoader]:
        """:meth:`make_private` with the smallest σ that spends at most ``target_epsilon`` in
        ``epochs`` passes over the data (``epochs · len(data_loader)`` steps at rate
        q = 1/len(data_loader)).

        Args:
            module: as for :meth:`make_private`.
            optimizer: as for :meth:`make_private`.
            data_loader: as for :meth:`make_private`.
            target_epsilon: ε to reach at the end of training.
            target_delta: δ.
            epochs: the number of passes over the data the training will run.
            max_grad_norm: as for :meth:`make_private`.
            poisson_sampling: ``True`` only: σ is calibrated for Poisson sampling.
            epsilon_tolerance: ε at the end lies in ``[target_epsilon - epsilon_tolerance,
                target_epsilon]`` (as Opacus' ``epsilon_tolerance``).
            **options: further arguments of :meth:`make_private`.

        Returns:
            As :meth:`make_private`; ``optimizer.noise_multiplier`` is the σ found.

        Raises:
            ValueError: ``poisson_sampling=False``, ``epochs`` not a positive int, or a target
                out of reach.
        """
        self._check_unused()
        if not poisson_sampling:
            raise ValueError(
                "make_private_with_epsilon calibrates σ for Poisson sampling, which "
                "poisson_sampling=False does not do; use make_private with a noise_multiplier "
                "of your choice"
            )
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs must be a positive int, got {epochs!r}")
        if not 0 < epsilon_tolerance < target_epsilon:
            raise ValueError(
                f"epsilon_tolerance must be in (0, target_epsilon), got {epsilon_tolerance}"
            )
        steps_per_epoch = batches_per_epoch(data_loader)
        noise_multiplier = get_noise_multiplier(
            target_epsilon,
            target_delta,
            sample_rate=1 / steps_per_epoch,
            steps=epochs * steps_per_epoch,
            tolerance=epsilon_tolerance / target_epsilon,
        )
        return self.make_private(
            module=module,
            optimizer=optimizer,
            data_loader=data_loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            **options,
        )

    def get_epsilon(self, delta: float) -> float:
        """ε spent so far at ``delta``, from the RDP accountant.

        Args:
            delta: δ in (0, 1).

        Returns:
            ε (``inf`` after a step with ``noise_multiplier=0``).

        Raises:
            RuntimeError: before :meth:`make_private`, or with ``poisson_sampling=False``.
        """
        controller = self._private_controller()
        if controller.accountant is None:
            raise RuntimeError(_NOT_POISSON)
        return controller.epsilon(delta)


_NOT_POISSON = (
    "ε is not tracked: make_private ran with poisson_sampling=False, and the RDP accountant's "
    "analysis (each example joins each batch independently with probability q) does not hold "
    "for the loader's fixed batches. Use poisson_sampling=True for an ε that holds. Opacus "
    "reports the Poisson ε with q = 1/len(data_loader) anyway; if you accept that approximation, "
    "flashdp.get_epsilon(noise_multiplier, sample_rate, steps, delta) computes it"
)


def _check_opacus_options(options: Mapping[str, Any]) -> None:
    unknown = sorted(set(options) - set(_OPACUS_DEFAULTS))
    if unknown:
        raise TypeError(f"make_private got unexpected keyword arguments {unknown}")
    for name, value in options.items():
        default, reason = _OPACUS_DEFAULTS[name]
        if value != default:
            raise ValueError(
                f"{name}={value!r} is not supported ({name}={default!r} only): {reason}"
            )
