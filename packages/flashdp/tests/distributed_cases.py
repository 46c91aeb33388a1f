"""Cases of the distributed tests, run once per rank under torchrun (``distributed_worker.py``)
and once in the test process without DDP (``world=1``), which is the single-process oracle.

Every case builds its model and data from fixed seeds, so each rank and the oracle see the same
initial parameters and the same global batch; rank r keeps the global batch's examples r, r + W,
... (the order of the examples in a sum does not change its value beyond float32 rounding).
Each returns a dict of tensors, numbers and messages that the test compares across ranks and
with the oracle.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

import flashdp

N, WIDTH, C = 12, 16, 1.0


def net(width: int = WIDTH) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 3))


def inputs(n: int = N, seed: int = 1) -> torch.Tensor:
    # scaled so that some examples are clipped and some are not
    return torch.randn(n, 4, generator=torch.Generator().manual_seed(seed)) * 2


def loss(out: torch.Tensor, _targets=None) -> torch.Tensor:
    return out.square().sum()


def private(
    world: int,
    *,
    reverse: bool = False,
    ddp_options: dict | None = None,
    buffer: bool = False,
    **options,
) -> tuple[nn.Module, nn.Module]:
    """(the module to call, the private model), under DDP when ``world`` > 0 ranks run."""
    options = {
        "max_grad_norm": C,
        "noise_multiplier": 0.0,
        "loss_reduction": "sum",
        "backend": "reference",
        **options,
    }
    if not dist.is_initialized():
        model = flashdp.make_private(net(options.pop("width", WIDTH)), **options)
        return model, model
    width = options.pop("width", WIDTH)
    if reverse:
        ddp = flashdp.make_private(nn.parallel.DistributedDataParallel(net(width)), **options)
        return ddp, ddp.module
    model = flashdp.make_private(net(width), **options)
    if buffer:  # before DDP wraps it: DDP broadcasts rank 0's buffers in every forward
        model.register_buffer("seen", torch.zeros(1))
    return nn.parallel.DistributedDataParallel(model, **(ddp_options or {})), model


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    out = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return out


def local(batch: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    return batch[rank::world]


def case_one_backward(rank: int, world: int, clipping: str, reverse: bool) -> dict:
    """Two logical batches of one backward each (the second checks the steady state)."""
    call, model = private(world, clipping=clipping, reverse=reverse)
    out = {}
    for step in range(2):
        loss(call(local(inputs(seed=step + 1), rank, world))).backward()
        out[f"step{step}"] = grads(model)
    return out


def case_no_sync(rank: int, world: int, clipping: str) -> dict:
    """Two micro-batches, the first inside ``ddp.no_sync()``: one logical batch."""
    call, model = private(world, clipping=clipping)
    x = local(inputs(), rank, world)
    if dist.is_initialized():
        with call.no_sync():
            loss(call(x[:2])).backward()
        loss(call(x[2:])).backward()
    else:
        with flashdp.get_controller(model).accumulate():
            loss(call(x[:2])).backward()
            loss(call(x[2:])).backward()
    return {"grads": grads(model), "steps": flashdp.get_controller(model).steps}


def case_poisson(rank: int, world: int) -> dict:
    """Poisson batches (some local batches empty), accumulate(), noise, ε."""
    q, sigma, seed = 0.25, 0.8, 3
    sampler = flashdp.DistributedPoissonSampler(
        N, q, seed=seed, steps=6, rank=rank, world_size=world
    )
    call, model = private(
        world,
        noise_multiplier=sigma,
        expected_batch_size=sampler.expected_batch_size,
        sample_rate=q,
        generator=torch.Generator().manual_seed(11),
    )
    controller = flashdp.get_controller(model)
    data = inputs()
    out: dict = {"sizes": []}
    for step, indices in enumerate(sampler):
        out["sizes"].append(len(indices))
        with controller.accumulate():
            # an empty local batch runs a placeholder example with a zero loss (DDP's
            # collectives need every rank's forward): its clipped gradient is exactly zero
            scale = 1.0 if indices else 0.0
            (scale * loss(call(data[indices if indices else [0]]))).backward()
        out[f"step{step}"] = grads(model)
    out["epsilon"] = controller.epsilon(1e-5)
    out["steps"] = controller.steps
    return out


def case_noise(rank: int, world: int, steps: int = 30) -> dict:
    """Zero clipped sums, noise only: the released gradient is the noise / B."""
    call, model = private(
        world,
        noise_multiplier=1.0,
        expected_batch_size=4,
        width=64,
        generator=torch.Generator().manual_seed(123),
    )
    out = {}
    x = local(inputs(), rank, world)
    for step in range(steps):
        (0.0 * loss(call(x))).backward()  # every per-example gradient is zero
        out[f"step{step}"] = grads(model)
    return out


def case_sensitivity(rank: int, world: int, clipping: str) -> dict:
    """The released sum with and without one huge example, the example on each rank in turn."""
    out = {}
    for owner in range(max(world, 1)):
        for present in (True, False):
            call, model = private(world, clipping=clipping, expected_batch_size=N)
            data = inputs()
            data[owner] = data[owner] * 1e6  # global example `owner` sits on rank `owner`
            if not present:
                data = torch.cat([data[:owner], data[owner + 1 :]])
            loss(call(local(data, rank, world))).backward()
            out[f"owner{owner}_{present}"] = {k: v * N for k, v in grads(model).items()}
    return out


def case_failure(rank: int, world: int, poison: float, **ddp_options) -> dict:
    """The last rank's backward fails (a non-finite norm: NaN reaches every layer, inf only the
    first, after DDP has marked the later layers' parameters ready); then a clean batch."""
    call, model = private(world, ddp_options=ddp_options)
    out: dict = {}
    x = local(inputs(), rank, world)
    loss(call(x)).backward()  # DDP rebuilds its buckets after its first iteration
    grads(model)
    bad = x.clone()
    if rank == world - 1:
        bad[0, 0] = poison
    try:
        loss(call(bad)).backward()
        out["error"] = None
    except (RuntimeError, FloatingPointError) as error:
        out["error"] = f"{type(error).__name__}: {error}"
    out["nothing_released"] = all(p.grad is None or not p.grad.any() for p in model.parameters())
    model.zero_grad(set_to_none=True)
    loss(call(x)).backward()
    out["after"] = grads(model)
    out["steps"] = flashdp.get_controller(model).steps
    return out


