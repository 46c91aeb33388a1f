"""Private training across processes: torch DDP and FSDP2, one noise draw per logical batch.

Every rank clips its own examples inside the backward, exactly as in one process. What changes
is the end of a logical batch (:meth:`DPController._release`): the ranks first agree, in one
small collective, on the number of examples and that none of them failed or fell out of step;
then the clipped sums are added across ranks with the noise drawn once, so the released gradient
is the one a single process would release for the concatenated batch:

    (Σ_ranks Σ_b clip(g_b) + N(0, σ²C²)) / B.

* **DDP** (:class:`~torch.nn.parallel.DistributedDataParallel`, either wrapping the private
  model or wrapped by :func:`flashdp.make_private`): DDP's own gradient all-reduce is replaced
  by a communication hook that keeps the local gradient (it would average gradients the DP
  layers never hand to autograd, and overwrite the released ones with zeros). At the release,
  rank 0 adds the noise to its clipped sums, and one bucketed all-reduce sums them over the
  ranks, so every rank holds the same ``.grad``. ``ddp.no_sync()`` defers the release to the
  next backward outside it, like DDP's own accumulation.
* **FSDP2** (:func:`torch.distributed.fsdp.fully_shard`): per-layer clipping only. Each DP
  layer writes its clipped sum into the unsharded parameter's gradient inside its backward,
  FSDP2 reduce-scatters it as usual, and at the release each rank adds to the coordinates of
  its own shard the matching slice of one full noise draw. Flat clipping needs every example's
  norm over all layers before any layer's gradient leaves the rank, which FSDP2's per-module
  reduce-scatter does not allow: it is refused.

Every rank must run the same logical batches: a rank whose backward fails (or that calls
:meth:`~flashdp.DPController.abort`) takes part in the batch's collective with a failure flag, so
the batch is discarded on every rank and none waits for it. Ranks that disagree on the number of
released batches are refused at the next release.
"""

import zlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

# Bucket size of the release all-reduce, in float32 elements (DDP's default bucket is 25 MiB).
BUCKET_ELEMENTS = 1 << 22

DDP_HOOK_TAKEN = (
    "this DistributedDataParallel module already has a communication hook; flashdp replaces "
    "DDP's gradient all-reduce with its own (clipped sums plus one noise draw), so it needs "
    "DDP without a hook: remove register_comm_hook"
)


