"""Side-by-side step time and peak memory of a GPT-shaped model: non-DP, flashdp (per-layer and
flat) and Opacus (per-layer hooks and ghost clipping), on the same batch. Needs the ``bench``
extra (opacus)."""

from __future__ import annotations

import copy
import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from flashdp.private import make_private
from flashdp.tiny_gpt import GPTConfig, SequenceCrossEntropy, TinyGPT
from kernels_common import Comparison, compare, drop_failing

logger = logging.getLogger(__name__)

NOISE_MULTIPLIER = 1.0
MAX_GRAD_NORM = 1.0


@dataclass(frozen=True)
class BenchShape:
    config: GPTConfig
    batch_size: int
    dtype: torch.dtype = torch.float32


CPU_SHAPE = BenchShape(GPTConfig(vocab_size=256, seq_len=128, width=256, depth=4, heads=4), 16)
QUICK_SHAPE = BenchShape(GPTConfig(vocab_size=256, seq_len=64, width=128, depth=2, heads=4), 8)
GPU_SHAPE = BenchShape(
    GPTConfig(vocab_size=50257, seq_len=1024, width=768, depth=12, heads=12), 8, torch.bfloat16
)
# Llama-shaped widths (12 layers of width 1024, 16 heads, a 32k vocabulary), same block layout
LLAMA_SHAPE = BenchShape(
    GPTConfig(vocab_size=32000, seq_len=1024, width=1024, depth=12, heads=16), 8, torch.bfloat16
)
GPU_SHAPES = {"gpt2": GPU_SHAPE, "llama": LLAMA_SHAPE}


def kernel_workload(
    shape: str = "gpt2", dtype: str | None = None, layers: list[str] | None = None
) -> None:
    """Every flashdp Triton kernel launch of one private step of a GPU benchmark model's linear
    layers, on CPU tensors: per-example norms and the clipped sum (``recompute``, flat clipping)
    and the stored per-example gradients (``store``) of each linear layer (``layers``: some of
    qkv, proj, up, down, head; default all). The workload ``kernels_common.compile_check``
    compiles for a GPU without running it; ``dtype`` overrides the benchmark's bf16."""
    from flashdp.kernels import (
        linear_weight_clipped_sum_triton,
        linear_weight_norm2_triton,
        linear_weight_store_clip_triton,
    )
    from flashdp.plan import plan_linear

    if shape not in GPU_SHAPES:
        raise ValueError(f"shape must be one of {sorted(GPU_SHAPES)}, got {shape!r}")
    bench = GPU_SHAPES[shape]
    config, batch = bench.config, bench.batch_size
    kind = getattr(torch, dtype) if dtype else bench.dtype
    width = config.width
    shapes = {"qkv": (width, 3 * width), "proj": (width, width), "up": (width, 4 * width),
              "down": (4 * width, width), "head": (width, config.vocab_size)}  # fmt: skip
    unknown = set(layers or ()) - set(shapes)
    if unknown:
        raise ValueError(f"unknown layers {sorted(unknown)}; they are {list(shapes)}")
    for name in layers or shapes:
        d_in, d_out = shapes[name]
        x = torch.empty(batch, config.seq_len, d_in, dtype=kind)
        grad = torch.empty(batch, config.seq_len, d_out, dtype=kind)
        linear_weight_norm2_triton(x, grad)
        linear_weight_clipped_sum_triton(x, grad, torch.ones(batch))
        # the store path's chunk as the plan makes it on CUDA (its default workspace)
        chunk = plan_linear(batch, config.seq_len, d_in, d_out, clipping="per_layer",
                            device="cuda", triton=True, method="store").chunk  # fmt: skip
        linear_weight_store_clip_triton(x, grad, torch.ones_like, chunk, with_bias=True)