GLOBAL_BATCHES = ([0, 5, 7], [3], [], [2, 9, 11, 4])  # rank-local empty batches for W = 2, 3


def case_local_empty(rank: int, world: int, sharded: bool) -> dict:
    """Local batches that are empty on some ranks (and a global one that is empty): the
    placeholder idiom, on a model with a buffer (DDP broadcasts buffers in every forward)."""
    options = {
        "noise_multiplier": 0.5,
        "expected_batch_size": 4,
        "generator": torch.Generator().manual_seed(21),
    }
    if sharded:
        model = sharded_private(**options)
        call = model
    else:
        call, model = private(world, buffer=True, **options)
        if dist.is_initialized():
            assert call.modules_buffers, "DDP must see the buffer"
    controller = flashdp.get_controller(model)
    data, out = inputs(), {}
    for step, indices in enumerate(GLOBAL_BATCHES):
        mine = indices[rank::world] if dist.is_initialized() else indices
        with controller.accumulate():
            scale = 1.0 if mine else 0.0
            (scale * loss(call(data[mine if mine else [0]]))).backward()
        out[f"step{step}"] = full_grads(model)
    return out


def case_abort_in_no_sync(rank: int, world: int) -> dict:
    """Every rank aborts after a micro-batch inside ``ddp.no_sync()``: the synchronised
    backward that ends the batch releases nothing and raises; the next batches are released
    normally (DDP's own end-of-backward ran)."""
    call, model = private(world)
    controller = flashdp.get_controller(model)
    x = local(inputs(), rank, world)
    loss(call(x)).backward()  # DDP's first iteration
    grads(model)
    out: dict = {}
    with call.no_sync():
        loss(call(x[:2])).backward()
    controller.abort()
    try:
        loss(call(x[2:])).backward()
        out["error"] = None
    except RuntimeError as error:
        out["error"] = str(error)
    model.zero_grad(set_to_none=True)
    for step in range(2):
        loss(call(x)).backward()
        out[f"after{step}"] = grads(model)
    out["steps"] = controller.steps
    return out


