"""The state of a private model between backward passes: clipped sums, noise, accounting.

Each DP layer reports its per-example :class:`~flashdp.clipping.Contribution` from inside its
backward. Per-layer clipping reduces them to clipped sums at once; flat clipping keeps them
(book-keeping) until the end of the backward pass, when every example's total norm is known. A
logical batch ends when a backward pass outside :meth:`DPController.accumulate` finishes, or when
that context exits: then, and only then, Gaussian noise N(0, σ²C²) is added once to each summed
parameter gradient, the result divided by the batch size and written to ``.grad``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from flashdp.accountant import RDPAccountant
from flashdp.clipping import Contribution, clip_coefficients
from flashdp.config import PrivacyConfig
from flashdp.distributed import (
    GroupSync,
    active_ddp,
    attach_ddp,
    attach_fsdp,
    check_fsdp_settings,
    discard_fsdp_gradients,
    gradient_sync_on,
    is_fsdp,
    sharded,
)
from flashdp.plan import LayerPlan

logger = logging.getLogger(__name__)

EMPTY_BATCH = (
    "a batch of 0 examples reached a private layer under DDP or FSDP2, or a vmap fallback module. "
    "Across processes every rank must run the forward and backward: run one placeholder example "
    "with its loss multiplied by 0 instead. In one process with a fallback module, skip the "
    "empty batch's forward and backward inside `controller.accumulate()`, which still releases "
    "the noise once"
)


@dataclass
class _Pass:
    """What one backward pass has reported so far."""

    batch_size: int
    first_layer: str
    graph_task: int
    layers: set[str] = field(default_factory=set)
    pending: list[Contribution] = field(default_factory=list)
    finite: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    per_example: dict[str, torch.Tensor] = field(default_factory=dict)


def batch_norms_in_training(module: nn.Module) -> list[str]:
    """Names of the BatchNorm layers in ``module`` that normalise with batch statistics: in
    training mode, or in eval mode without running statistics (``track_running_stats=False``),
    as ``_BatchNorm.forward`` decides."""
    return [
        name or type(child).__name__
        for name, child in module.named_modules()
        if isinstance(child, nn.modules.batchnorm._BatchNorm)
        and (child.training or (child.running_mean is None and child.running_var is None))
    ]


def refuse_batch_norm_in_training(module: nn.Module, where: str) -> None:
    """BatchNorm in training mode mixes examples: one example moves every other example's
    output, so clipping each example's gradient no longer bounds its influence."""
    mixing = batch_norms_in_training(module)
    if mixing:
        raise ValueError(
            f"{where} contains BatchNorm layers in training mode or without running statistics "
            f"({mixing}): they normalise each example with statistics of the whole batch, so one "
            "example changes the others' gradients and clipping no longer bounds its influence. "
            "Call .eval() on them with track_running_stats=True (running statistics) or use "
            "GroupNorm / LayerNorm"
        )


def refuse_escape(parameter: torch.Tensor, name: str, controller: DPController) -> None:
    """Raise when ``parameter`` receives an autograd gradient: the DP layers hand none to
    autograd, so any gradient reached it outside its layer and would escape clipping. Across
    processes the gradient is replaced by zeros and the batch fails at its release."""

    def hook(grad: torch.Tensor | None) -> torch.Tensor | None:
        if grad is None:
            return None
        error = RuntimeError(
            f"parameter {name!r} received a gradient outside its DP layer (used directly "
            "elsewhere in the forward, e.g. by a tied output head): that gradient would escape "
            "clipping. Use the parameter only through its layer (untie it), or freeze it (with "
            "fallback='vmap', name the module whose forward uses it in fallback_modules)"
        )
        controller._fail(error)  # raises, except inside a backward across processes
        return torch.zeros_like(grad)

    parameter.register_hook(hook)


def mark_forward(ctx: Any) -> None:
    """Note on a DP autograd Function's ``ctx`` whether its forward ran inside a backward pass
    (a recomputation, as activation checkpointing does)."""
    ctx.flashdp_in_backward = torch._C._current_graph_task_id() != -1


