"""DiLoCo (and data-parallel) training on ``torch.distributed``.

Each process is one replica (M = world size). DiLoCo: every replica runs AdamW for H inner steps on
its own data shard; then the pseudo-gradient ``Δ = mean_m (θ_global − θ_m)`` is all-reduced, an
outer SGD step with Nesterov momentum updates ``θ_global`` and every replica restarts from it. The
inner AdamW states stay per replica. Data-parallel: gradients are all-reduced (averaged) every step
and one AdamW step is taken on identical replicas. Without an initialised process group the
trainer runs as a single replica (M = 1) with no communication. Buffers are not synchronised:
every ``inner_steps`` steps the replicas compare them and all raise if any differs.

``communicated_bytes`` counts the payload each replica hands to ``all_reduce`` (the size of the
flattened fp32 buffer); a ring all-reduce moves about ``2 (M − 1) / M`` times that per replica.

Example:
    >>> import torch
    >>> from scaling_laws import DiLoCoConfig, DiLoCoTrainer
    >>> model = torch.nn.Linear(4, 1)
    >>> def loss_fn(model, batch):
    ...     x, y = batch
    ...     return torch.nn.functional.mse_loss(model(x), y)
    >>> def batch_fn(step, rank, generator):
    ...     x = torch.randn(8, 4, generator=generator)
    ...     return x, x.sum(1, keepdim=True)
    >>> trainer = DiLoCoTrainer(
    ...     model, loss_fn, DiLoCoConfig(total_steps=20, inner_steps=5, inner_lr=1e-2)
    ... )
    >>> losses = trainer.fit(batch_fn)
    >>> trainer.step, trainer.outer_steps
    (20, 4)
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn

from kernels_common.cli import read_safetensors
from scaling_laws.diloco.checkpoint import (
    check_safetensors,
    merge_optimizer_state,
    read_json,
    split_optimizer_state,
    write_json,
)
from scaling_laws.diloco.config import DiLoCoConfig

__all__ = ["DiLoCoTrainer", "latest_checkpoint", "resumable_checkpoint", "verify_checkpoint"]

logger = logging.getLogger(__name__)

LossFn = Callable[[nn.Module, Any], torch.Tensor]
BatchFn = Callable[[int, int, torch.Generator], Any]
CHECKPOINT_FORMAT = 1


def _complete_checkpoints(directory: str | Path) -> list[Path]:
    """Every ``step_*`` folder with a ``meta.json`` (written last), most advanced first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    done = [
        p
        for p in directory.glob("step_*")
        if p.name[len("step_") :].isdigit() and (p / "meta.json").exists()
    ]
    return sorted(done, key=lambda p: int(p.name.split("_")[1]), reverse=True)


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The most advanced complete checkpoint (``step_*`` folder with ``meta.json``) or None."""
    done = _complete_checkpoints(directory)
    return done[0] if done else None


class _Mismatch(ValueError):
    """A checkpoint that is fine but belongs to another job (world size, config)."""


def verify_checkpoint(
    path: str | Path, *, config: DiLoCoConfig | None = None, world_size: int | None = None
) -> dict:
    """Check a checkpoint folder before loading it and return its ``meta.json``.

    Every replica's files and the global state must be present and readable (safetensors
    headers are parsed, tensors are not loaded) and, where given, its config and world size
    must match. Raises ``FileNotFoundError`` / ``ValueError`` naming the bad file.
    """
    path = Path(path)
    meta = read_json(path / "meta.json", ("format", "config", "world_size", "step", "outer_steps"))
    if meta["format"] != CHECKPOINT_FORMAT:
        raise ValueError(f"unknown checkpoint format {meta['format']!r} in {path}")
    if world_size is not None and meta["world_size"] != world_size:
        raise _Mismatch(
            f"checkpoint has {meta['world_size']} replicas, this job has {world_size} ({path})"
        )
    try:
        saved = DiLoCoConfig.from_dict(meta["config"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path / 'meta.json'} holds no valid DiLoCo config ({error})") from None
    if config is not None and saved != config:
        raise _Mismatch(f"checkpoint config differs from this trainer's config ({path})")
    if not isinstance(meta["world_size"], int) or meta["world_size"] < 1:
        raise ValueError(f"{path / 'meta.json'}: bad world_size {meta['world_size']!r}")
    for rank in range(meta["world_size"]):
        check_safetensors(path / f"rank{rank}.safetensors", ("rng.data", "rng.torch"))
        read_json(path / f"rank{rank}.json", ("inner", "step", "bytes"))
    if saved.algorithm == "diloco":
        check_safetensors(path / "global.safetensors")
        read_json(path / "global.json", ("outer",))
    return meta


def resumable_checkpoint(
    directory: str | Path, *, config: DiLoCoConfig | None = None, world_size: int | None = None
) -> Path | None:
    """The latest complete checkpoint in ``directory`` after :func:`verify_checkpoint`, or None
    when there is none.

    A latest checkpoint that fails the check is refused (``ValueError``), never skipped: the
    message names the bad file and the most advanced older checkpoint that passes, if any (delete
    the bad one to resume from it). One written by a job with another world size or config is
    refused as such.
    """
    done = _complete_checkpoints(directory)
    if not done:
        return None
    latest = done[0]
    try:
        verify_checkpoint(latest, config=config, world_size=world_size)
        return latest
    except _Mismatch:
        raise
    except (OSError, ValueError) as error:
        problem = str(error).strip()
    for older in done[1:]:
        try:
            verify_checkpoint(older, config=config, world_size=world_size)
        except (OSError, ValueError):
            continue
        raise ValueError(
            f"cannot resume from the latest checkpoint {latest}: {problem}; the older checkpoint "
            f"{older} is complete: delete {latest} to resume from it"
        )
    raise ValueError(
        f"cannot resume from the latest checkpoint {latest}: {problem}; no older checkpoint in "
        f"{directory} can be resumed from: delete it (or use another checkpoint folder) to "
        "start over"
    )


class DiLoCoTrainer:
    """One replica of a DiLoCo (or data-parallel) run.

    Args:
        model: any ``nn.Module``; its parameters are broadcast from rank 0 at construction so all
            replicas start identical.
        loss_fn: ``loss_fn(model, batch) -> scalar tensor`` (mean loss of this replica's batch).
        config: :class:`DiLoCoConfig`.
        group: process group (default: the world, when initialised).
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        config: DiLoCoConfig,
        *,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if not isinstance(config, DiLoCoConfig):
            raise TypeError(f"config must be a DiLoCoConfig, got {type(config).__name__}")
        self.model, self.loss_fn, self.config, self.group = model, loss_fn, config, group
        self.distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size(group) if self.distributed else 1
        self.rank = dist.get_rank(group) if self.distributed else 0
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        if self.distributed:
            for tensor in [*self.params, *model.buffers()]:
                dist.broadcast(tensor.data, src=dist.get_global_rank(group, 0) if group else 0)
        self.inner = torch.optim.AdamW(
            self.params,
            lr=config.inner_lr,
            betas=config.inner_betas,
            weight_decay=config.inner_weight_decay,
        )
        self.global_params: list[torch.Tensor] = []
        self.outer: torch.optim.SGD | None = None
        if config.algorithm == "diloco":
            self.global_params = [p.detach().clone() for p in self.params]
            self.outer = torch.optim.SGD(
                self.global_params,
                lr=config.outer_lr,
                momentum=config.outer_momentum,
                nesterov=config.nesterov,
            )
        self.generator = torch.Generator().manual_seed(config.seed + self.rank)
        self.step = 0
        self.outer_steps = 0
        self.communicated_bytes = 0

    # -- communication -------------------------------------------------------------------------
    def _average(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """All-reduce mean of a list of tensors through one flat buffer (counted in bytes)."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        if self.world_size > 1:
            dist.all_reduce(flat, group=self.group)
            flat /= self.world_size
            self.communicated_bytes += flat.numel() * flat.element_size()
        return list(flat.split([t.numel() for t in tensors]))

    def _check_buffers(self) -> None:
        """Raise on every replica at once when the model's buffers differ between replicas.

        Only parameters are synchronised; a buffer that the forward pass updates (BatchNorm's
        running statistics) would drift apart per replica without any error. One all-gather of
        an 8-byte sha256 prefix per buffer (not counted in ``communicated_bytes``); every replica
        sees the same gathered digests, so all raise together and none waits in a collective.
        """
        # looked up now, not at construction: a forward may replace a buffer (self.state = ...)
        buffers = list(self.model.named_buffers())
        if self.world_size == 1 or not buffers:
            return
        digests = []
        for _, buffer in buffers:
            raw = buffer.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy()
            digest = hashlib.sha256(raw.tobytes()).digest()[:8]
            digests.append(int.from_bytes(digest, "little", signed=True))
        local = torch.tensor(digests, dtype=torch.int64, device=self.params[0].device)
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(gathered, local, group=self.group)
        table = torch.stack(gathered).cpu()
        differ = [name for i, (name, _) in enumerate(buffers) if len(set(table[:, i].tolist())) > 1]
        if differ:
            raise RuntimeError(
                f"model buffers {differ} differ between the {self.world_size} replicas after "
                f"step {self.step}: {self.config.algorithm} synchronises parameters only, so "
                "state that the forward pass updates (e.g. BatchNorm running statistics) drifts "
                "apart per replica. Use layers without running state (LayerNorm, RMSNorm, "
                "GroupNorm, BatchNorm(track_running_stats=False)) and keep per-replica state, "
                "such as a recurrent state carried across batches, outside the model's buffers"
            )

    @torch.no_grad()
    def _outer_step(self) -> None:
        deltas = [g - p.detach() for g, p in zip(self.global_params, self.params, strict=True)]
        for g, delta in zip(self.global_params, self._average(deltas), strict=True):
            g.grad = delta.view_as(g)
        self.outer.step()
        for g, p in zip(self.global_params, self.params, strict=True):
            p.copy_(g)
            g.grad = None
        self.outer_steps += 1

    # -- training ------------------------------------------------------------------------------
    def train_step(self, batch: Any) -> float:
        """One inner step on this replica's ``batch`` (then the outer step when one is due).

        Returns this replica's loss before the update.
        """
        if self.step >= self.config.total_steps:
            raise RuntimeError(f"training already finished ({self.config.total_steps} steps)")
        lr = self.config.inner_lr_at(self.step)
        for group in self.inner.param_groups:
            group["lr"] = lr
        self.inner.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model, batch)
        if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
            raise TypeError("loss_fn must return a scalar tensor")
        loss.backward()
        if self.config.algorithm == "data_parallel":
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
            for p, grad in zip(self.params, self._average(grads), strict=True):
                p.grad = grad.view_as(p)
        if self.config.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(self.params, self.config.max_grad_norm)
        self.inner.step()
        self.step += 1
        if self.step % self.config.inner_steps == 0 or self.step == self.config.total_steps:
            if self.outer is not None:
                self._outer_step()
            self._check_buffers()
        return float(loss.detach())

    def fit(
        self,
        batch_fn: BatchFn,
        *,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int | None = None,
        resume: bool = True,
        callback: Callable[[DiLoCoTrainer, float], None] | None = None,
    ) -> list[float]:
        """Train to ``config.total_steps``.

        Args:
            batch_fn: ``batch_fn(step, rank, generator) -> batch``; draw all randomness from
                ``generator`` (checkpointed) or derive it from ``step`` so resumes are exact.
            checkpoint_dir: folder of ``step_XXXXXXXX`` checkpoints; with ``resume`` the latest
                complete one is loaded first (a corrupt one raises ``ValueError`` naming it and
                any older checkpoint it could resume from, see :func:`resumable_checkpoint`).
            checkpoint_every: inner steps between checkpoints (needs ``checkpoint_dir``).
            callback: called after every step with ``(trainer, loss)``.

        Returns:
            the losses of the steps run by this call.
        """
        if checkpoint_every is not None and (checkpoint_dir is None or checkpoint_every < 1):
            raise ValueError("checkpoint_every needs a checkpoint_dir and must be >= 1")
        if checkpoint_dir is not None and resume:
            latest = resumable_checkpoint(
                checkpoint_dir, config=self.config, world_size=self.world_size
            )
            if latest is not None:
                self.load(latest)
        losses = []
        while self.step < self.config.total_steps:
            losses.append(self.train_step(batch_fn(self.step, self.rank, self.generator)))
            if checkpoint_every and self.step % checkpoint_every == 0:
                self.save(Path(checkpoint_dir) / f"step_{self.step:08d}")
            if callback is not None:
                callback(self, losses[-1])
        return losses

    # -- checkpoints ---------------------------------------------------------------------------
    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self.group)

    def save(self, path: str | Path) -> Path:
        """Write a checkpoint folder (collective: every replica must call it).

        ``global.safetensors``: global parameters and outer optimizer state (rank 0);
        ``rank{r}.safetensors`` / ``.json``: the replica's model state, inner AdamW state, data
        generator and torch RNG state; ``meta.json`` (written last, marks it complete): config,
        world size, step counters, communicated bytes.
        """
        path = Path(path)
        staging = path.with_name(path.name + ".partial")
        if self.rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
        self._barrier()
        tensors = {
            f"model.{k}": v.detach().contiguous().cpu() for k, v in self.model.state_dict().items()
        }
        inner_tensors, inner_json = split_optimizer_state(self.inner, "inner")
        tensors.update(inner_tensors)
        tensors["rng.data"] = self.generator.get_state()
        tensors["rng.torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            tensors["rng.cuda"] = torch.cuda.get_rng_state()
        save_file(tensors, staging / f"rank{self.rank}.safetensors")
        write_json(
            staging / f"rank{self.rank}.json",
            {"inner": inner_json, "step": self.step, "bytes": self.communicated_bytes},
        )
        if self.rank == 0 and self.outer is not None:
            outer_tensors, outer_json = split_optimizer_state(self.outer, "outer")
            outer_tensors.update(
                {
                    f"global.{i}": g.detach().contiguous().cpu()
                    for i, g in enumerate(self.global_params)
                }
            )
            save_file(outer_tensors, staging / "global.safetensors")
            write_json(staging / "global.json", {"outer": outer_json})
        self._barrier()
        if self.rank == 0:
            meta = {
                "format": CHECKPOINT_FORMAT,
                "config": self.config.to_dict(),
                "world_size": self.world_size,
                "step": self.step,
                "outer_steps": self.outer_steps,
            }
            write_json(staging / "meta.json", meta)
            shutil.rmtree(path, ignore_errors=True)
            staging.rename(path)
        self._barrier()
        logger.info("checkpoint %s (step %d)", path, self.step)
        return path

    def load(self, path: str | Path) -> None:
        """Restore a checkpoint written by :meth:`save` with the same world size and config."""
        path = Path(path)
        meta = verify_checkpoint(path, config=self.config, world_size=self.world_size)
        tensors = read_safetensors(path / f"rank{self.rank}.safetensors", "checkpoint file")
        extra = read_json(path / f"rank{self.rank}.json", ("inner", "step", "bytes"))
        self.model.load_state_dict(
            {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
        )
        merge_optimizer_state(self.inner, tensors, extra["inner"], "inner")
        self.generator.set_state(tensors["rng.data"])
        torch.set_rng_state(tensors["rng.torch"])
        if "rng.cuda" in tensors:
            torch.cuda.set_rng_state(tensors["rng.cuda"])
        self.step, self.outer_steps = extra["step"], meta["outer_steps"]
        self.communicated_bytes = extra["bytes"]
        if self.outer is not None:
            outer = read_safetensors(path / "global.safetensors", "checkpoint file")
            with torch.no_grad():
                for i, g in enumerate(self.global_params):
                    g.copy_(outer[f"global.{i}"])
            merge_optimizer_state(
                self.outer, outer, read_json(path / "global.json")["outer"], "outer"
            )
        logger.info("resumed from %s at step %d", path, self.step)