def case_fsdp_more(rank: int, world: int) -> dict:
    """FSDP2: its own no-sync mode, and a gradient escaping through a sharded parameter."""
    out: dict = {}
    model = sharded_private()
    x = local(inputs(), rank, world)
    if dist.is_initialized():
        model.set_requires_gradient_sync(False)
    loss(model(x[:2])).backward()
    if dist.is_initialized():
        model.set_requires_gradient_sync(True)
    loss(model(x[2:])).backward()
    out["no_sync"] = full_grads(model)
    out["no_sync_steps"] = flashdp.get_controller(model).steps
    escaping = sharded_private()
    weight = escaping[0].weight
    try:
        full = weight.full_tensor() if hasattr(weight, "full_tensor") else weight
        (loss(escaping(x)) + (x @ full.T).sum()).backward()
        out["escape"] = None
    except RuntimeError as error:
        out["escape"] = str(error)
    return out


def case_mismatches(rank: int, world: int) -> dict:
    """Refused: privacy settings that differ between ranks, DDP around non-private trainable
    parameters, FSDP2 units outside the private model."""
    out: dict = {}
    try:
        flashdp.DistributedPoissonSampler(N, 0.5, seed=rank)
        out["seed"] = None
    except ValueError as error:
        out["seed"] = str(error)
    call, _ = private(world, expected_batch_size=N + (rank > 0))
    try:
        loss(call(local(inputs(), rank, world))).backward()
        out["settings"] = None
    except RuntimeError as error:
        out["settings"] = str(error)
    model = flashdp.make_private(net(), max_grad_norm=C, noise_multiplier=0.0)
    outer = nn.parallel.DistributedDataParallel(nn.Sequential(model, nn.Linear(3, 2)))
    try:
        outer(inputs())
        out["ddp_outer"] = None
    except ValueError as error:
        out["ddp_outer"] = str(error)
    from torch.distributed.fsdp import fully_shard

    model = flashdp.make_private(
        net(), max_grad_norm=C, noise_multiplier=0.0, expected_batch_size=N
    )
    fully_shard(model[0])
    wrapper = fully_shard(nn.Sequential(model))
    try:
        wrapper(inputs())
        out["fsdp_outer"] = None
    except ValueError as error:
        out["fsdp_outer"] = str(error)
    return out


def case_checkpoint(rank: int, world: int) -> dict:
    """state_dict after two noisy batches; a fresh model that loads it releases the same third."""
    options = {
        "noise_multiplier": 1.0,
        "expected_batch_size": 6,
        "sample_rate": 0.5,
    }
    call, model = private(world, generator=torch.Generator().manual_seed(5), **options)
    controller = flashdp.get_controller(model)
    x = local(inputs(), rank, world)
    for _ in range(2):
        loss(call(x)).backward()
        grads(model)
    state = controller.state_dict()
    loss(call(x)).backward()
    third = grads(model)
    call2, model2 = private(world, generator=torch.Generator().manual_seed(999), **options)
    model2.load_state_dict(model.state_dict())
    controller2 = flashdp.get_controller(model2)
    if dist.is_initialized():  # rank 0 draws the noise: every rank loads rank 0's state
        shared = [state]
        dist.broadcast_object_list(shared, src=0)
        state = shared[0]
    controller2.load_state_dict(state)
    loss(call2(x)).backward()
    return {
        "third": third,
        "resumed": grads(model2),
        "epsilon": controller.epsilon(1e-5),
        "resumed_epsilon": controller2.epsilon(1e-5),
    }


def case_out_of_step(rank: int, world: int) -> dict:
    """One rank resumes from a state with a different step count: every rank refuses."""
    call, model = private(world)
    controller = flashdp.get_controller(model)
    state = controller.state_dict()
    if rank == 0:
        state = {**state, "steps": 7}
    controller.load_state_dict(state)
    try:
        loss(call(local(inputs(), rank, world))).backward()
        return {"error": None}
    except RuntimeError as error:
        return {"error": str(error)}