# No ``from __future__ import annotations`` in this module: DDP checks the hook's annotations.
def _keep_local(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook that communicates nothing: the bucket keeps the local gradient.

    The DP layers hand no gradient to autograd; the controller sums the clipped gradients over
    the ranks itself at the end of the logical batch."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def active_ddp() -> "nn.parallel.DistributedDataParallel | None":
    """The DDP module whose forward is running (None outside one, or in torch builds that do
    not track it)."""
    getter = getattr(nn.parallel.DistributedDataParallel, "_get_active_ddp_module", None)
    return None if getter is None else getter()


def is_fsdp(module: nn.Module) -> bool:
    """Whether ``module`` or a submodule was sharded with FSDP2's ``fully_shard``."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return False
    return any(isinstance(m, FSDPModule) for m in module.modules())


def sum_and_compare(
    summed: Sequence[int], equal: Sequence[int], group: Any, device: torch.device
) -> tuple[list[int], list[bool]]:
    """One int64 all-reduce over ``group``: the sums over the ranks of ``summed``, and for each
    value of ``equal`` whether every rank holds the same one (Σv = W·v and Σv² = W·v² on this
    rank's v hold exactly when all ranks' v are equal; keep W·v² inside int64)."""
    world = dist.get_world_size(group)
    control = torch.tensor(
        [*summed, *(term for v in equal for term in (v, v * v))],
        dtype=torch.int64,
        device=device,
    )
    dist.all_reduce(control, group=group)
    values = [int(v) for v in control.tolist()]
    sums, moments = values[: len(summed)], values[len(summed) :]
    same = [
        moments[2 * i] == world * v and moments[2 * i + 1] == world * v * v
        for i, v in enumerate(equal)
    ]
    return sums, same


class GroupSync:
    """The collectives of one private model's logical batches over a process group.

    Args:
        kind: ``"ddp"`` or ``"fsdp"``.
        group: the process group (``None``: the default group).
        device: device of the model's parameters; NCCL groups communicate there, others on
            the CPU.
    """

    def __init__(self, kind: str, group: Any, device: torch.device, settings: tuple = ()) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                f"{kind.upper()} is in use but torch.distributed has no process group"
            )
        self.kind = kind
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.device = _communication_device(str(dist.get_backend(group)), device)
        self.sync_next = True  # False when the last forward ran without gradient sync
        # the privacy settings must agree on every rank (σ, C, B, q, clipping, bounds)
        self.settings = zlib.crc32(repr(settings).encode()) % (1 << 20)

    @property
    def adds_noise(self) -> bool:
        """DDP: rank 0 draws the noise before the sum (every rank then holds the same sum)."""
        return self.rank == 0

    def agree(self, examples: int, steps: int, failed: bool) -> tuple[int, int]:
        """One small all-reduce per logical batch: returns (examples on all ranks, ranks that
        failed). Raises when the ranks' privacy settings differ, or when they have released
        different numbers of logical batches."""
        (total, failures), (same_settings, same_steps) = sum_and_compare(
            [examples, int(failed)], [self.settings, steps], self.group, self.device
        )
        if not same_settings:
            raise RuntimeError(
                "the ranks' private models have different privacy settings (noise multiplier, "
                "max_grad_norm, expected_batch_size, sample_rate, clipping or layer bounds): "
                "their gradients cannot be summed under one noise draw. Call make_private with "
                "the same settings on every rank"
            )
        if not failures and not same_steps:
            raise RuntimeError(
                f"rank {self.rank} has released {steps} logical batches but another rank has "
                "not: the ranks are out of step (a rank skipped a batch or ran an extra one), "
                "so their gradients would mix different batches. Every rank must run the same "
                "logical batches (inside controller.accumulate() even when its local batch is "
                "empty)"
            )
        return total, failures

    def sum_(self, tensors: Sequence[torch.Tensor]) -> None:
        """All-reduce (sum) ``tensors`` in place, coalesced into buckets of float32 elements."""
        bucket: list[torch.Tensor] = []
        size = 0
        for tensor in tensors:
            bucket.append(tensor)
            size += tensor.numel()
            if size >= BUCKET_ELEMENTS:
                self._sum_bucket(bucket)
                bucket, size = [], 0
        if bucket:
            self._sum_bucket(bucket)

    def _sum_bucket(self, tensors: list[torch.Tensor]) -> None:
        flat = torch.cat([t.reshape(-1).to(self.device, torch.float32) for t in tensors])
        dist.all_reduce(flat, group=self.group)
        offset = 0
        for tensor in tensors:
            tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()


def _communication_device(backend: str, device: torch.device) -> torch.device:
    """Where the release's collectives run: the parameters' GPU when the group has NCCL for it
    (``"nccl"``, ``"cuda:nccl"`` in a multi-backend string, or the default pair), else the CPU."""
    if device.type == "cuda" and ("nccl" in backend or backend == "undefined"):
        return device
    return torch.device("cpu")


def _settings(controller: Any) -> tuple:
    config = controller.config
    return (
        config.noise_multiplier,
        config.max_grad_norm,
        config.expected_batch_size,
        config.sample_rate,
        config.clipping,
        config.loss_reduction,
        config.layer_norms,
        tuple(controller._parameters),
    )


def attach_ddp(controller: Any, ddp: nn.parallel.DistributedDataParallel) -> None:
    """Let ``controller`` reduce the private gradients of the model ``ddp`` wraps."""
    private = {id(p) for p in controller._parameters.values()}
    outside = [
        n for n, p in ddp.module.named_parameters() if p.requires_grad and id(p) not in private
    ]
    if outside:
        raise ValueError(
            f"the DistributedDataParallel module holds trainable parameters outside the private "
            f"model: {outside}. flashdp replaces DDP's all-reduce, so they would never be "
            "synchronised; make the whole module DDP wraps private, or freeze them"
        )
    try:
        ddp.register_comm_hook(state=None, hook=_keep_local)
    except RuntimeError as error:
        raise RuntimeError(DDP_HOOK_TAKEN) from error
    device = next(iter(controller._parameters.values())).device
    controller._sync = GroupSync("ddp", ddp.process_group, device, _settings(controller))


def sharded(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a DTensor (an FSDP2 parameter outside its module's forward and
    backward)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without DTensor
        return False
    return isinstance(tensor, DTensor)


class ShardedSync(GroupSync):
    """FSDP2: the collectives of :class:`GroupSync` plus the sharded layout of the gradients."""

    def check_sharded(self, name: str, parameter: torch.Tensor) -> None:
        from torch.distributed.tensor import Shard

        if not sharded(parameter):
            raise RuntimeError(
                f"parameter {name!r} is not sharded at the end of the backward pass: flashdp "
                "needs FSDP2's default reshard_after_backward=True"
            )
        mesh = parameter.device_mesh
        if mesh.ndim != 1 or mesh.size() != self.world_size or parameter.placements != (Shard(0),):
            raise NotImplementedError(
                f"parameter {name!r} has placements {parameter.placements} on a mesh of shape "
                f"{tuple(mesh.shape)}: flashdp supports FSDP2 sharding on dimension 0 over all "
                f"{self.world_size} ranks (no HSDP, tensor or custom sharding)"
            )

    @staticmethod
    def local_rows(tensor: torch.Tensor, parameter: torch.Tensor) -> torch.Tensor:
        """The rows of the full ``tensor`` that this rank's shard of ``parameter`` holds:
        FSDP2 cuts dimension 0 as ``torch.chunk`` does (the last chunks may be shorter or
        empty)."""
        mesh = parameter.device_mesh
        chunks = torch.chunk(tensor, mesh.size(), dim=0)
        index = mesh.get_local_rank()
        if index < len(chunks):
            return chunks[index]
        return tensor.new_empty((0, *tensor.shape[1:]))

    @staticmethod
    def like(parameter: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """A DTensor sharded like ``parameter`` with this rank's shard ``local``."""
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(
            local,
            parameter.device_mesh,
            parameter.placements,
            shape=parameter.shape,
            stride=parameter.stride(),
            run_check=False,
        )


FSDP_CLIPPING = (
    "clipping='flat' is not supported under FSDP2 (fully_shard): it needs each example's "
    "gradient norm over all layers before any layer's gradient is reduce-scattered, and FSDP2 "
    "reduces each module's gradients as soon as its backward ends. Use clipping='per_layer' "
    "(each layer clipped inside its own backward), or DistributedDataParallel for flat clipping"
)


def attach_fsdp(controller: Any, model: nn.Module) -> None:
    """Let ``controller`` release the gradients of ``model``, sharded with FSDP2: per-layer
    clipping only, the gradient's denominator known before the backward, FSDP2 summing (not
    averaging) the gradients it reduce-scatters."""
    from torch.distributed.fsdp import FSDPModule

    config = controller.config
    if config.clipping == "flat":
        raise ValueError(FSDP_CLIPPING)
    if config.expected_batch_size is None:
        raise ValueError(
            "under FSDP2 (fully_shard) set expected_batch_size in make_private: each layer's "
            "clipped sum is divided by it before FSDP2 reduce-scatters it, during the backward, "
            "when the number of examples in the logical batch is not yet known"
        )
    if controller.fallback_modules:
        raise ValueError(
            "fallback='vmap' modules are not supported under FSDP2 (fully_shard): their "
            "per-example gradients are clipped at the end of the backward, after FSDP2 has "
            f"reduce-scattered them ({list(controller.fallback_modules)})"
        )
    sharded_roots = {name for name, m in model.named_modules() if isinstance(m, FSDPModule)}
    outside = [
        name
        for name in controller._parameters
        if not any(root == "" or name.startswith(root + ".") for root in sharded_roots)
    ]
    if outside:
        raise ValueError(
            f"private parameters {outside} are not sharded by a fully_shard unit inside the "
            "private model (an outer unit would average their gradients over the ranks): "
            "call fully_shard on the private model or its submodules"
        )
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # a sum over the ranks, not a mean
            module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    device = next(p.device for p in model.parameters())
    sync = ShardedSync("fsdp", None, device, _settings(controller))
    names = {id(p): n for n, p in model.named_parameters()}
    for group in fsdp_param_groups(model):
        for fsdp_param in getattr(group, "fsdp_params", ()):
            parameter = fsdp_param.sharded_param
            name = names.get(id(parameter)) or _qualified(model, fsdp_param)
            if name in controller._parameters:
                sync.check_sharded(name, parameter)
                controller.guard(parameter, name)
    check_fsdp_settings(model)
    controller._sync = sync


def check_fsdp_settings(model: nn.Module) -> None:
    """FSDP2 settings flashdp cannot release under (checked at every forward: they can change
    between steps)."""
    for group in fsdp_param_groups(model):
        if not getattr(group, "reshard_after_backward", True):
            raise NotImplementedError(
                "flashdp needs FSDP2's default reshard_after_backward=True: the release adds "
                "the noise to the sharded gradients after the backward"
            )


def discard_fsdp_gradients(model: nn.Module) -> None:
    """Drop every gradient FSDP2 holds for the units inside ``model``: the sharded ``.grad``,
    the unsharded one and the one accumulated without gradient sync (none of them is noised)."""
    for group in fsdp_param_groups(model):
        for fsdp_param in getattr(group, "fsdp_params", ()):
            fsdp_param.sharded_param.grad = None
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            if unsharded is not None:
                unsharded.grad = None
            if getattr(fsdp_param, "unsharded_accumulated_grad", None) is not None:
                fsdp_param.unsharded_accumulated_grad = None


def fsdp_param_groups(model: nn.Module) -> list[Any]:
    """FSDP2's parameter groups of the units inside ``model`` (an internal structure of torch;
    empty where it is not available, and only the release-time checks then apply)."""
    from torch.distributed.fsdp import FSDPModule

    groups = []
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        try:
            state = module._get_fsdp_state()
            found = getattr(state, "_fsdp_param_groups", None) or [state._fsdp_param_group]
        except AttributeError:  # pragma: no cover - another torch layout
            continue
        groups.extend(g for g in found if g is not None)
    return groups


def gradient_sync_on(model: nn.Module) -> bool:
    """False when ``set_requires_gradient_sync(False)`` is in force on an FSDP2 unit of
    ``model`` (its micro-batches accumulate locally, like DDP's ``no_sync()``)."""
    return all(getattr(g, "reduce_grads", True) for g in fsdp_param_groups(model))


def _qualified(model: nn.Module, fsdp_param: Any) -> str | None:
    """The name of an FSDP2 parameter in ``model``, from its module and attribute."""
    info = getattr(fsdp_param, "_module_info", None)
    if info is None:
        return None
    for prefix, module in model.named_modules():
        if module is info.module:
            return f"{prefix}.{info.param_name}" if prefix else info.param_name
    return None