def _sgd_step(model: nn.Module, loss_fn, tokens, targets, lr: float = 1e-3) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def step() -> None:
        loss_fn(model(tokens), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _opacus_step(
    model: nn.Module, tokens, targets, mode: str, distributed: bool = False
) -> Callable[[], None]:
    """Opacus' DP-SGD step (``mode``: ``"hooks"`` per-layer, ``"ghost"`` clipping); with
    ``distributed``, under its ``DifferentiallyPrivateDistributedDataParallel``, whose optimizer
    noises on rank 0 and all-reduces the gradients."""
    from opacus import PrivacyEngine

    if distributed:
        from opacus.distributed import DifferentiallyPrivateDistributedDataParallel

        model = DifferentiallyPrivateDistributedDataParallel(model)
    dataset = torch.utils.data.TensorDataset(tokens, targets)
    loader = torch.utils.data.DataLoader(dataset, batch_size=len(tokens))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    engine = PrivacyEngine(accountant="rdp")
    trainable = [p for p in model.parameters() if p.requires_grad]
    common = {
        "module": model,
        "optimizer": optimizer,
        "data_loader": loader,
        "noise_multiplier": NOISE_MULTIPLIER,
        "poisson_sampling": False,
    }
    if mode == "ghost":
        module, optimizer, criterion, _ = engine.make_private(
            **common,
            criterion=SequenceCrossEntropy(),
            max_grad_norm=MAX_GRAD_NORM,
            grad_sample_mode="ghost",
        )
    else:
        bound = MAX_GRAD_NORM / len(trainable) ** 0.5
        module, optimizer, _ = engine.make_private(
            **common, max_grad_norm=[bound] * len(trainable), clipping="per_layer"
        )
        criterion = SequenceCrossEntropy()

    def step() -> None:
        criterion(module(tokens), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def candidates(shape: BenchShape, device: str, opacus: bool = True) -> dict[str, Callable]:
    """The step of each implementation on one shared batch (models start from the same init)."""
    torch.manual_seed(0)
    base = TinyGPT(shape.config).to(device=device, dtype=shape.dtype)
    generator = torch.Generator().manual_seed(1)
    size = (shape.batch_size, shape.config.seq_len)
    tokens = torch.randint(0, shape.config.vocab_size, size, generator=generator).to(device)
    targets = torch.randint(0, shape.config.vocab_size, size, generator=generator).to(device)
    loss_fn = SequenceCrossEntropy()
    steps = {"non-DP": _sgd_step(copy.deepcopy(base), loss_fn, tokens, targets)}
    for clipping in ("per_layer", "flat"):
        private = make_private(
            copy.deepcopy(base),
            max_grad_norm=MAX_GRAD_NORM,
            noise_multiplier=NOISE_MULTIPLIER,
            clipping=clipping,
            expected_batch_size=shape.batch_size,
        )
        steps[f"flashdp {clipping}"] = _sgd_step(private, loss_fn, tokens, targets)
    if opacus:
        steps["Opacus per_layer hooks"] = _opacus_step(
            copy.deepcopy(base), tokens, targets, "hooks"
        )
        steps["Opacus ghost"] = _opacus_step(copy.deepcopy(base), tokens, targets, "ghost")
    return steps


def bench_shape(device: str, quick: bool = False, gpu_shape: str = "gpt2") -> BenchShape:
    """The benchmark's model and batch on ``device`` (``gpu_shape``: ``"gpt2"`` or ``"llama"``)."""
    if device == "cuda":
        if gpu_shape not in GPU_SHAPES:
            raise ValueError(f"gpu_shape must be one of {sorted(GPU_SHAPES)}, got {gpu_shape!r}")
        return GPU_SHAPES[gpu_shape]
    return QUICK_SHAPE if quick else CPU_SHAPE


def run(
    device: str,
    out: str | Path | None,
    *,
    quick: bool = False,
    repeat: int = 5,
    gpu_shape: str = "gpt2",
) -> Comparison:
    """Benchmark one training step of every implementation side by side; save JSON + Markdown."""
    shape = bench_shape(device, quick, gpu_shape)
    config = shape.config
    title = (
        f"DP-SGD step, GPT {config.depth}x{config.width}, {config.heads} heads, "
        f"T={config.seq_len}, B={shape.batch_size}, {str(shape.dtype).removeprefix('torch.')}"
    )
    has_opacus = importlib.util.find_spec("opacus") is not None
    if not has_opacus:
        logger.warning("opacus is not installed (the `bench` extra): its rows are skipped")
    steps = candidates(shape, device, opacus=has_opacus)
    # Opacus may refuse a dtype or run out of memory on the GPU shape (B x 124M per-example
    # gradients in hooks mode): drop it with the reason rather than lose the table.
    steps, failed = drop_failing(steps)
    for name, why in failed.items():
        logger.warning("skipping %s: %s", name, why)
    if "non-DP" not in steps:
        raise RuntimeError(f"the non-DP baseline failed: {failed['non-DP']}")
    logger.info("benchmarking %s", title)
    table = compare(
        steps,
        baseline="non-DP",
        title=title,
        device=device,
        warmup=2,
        repeat=repeat,
        check_outputs=False,
    )
    if out is not None:
        suffix = "" if device != "cuda" or gpu_shape == "gpt2" else f"_{gpu_shape}"
        table.save(out, f"bench_flashdp{suffix}")
    return table


def profile(
    device: str,
    out: str | Path,
    *,
    quick: bool = False,
    gpu_shape: str = "gpt2",
    steps: int = 3,
    rows: int = 25,
) -> dict[str, str]:
    """``torch.profiler`` tables of the top kernels (by self time on the device) of the non-DP
    and the flashdp per-layer step, after two warm-up steps; written to
    ``out/profile_<name>.txt`` and returned by name."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    shape = bench_shape(device, quick, gpu_shape)
    all_steps = candidates(shape, device, opacus=False)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    sort_by = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    tables = {}
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("non-DP", "flashdp per_layer"):
        step = all_steps[name]
        for _ in range(2):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
        with torch_profile(activities=activities) as prof:
            for _ in range(steps):
                step()
            if device == "cuda":
                torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by=sort_by, row_limit=rows)
        tables[name] = table
        slug = name.replace(" ", "_").replace("-", "").lower()
        (folder / f"profile_{slug}.txt").write_text(f"{name}, {steps} steps\n{table}\n")
    return tables


def distributed_candidates(shape: BenchShape, device: str) -> dict[str, Callable]:
    """One training step of the same GPT under DDP and FSDP2, non-private and flashdp, on this
    rank's share of one global batch (run under torchrun, the process group initialised)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    base = TinyGPT(shape.config).to(device=device, dtype=shape.dtype)
    generator = torch.Generator().manual_seed(1)
    size = (shape.batch_size, shape.config.seq_len)
    tokens = torch.randint(0, shape.config.vocab_size, size, generator=generator)
    targets = torch.randint(0, shape.config.vocab_size, size, generator=generator)
    tokens = tokens[rank::world].contiguous().to(device)
    targets = targets[rank::world].contiguous().to(device)
    loss_fn = SequenceCrossEntropy()
    ids = [torch.device(device).index] if torch.device(device).type == "cuda" else None

    def private(clipping: str) -> nn.Module:
        return make_private(
            copy.deepcopy(base),
            max_grad_norm=MAX_GRAD_NORM,
            noise_multiplier=NOISE_MULTIPLIER,
            clipping=clipping,
            expected_batch_size=shape.batch_size,  # the global batch
        )

    def sharded(model: nn.Module) -> nn.Module:
        for block in model.blocks:
            fully_shard(block)
        return fully_shard(model)

    def ddp(model: nn.Module) -> nn.Module:
        return DistributedDataParallel(model, device_ids=ids)

    opacus = {}
    if importlib.util.find_spec("opacus") is not None:
        for mode in ("hooks", "ghost"):
            opacus[f"Opacus DPDDP {'per_layer hooks' if mode == 'hooks' else mode}"] = _opacus_step(
                copy.deepcopy(base), tokens, targets, mode, distributed=True
            )
    return {
        "DDP non-DP": _sgd_step(ddp(copy.deepcopy(base)), loss_fn, tokens, targets),
        "DDP flashdp per_layer": _sgd_step(ddp(private("per_layer")), loss_fn, tokens, targets),
        "DDP flashdp flat": _sgd_step(ddp(private("flat")), loss_fn, tokens, targets),
        **opacus,
        "FSDP2 non-DP": _sgd_step(sharded(copy.deepcopy(base)), loss_fn, tokens, targets),
        "FSDP2 flashdp per_layer": _sgd_step(
            sharded(private("per_layer")), loss_fn, tokens, targets
        ),
    }


def run_distributed(
    device: str, out: str | Path | None, *, quick: bool = False, repeat: int = 5
) -> Comparison:
    """:func:`run` for several processes (call it on every rank under torchrun): DDP and
    FSDP2, each private against non-private, every rank timing the same interleaved rounds;
    rank 0 saves the table (its own times and memory; the collectives keep the ranks in step).
    """
    import torch.distributed as dist

    shape = GPU_SHAPE if device.startswith("cuda") else QUICK_SHAPE if quick else CPU_SHAPE
    config = shape.config
    world = dist.get_world_size()
    title = (
        f"DP-SGD step on {world} processes ({dist.get_backend()}), GPT {config.depth}x"
        f"{config.width}, {config.heads} heads, T={config.seq_len}, global B={shape.batch_size}, "
        f"{str(shape.dtype).removeprefix('torch.')}"
    )
    steps = distributed_candidates(shape, device)
    table = compare(
        steps,
        baseline="DDP non-DP",
        title=title,
        device=device,
        warmup=2,
        repeat=repeat,
        check_outputs=False,
    )
    if out is not None and dist.get_rank() == 0:
        table.save(out, "bench_flashdp_distributed")
    return table