def case_refusals(rank: int, world: int) -> dict:
    """DDP with a communication hook of its own; what FSDP2 cannot do."""
    out = {}
    ddp = nn.parallel.DistributedDataParallel(net())
    ddp.register_comm_hook(None, _sum_hook)
    try:
        flashdp.make_private(ddp, max_grad_norm=C, noise_multiplier=0.0)
        out["hook"] = None
    except RuntimeError as error:
        out["hook"] = str(error)
    for name, options in (
        ("fsdp_flat", {"clipping": "flat"}),
        ("fsdp_no_expected_batch_size", {"expected_batch_size": None}),
    ):
        model = sharded_private(**options)
        try:
            model(inputs()).sum().backward()
            out[name] = None
        except ValueError as error:
            out[name] = str(error)
    return out


def sharded_private(**options) -> nn.Module:
    """A private model sharded with FSDP2 (each Linear, then the root) when distributed."""
    options = {
        "max_grad_norm": C,
        "noise_multiplier": 0.0,
        "loss_reduction": "sum",
        "expected_batch_size": N,
        "backend": "reference",
        **options,
    }
    model = flashdp.make_private(net(options.pop("width", WIDTH)), **options)
    if dist.is_initialized():
        from torch.distributed.fsdp import fully_shard

        fully_shard(model[0])
        fully_shard(model[2])
        fully_shard(model)
    return model


def full_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole gradients (gathered from the shards under FSDP2)."""
    out = {}
    for name, p in model.named_parameters():
        grad = p.grad
        if grad is not None and hasattr(grad, "full_tensor"):
            grad = grad.full_tensor()
        out[name] = None if grad is None else grad.detach().clone()
    model.zero_grad(set_to_none=True)
    return out


def case_fsdp(rank: int, world: int) -> dict:
    """Per-layer clipping under FSDP2: one backward, accumulated micro-batches, noise, a
    failed rank, ε."""
    out: dict = {}
    model = sharded_private(sample_rate=0.5)
    x = local(inputs(), rank, world)
    for step in range(2):
        loss(model(local(inputs(seed=step + 1), rank, world))).backward()
        out[f"step{step}"] = full_grads(model)
    with flashdp.get_controller(model).accumulate():
        loss(model(x[:2])).backward()
        loss(model(x[2:])).backward()
    out["accumulated"] = full_grads(model)
    noisy = sharded_private(
        noise_multiplier=1.0, width=64, generator=torch.Generator().manual_seed(7)
    )
    for step in range(3):
        (0.0 * loss(noisy(x))).backward()
        out[f"noise{step}"] = full_grads(noisy)
    bad = x.clone()
    if rank == world - 1:
        bad[0, 0] = float("nan")
    try:
        loss(model(bad)).backward()
        out["error"] = None
    except (RuntimeError, FloatingPointError) as error:
        out["error"] = f"{type(error).__name__}: {error}"
    out["nothing_released"] = all(g is None for g in full_grads(model).values())
    loss(model(x)).backward()
    out["after"] = full_grads(model)
    controller = flashdp.get_controller(model)
    out["steps"], out["epsilon"] = controller.steps, controller.epsilon(1e-5)
    return out


def _sum_hook(state, bucket):
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])


def run_all(rank: int, world: int) -> dict:
    out = {}
    for clipping in ("per_layer", "flat"):
        for reverse in (False, True):
            out[f"one_backward_{clipping}_{reverse}"] = case_one_backward(
                rank, world, clipping, reverse
            )
        out[f"no_sync_{clipping}"] = case_no_sync(rank, world, clipping)
        out[f"sensitivity_{clipping}"] = case_sensitivity(rank, world, clipping)
    out["poisson"] = case_poisson(rank, world)
    out["noise"] = case_noise(rank, world)
    out["failure"] = case_failure(rank, world, float("nan"))
    out["failure_inf"] = case_failure(rank, world, float("inf"))
    if dist.is_initialized():
        out["failure_unused"] = case_failure(rank, world, float("inf"), find_unused_parameters=True)
    out["local_empty"] = case_local_empty(rank, world, sharded=False)
    out["local_empty_fsdp"] = case_local_empty(rank, world, sharded=True)
    out["fsdp_more"] = case_fsdp_more(rank, world)
    out["checkpoint"] = case_checkpoint(rank, world)
    out["fsdp"] = case_fsdp(rank, world)
    if dist.is_initialized():
        out["out_of_step"] = case_out_of_step(rank, world)
        out["refusals"] = case_refusals(rank, world)
        out["mismatches"] = case_mismatches(rank, world)
        out["abort_in_no_sync"] = case_abort_in_no_sync(rank, world)
    return out