def refuse_recomputed(ctx: Any, controller: DPController, where: str) -> None:
    """A forward recomputed inside a backward and back-propagated in a nested backward pass
    (reentrant checkpointing) reports from another graph task than the rest of its pass: the
    pass would split into several releases, each with its own noise and accountant step."""
    if getattr(ctx, "flashdp_in_backward", False):
        controller.abort()
        raise RuntimeError(
            f"{where} was recomputed inside a backward pass and back-propagated in a nested one "
            "(reentrant activation checkpointing, torch.utils.checkpoint(use_reentrant=True)): "
            "its examples would be "
            "released apart from the rest of their logical batch, under a noise draw and "
            "accountant step of their own; the logical batch was discarded. Use "
            "use_reentrant=False or no activation checkpointing"
        )


class DPController:
    """Clipped sums, noise and accounting of one private model (see the module docstring).

    Get it with :func:`flashdp.get_controller`. Attributes: ``config`` (:class:`PrivacyConfig`),
    ``steps`` (logical batches released so far), ``accountant`` (an :class:`RDPAccountant` when
    ``config.sample_rate`` is set, else ``None``), ``fallback_modules`` (names of the modules run
    through the vmap fallback).
    """

    def __init__(
        self,
        config: PrivacyConfig,
        parameters: Mapping[str, nn.Parameter],
        generator: torch.Generator | None = None,
    ) -> None:
        self.config = config
        self.generator = generator
        self.steps = 0
        self.accountant = RDPAccountant() if config.sample_rate is not None else None
        self._parameters = dict(parameters)
        self._bounds = dict(config.layer_norms)
        self._sums: dict[str, torch.Tensor] = {}
        self._examples = 0
        self._pass: _Pass | None = None
        self._accumulating = False
        self._batch_open = False  # something was gathered for the current logical batch
        self._sync: GroupSync | None = None  # set when the model runs under DDP
        self._reported = False  # this rank took part in the current batch's collective
        self._failure: Exception | None = None  # across processes: raised at the release
        self._skip_until_sync = False  # aborted inside ddp.no_sync(): drop until the sync
        # FSDP2's unsharded parameters that carry the escape check, by id
        self._hooked: dict[int, weakref.ref[torch.Tensor]] = {}
        self._model: weakref.ref[nn.Module] | None = None
        self.fallback_modules: tuple[str, ...] = ()  # set by make_private
        self._plans: dict[str, LayerPlan] = {}
        self._discarded = False  # abort() inside accumulate(): the block releases nothing
        self.single_process = False  # set by PrivacyEngine: DDP and FSDP2 are refused

    def watch(self, model: nn.Module) -> None:
        """Check ``model`` at every forward with gradients enabled and at every release: a
        trainable parameter this controller does not clip (a layer added, unfrozen or replaced
        after :func:`flashdp.make_private`) is an error, and its unclipped gradient is
        discarded. A BatchNorm layer in training mode (frozen or not) is refused at the
        forward."""
        self._model = weakref.ref(model)

        def check(module: nn.Module, args: object) -> None:
            if torch.is_grad_enabled():
                self._check_distributed(module)
                self._check_parameters()
                refuse_batch_norm_in_training(module, "the private model")

        model.register_forward_pre_hook(check)

    def attach(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        """Reduce the clipped gradients over the ranks of ``ddp``, the
        :class:`~torch.nn.parallel.DistributedDataParallel` module around this private model
        (done by the model's first forward inside ``ddp``, or by :func:`flashdp.make_private`
        when given the DDP module); see :mod:`flashdp.distributed`."""
        if self._sync is None:
            attach_ddp(self, ddp)

    def _fail(self, error: Exception) -> None:
        """An error that discards the logical batch. In one process, or outside a backward:
        discard it now and raise. Inside a backward across processes, raising would leave the
        other ranks in this backward's collectives (DDP's reducer, FSDP2's reduce-scatters):
        the error is kept, the backward finishes on zeros, and the release raises it on this
        rank and a RuntimeError on the others."""
        if self._sync is None or torch._C._current_graph_task_id() == -1:
            self.abort()
            raise error
        if self._failure is None:
            self._failure = error

    @property
    def _fsdp(self) -> bool:
        return self._sync is not None and self._sync.kind == "fsdp"

    def _check_distributed(self, model: nn.Module) -> None:
        ddp = active_ddp()
        inside_ddp = ddp is not None and any(m is model for m in ddp.module.modules())
        if self.single_process and (inside_ddp or is_fsdp(model)):
            raise RuntimeError(
                "this model was made private by flashdp.PrivacyEngine, which samples and "
                "accounts for one process: under DDP or FSDP2 each rank would draw its own "
                "Poisson batches from the whole dataset, counting examples on several ranks. Use "
                "flashdp.make_private with flashdp.DistributedPoissonSampler (README, Several "
                "processes)"
            )
        if self._sync is None and is_fsdp(model):
            attach_fsdp(self, model)
        if self._fsdp:
            assert self._sync is not None
            check_fsdp_settings(model)
            self._sync.sync_next = gradient_sync_on(model)
        if inside_ddp:
            self.attach(ddp)
        if self._sync is not None and ddp is not None:
            self._sync.sync_next = ddp.require_backward_grad_sync

    def _check_parameters(self) -> None:
        model = None if self._model is None else self._model()
        if model is None:
            return
        if self._fsdp:  # FSDP2 swaps sharded and unsharded parameters: compare names
            known_names = set(self._parameters)
            escaping = [
                (name, parameter)
                for name, parameter in model.named_parameters()
                if parameter.requires_grad and name not in known_names
            ]
        else:
            known = {id(parameter) for parameter in self._parameters.values()}
            escaping = [
                (name, parameter)
                for name, parameter in model.named_parameters()
                if parameter.requires_grad and id(parameter) not in known
            ]
        if not escaping:
            return
        for _, parameter in escaping:
            parameter.grad = None  # unclipped: never let an optimizer step use it
        self.abort()
        raise RuntimeError(
            "trainable parameters that are not clipped (added, unfrozen or replaced after "
            f"make_private): {[name for name, _ in escaping]}; their gradients would escape "
            "clipping, so the logical batch was discarded. Freeze them, or make the final "
            "model private"
        )

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """Names of the parameters whose gradients are clipped and noised."""
        return tuple(self._parameters)

    # -- called from the layers' backward -------------------------------------------------------

    def _open_pass(self, layer: str, batch_size: int) -> _Pass:
        """The current backward pass (opened by the first report), checked for its batch size."""
        graph_task = torch._C._current_graph_task_id()
        if self._pass is not None and self._pass.graph_task != graph_task:
            # The backward pass that opened it raised before its end: its partial sums are not
            # one clean pass over its examples (a retried micro-batch would count twice).
            self.abort()
            if self._accumulating:
                raise RuntimeError(
                    "an earlier backward pass in this accumulate() block failed; the logical "
                    "batch was discarded: leave the block and start the batch again"
                )
        if self._accumulating and self._discarded and self._sync is None:
            raise RuntimeError(
                "this accumulate() block was discarded (abort(), or a backward pass in it "
                "failed): releasing its later micro-batches would release a subset of the batch "
                "chosen by the failure; leave the block and start the batch again"
            )
        if self._pass is None:
            if not (self._batch_open or self._accumulating or self._skip_until_sync):
                self._open_batch()
            self._pass = _Pass(batch_size, layer, graph_task)
            torch.autograd.Variable._execution_engine.queue_callback(self._end_pass)
        current = self._pass
        if batch_size != current.batch_size:
            self._fail(
                ValueError(
                    f"layer {layer!r} saw a batch of {batch_size} examples but "
                    f"{current.first_layer!r} saw {current.batch_size} in the same backward "
                    "pass: every DP layer needs the "
                    "examples in the first dimension of its input (do not flatten the batch into "
                    "the sequence, and do not broadcast one input over the batch, e.g. give GPT-2 "
                    "position_ids of shape (B, T) or none)"
                )
            )
        return current

    def record(self, layer: str, batch_size: int, contributions: list[Contribution]) -> None:
        """Take one layer's per-example contributions (called once per layer per backward)."""
        current = self._open_pass(layer, batch_size)
        if layer in current.layers:
            self._fail(
                RuntimeError(
                    f"layer {layer!r} ran twice in one backward pass: a layer called several times "
                    "per forward (or recomputed by activation checkpointing) would be clipped once "
                    "per call, not once per example; call each DP layer once per forward"
                )
            )
        current.layers.add(layer)
        self._take(current, contributions)

    def record_per_example(self, layer: str, name: str, grads: torch.Tensor) -> None:
        """Add materialised per-example gradients ``grads: (B, *shape)`` float32 of parameter
        ``name`` (the vmap fallback). Calls within one backward pass are summed per example
        before clipping, so a module run several times per forward is clipped once per example.
        """
        current = self._open_pass(layer, grads.shape[0])
        summed = current.per_example.get(name)
        current.per_example[name] = grads if summed is None else summed + grads

    def _take(self, current: _Pass, contributions: list[Contribution]) -> None:
        # finiteness is checked once, at the end of the pass (one host synchronisation per pass)
        current.finite.extend((c.name, torch.isfinite(c.norm2).all()) for c in contributions)
        if self._failure is not None:
            # a failed batch across processes: nothing is added, but FSDP2's reduce-scatters
            # still need every parameter's gradient, in the same sizes on every rank
            if self._fsdp:
                for contribution in contributions:
                    shape = self._parameters[contribution.name].shape
                    self._add_unsharded(contribution.name, torch.zeros(shape))
            return
        if self.config.clipping == "flat":
            formed = [c.name for c in contributions if not callable(c.clipped_sum)]
            if formed:
                raise RuntimeError(f"flat clipping got sums already clipped per layer: {formed}")
            current.pending.extend(contributions)
            return
        for contribution in contributions:
            summed = contribution.clipped_sum
            if callable(summed):
                summed = summed(
                    clip_coefficients(contribution.norm2, self._bounds[contribution.name])
                )
            self._add(contribution.name, summed)

    def _check_finite(self, current: _Pass) -> None:
        """Fail the batch if any example's norm in the pass was not finite (read once)."""
        if not current.finite:
            return
        device = current.finite[0][1].device
        flags = torch.stack([flag.to(device) for _, flag in current.finite]).tolist()
        bad = [name for (name, _), ok in zip(current.finite, flags, strict=True) if not ok]
        if bad:
            self._fail(
                FloatingPointError(
                    f"non-finite per-example gradient norm in {bad[0]!r}; the step was discarded"
                )
            )

    def layer_bound(self, name: str) -> float:
        """C_l of parameter ``name`` under per-layer clipping."""
        return self._bounds[name]

    def note_plan(self, name: str, plan: LayerPlan) -> None:
        """Record the method a layer chose for parameter ``name`` in this backward pass (the
        first report of a pass, made before the pass opens, starts a new record)."""
        current = self._pass
        if current is None or current.graph_task != torch._C._current_graph_task_id():
            self._plans = {}
        self._plans[name] = plan

    def plan(self) -> dict[str, LayerPlan]:
        """The method each linear weight used in the last backward pass
        (:class:`flashdp.plan.LayerPlan` by parameter name: ``store``, ``ghost`` or
        ``recompute``, with the estimated costs it was chosen from)."""
        return dict(self._plans)

    @property
    def distributed(self) -> bool:
        """Whether the model trains across processes (DDP or FSDP2)."""
        return self._sync is not None

    def _add(self, name: str, clipped_sum: torch.Tensor) -> None:
        if self._fsdp:
            self._add_unsharded(name, clipped_sum)
            return
        if name in self._sums:
            self._sums[name].add_(clipped_sum)
        else:
            self._sums[name] = clipped_sum

    def guard(self, parameter: torch.Tensor, name: str) -> None:
        """Refuse autograd gradients reaching ``parameter`` (once per tensor object: FSDP2 keeps
        a sharded and an unsharded one per parameter)."""
        known = self._hooked.get(id(parameter))
        if known is None or known() is not parameter:
            refuse_escape(parameter, name, self)
            self._hooked[id(parameter)] = weakref.ref(parameter)

    def _raise_discarded(self) -> None:
        if self._fsdp:
            self._discard_sharded()  # FSDP2 has just reduce-scattered the discarded batch
        raise RuntimeError(
            "this logical batch was discarded on every rank (abort() or an exception inside "
            "no_sync()); its synchronised backward releases nothing"
        )

    def _add_unsharded(self, name: str, clipped_sum: torch.Tensor) -> None:
        """FSDP2: the clipped sum, divided by B, goes to the gradient of the unsharded parameter
        inside the layer's backward, where FSDP2's reduce-scatter sums it over the ranks."""
        model = None if self._model is None else self._model()
        assert model is not None
        assert self.config.expected_batch_size is not None
        parameter = model.get_parameter(name)
        if sharded(parameter):
            self._fail(
                RuntimeError(
                    f"parameter {name!r} is still sharded in its layer's backward: FSDP2 did not "
                    "gather it, so its clipped gradient cannot reach the reduce-scatter"
                )
            )
            return
        self.guard(parameter, name)
        value = (clipped_sum.to(parameter.device) / self.config.expected_batch_size).to(
            parameter.dtype
        )
        if parameter.grad is None:
            parameter.grad = value
        else:
            parameter.grad.add_(value)

    def _end_pass(self) -> None:
        current, self._pass = self._pass, None
        if current is None:
            return
        if current.per_example:
            self._take(
                current,
                [Contribution.from_per_example(n, g) for n, g in current.per_example.items()],
            )
        self._check_finite(current)
        if current.pending and self._failure is None:
            total = torch.stack([c.norm2 for c in current.pending]).sum(0)
            coef = clip_coefficients(total, self.config.max_grad_norm)
            for contribution in current.pending:
                self._add(contribution.name, contribution.clipped_sum(coef))
        self._examples += current.batch_size
        if self._accumulating:
            return
        if self._sync is not None:
            if self._skip_until_sync:
                # the rest of a logical batch already discarded on every rank: no collective
                self._sums.clear()
                self._examples = 0
                self._failure = None
                if self._sync.sync_next:
                    self._skip_until_sync = self._batch_open = False
                    # raised after DDP's and FSDP2's own end-of-backward callbacks, which must
                    # run for their next iteration
                    torch.autograd.Variable._execution_engine.queue_callback(self._raise_discarded)
                return
            if not self._sync.sync_next:
                return  # without gradient sync: released with the next synchronised backward
            # after DDP's own end-of-backward callback, which writes its buckets to .grad
            torch.autograd.Variable._execution_engine.queue_callback(self._release)
            return
        self._release()

    # -- logical batches --------------------------------------------------------------------------

    @contextlib.contextmanager
    def accumulate(self) -> Iterator[None]:
        """Sum the clipped gradients of every backward pass inside, add noise once on exit.

        Use it for gradient accumulation over micro-batches, and for Poisson batches that may be
        empty (an empty block still releases noise, as the accountant assumes). Under DDP or
        FSDP2 every rank runs the forward and backward of every micro-batch (they are
        collectives): a rank with an empty local batch runs a placeholder example with its loss
        multiplied by 0.

        Example:
            >>> with controller.accumulate():  # doctest: +SKIP
            ...     for inputs, targets in micro_batches:
            ...         loss_fn(model(inputs), targets).backward()
            >>> optimizer.step()  # doctest: +SKIP
        """
        if self._accumulating:
            raise RuntimeError("accumulate() is already active; it does not nest")
        if self._pass is not None:
            self.abort()  # a backward pass that raised before its end: its batch is discarded
        elif self._batch_open:
            raise RuntimeError(
                "a logical batch is already open (backward passes inside ddp.no_sync() not yet "
                "released): finish it with a backward outside no_sync() before accumulate()"
            )
        self._open_batch()
        self._skip_until_sync = self._discarded = False
        self._accumulating = True
        try:
            yield
        except BaseException:
            self.abort()
            raise
        else:
            if not (self._discarded and self._sync is None):
                self._release()
        finally:
            self._accumulating = self._discarded = False

    def _open_batch(self) -> None:
        self._batch_open = True
        self._reported = False

    def abort(self) -> None:
        """Discard everything gathered for the current logical batch (nothing is released).

        Inside :meth:`accumulate` the whole block is discarded: a later backward pass in it
        raises, and leaving it releases nothing. Under DDP the batch is discarded on every rank:
        this rank takes part in the batch's collective with a failure flag, and the other ranks'
        release raises."""
        self._discarded = self._accumulating
        self._pass = None
        self._sums.clear()
        self._examples = 0
        self._batch_open = False
        self._failure = None
        if self._fsdp:
            self._discard_sharded()
        if self._sync is not None and not self._reported:
            self._reported = True
            self._sync.agree(0, self.steps, failed=True)
            # the micro-batches left of a logical batch accumulated without gradient sync
            self._skip_until_sync = not self._sync.sync_next and not self._accumulating

    def _agree(self) -> int:
        """The number of examples in the logical batch on all ranks (checks that no rank
        failed and all are at the same batch)."""
        if self._sync is None:
            return self._examples
        if self._reported:
            self.abort()
            raise RuntimeError(
                "this logical batch was already discarded on every rank (a backward pass in it "
                "failed, or abort() was called); leave the accumulate() block and start the "
                "batch again"
            )
        self._reported = True
        failure = self._failure
        try:
            examples, failures = self._sync.agree(
                self._examples, self.steps, failed=failure is not None
            )
        except BaseException:
            self.abort()
            raise
        if failures:
            self.abort()
            if failure is not None:
                raise failure
            raise RuntimeError(
                f"{failures} of {self._sync.world_size} ranks discarded this logical batch (a "
                "failed backward pass or abort()); it was discarded on every rank"
            )
        return examples

    def _release(self) -> None:
        self._check_parameters()
        examples = self._agree()
        denominator = self.config.expected_batch_size or examples
        if denominator == 0:
            self.abort()
            raise ValueError(
                "the logical batch was empty and expected_batch_size is not set: pass "
                "expected_batch_size to make_private (required with Poisson sampling)"
            )
        if self._fsdp:
            self._release_sharded(denominator)
        else:
            self._release_replicated(denominator)
        self.steps += 1
        if self.accountant is not None:
            assert self.config.sample_rate is not None
            self.accountant.step(self.config.noise_multiplier, self.config.sample_rate)
        logger.debug("released logical batch %d (%d examples)", self.steps, examples)
        self._sums.clear()
        self._examples = 0
        self._batch_open = self._skip_until_sync = False

    def _discard_sharded(self) -> None:
        """FSDP2 has already reduce-scattered part of the batch into the gradients, without
        noise: drop them (earlier accumulated gradients too) where the parameters are
        reachable."""
        model = None if self._model is None else self._model()
        if model is None:
            return
        for name in self._parameters:
            model.get_parameter(name).grad = None
        discard_fsdp_gradients(model)  # the sharded, unsharded and no-sync accumulated ones

    def _release_sharded(self, denominator: int) -> None:
        """FSDP2: the local shard of every gradient already holds Σ clip(g_b) / B over all ranks
        (reduce-scattered in the backward); it gets the rows of one full noise draw it owns."""
        model = None if self._model is None else self._model()
        assert model is not None
        std = self.config.noise_std
        for name in self._parameters:
            parameter = model.get_parameter(name)
            try:
                self._sync.check_sharded(name, parameter)
            except BaseException:
                self.abort()
                raise
            self.guard(parameter, name)
            local = parameter.to_local()
            added = torch.zeros(local.shape, device=local.device)
            if std > 0:
                # every rank draws the whole tensor: the same draw as one process, each
                # coordinate noised once, by the rank holding it
                noise = torch.randn(parameter.shape, generator=self.generator, device=local.device)
                # (rows·std)/B, as one process computes (Σ + noise·std)/B
                added = self._sync.local_rows(noise, parameter) * std / denominator
            if parameter.grad is None:
                parameter.grad = self._sync.like(parameter, added.to(parameter.dtype))
            else:
                parameter.grad.to_local().add_(added.to(parameter.dtype))

    def _release_replicated(self, denominator: int) -> None:
        """One process or DDP: noise into the summed clipped gradients (on rank 0 only under
        DDP, before the sum over the ranks), then the division, in place."""
        std = self.config.noise_std
        draws_noise = std > 0 and (self._sync is None or self._sync.adds_noise)
        released: list[torch.Tensor] = []
        for name, parameter in self._parameters.items():
            summed = self._sums.pop(name, None)  # owned here: every clipped sum is a new tensor
            if summed is None:
                summed = torch.zeros(parameter.shape, device=parameter.device)
            if draws_noise:
                noise = torch.randn(summed.shape, generator=self.generator, device=summed.device)
                summed.add_(noise.mul_(std))
            released.append(summed)
        if self._sync is not None:
            self._sync.sum_(released)  # one noise draw (rank 0's) in the sum
        for parameter, summed in zip(self._parameters.values(), released, strict=True):
            grad = summed.div_(denominator).to(parameter.dtype)
            if parameter.grad is None:
                parameter.grad = grad
            else:
                parameter.grad.add_(grad)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to resume: released steps, the accountant's history and the
        noise generator's state (``None`` without a generator of its own).

        Under DDP only rank 0 draws noise: save rank 0's state (every rank may load it)."""
        if self._batch_open or self._pass is not None:
            raise RuntimeError("state_dict() inside a logical batch: save after its release")
        return {
            "steps": self.steps,
            "accountant": None if self.accountant is None else list(self.accountant.history),
            "generator": None if self.generator is None else self.generator.get_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the same steps, ε and next noise draw."""
        expected = {"steps", "accountant", "generator"}
        if not isinstance(state, Mapping) or set(state) != expected:
            keys = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"a controller state has the keys {sorted(expected)}, got {keys}")
        if (state["accountant"] is None) != (self.accountant is None):
            raise ValueError(
                "the state's accountant does not match this model's: sample_rate was "
                f"{'not ' if state['accountant'] is None else ''}set when it was saved"
            )
        if (state["generator"] is None) != (self.generator is None):
            raise ValueError(
                "the state was saved with"
                f"{'out' if state['generator'] is None else ''} a noise generator of its own, "
                "this model has " + ("none" if self.generator is None else "one")
            )
        if self._batch_open or self._pass is not None:
            raise RuntimeError("load_state_dict() inside a logical batch: load between batches")
        self.steps = int(state["steps"])
        if self.accountant is not None:
            self.accountant.history = [
                (float(s), float(q), int(n)) for s, q, n in state["accountant"]
            ]
        if self.generator is not None:
            self.generator.set_state(state["generator"])

    def epsilon(self, delta: float) -> float:
        """ε spent so far at this δ (needs ``sample_rate`` in :func:`flashdp.make_private`)."""
        if self.accountant is None:
            raise ValueError("no accountant: pass sample_rate to make_private to track ε")
        if self.config.noise_multiplier == 0 and self.steps:
            return math.inf
        return self.accountant.get_epsilon(delta)
