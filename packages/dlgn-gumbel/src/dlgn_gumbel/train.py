"""Training loop with periodic evaluation, a wall-clock budget, safetensors checkpoints and resume.

Every step is reproducible from ``(seed, step)`` alone (its mini-batch and its Gumbel noise), so a
resumed run continues exactly as the uninterrupted one would have.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from dlgn_gumbel.layers import LogicNet, LogicNetConfig, ThermometerEncoder
from dlgn_gumbel.metrics import accuracy

__all__ = ["TrainConfig", "TrainResult", "load_checkpoint", "train"]

logger = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.safetensors"
_RUN_LENGTH_KEYS = ("steps", "time_budget_s")
STATE = "checkpoint.json"


@dataclass(frozen=True)
class TrainConfig:
    """What to train and for how long.

    Attributes:
        layer_sizes: widths of the logic layers (the last divisible by the number of classes).
        num_thresholds: thermometer thresholds per pixel (evenly spaced in (0, 1)).
        tau: GroupSum temperature; relaxation, gumbel_tau, grad_factor, connections: see
            :class:`~dlgn_gumbel.LogicLayer`.
        lr: Adam learning rate; batch_size: mini-batch size. Defaults follow the paper's code
            (shakiryousefi/gumbel-lgn): lr 0.01, batch 128, gumbel_tau 1, grad_factor 1,
            ``"unique"`` connections.
        steps: maximum number of steps; time_budget_s: stop once this much training time (not
            counting evaluation) has passed, if set.
        eval_every: evaluate training-mode and discretized accuracy every this many steps.
        seed: seeds the network, the batches and the Gumbel noise.
        clock: ``"wall"`` (``time.perf_counter``) or ``"process"`` (this process's CPU time,
            ``time.process_time``): the fair clock for comparing runs on a shared machine when
            torch uses one thread.
    """

    layer_sizes: tuple[int, ...] = (8000,) * 4
    num_thresholds: int = 3
    tau: float = 10.0
    relaxation: str = "gumbel"
    gumbel_tau: float = 1.0
    grad_factor: float = 1.0
    connections: str = "unique"
    lr: float = 0.01
    batch_size: int = 128
    steps: int = 2000
    time_budget_s: float | None = None
    eval_every: int = 200
    seed: int = 0
    clock: str = "wall"

    def __post_init__(self) -> None:
        if self.clock not in ("wall", "process"):
            raise ValueError(f"clock must be 'wall' or 'process', got {self.clock!r}")
        object.__setattr__(self, "layer_sizes", tuple(int(s) for s in self.layer_sizes))
        for name in ("num_thresholds", "batch_size", "steps", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ValueError(f"time_budget_s must be > 0 or None, got {self.time_budget_s}")

    def net_config(self, in_dim: int, num_classes: int) -> LogicNetConfig:
        return LogicNetConfig(
            in_dim * self.num_thresholds,
            self.layer_sizes,
            num_classes,
            self.tau,
            self.connections,  # type: ignore[arg-type]
            self.relaxation,  # type: ignore[arg-type]
            self.gumbel_tau,
            self.grad_factor,
            self.seed,
        )


@dataclass
class TrainResult:
    """The trained network, its encoder, and the evaluation history.

    ``history`` rows: ``step``, ``train_time_s`` (training only), ``loss`` (mean since the last
    row), ``train_mode_acc`` and ``discrete_acc`` on the evaluation set.
    """

    net: LogicNet
    encoder: ThermometerEncoder
    history: list[dict[str, float]] = field(default_factory=list)
    steps: int = 0
    train_time_s: float = 0.0


def _batch_indices(n: int, batch_size: int, step: int, seed: int) -> torch.Tensor:
    """Mini-batch of ``step``: a slice of epoch ``e``'s permutation, seeded by ``(seed, e)``."""
    per_epoch = max(n // batch_size, 1)
    epoch, position = divmod(step, per_epoch)
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)[position * batch_size : (position + 1) * batch_size]


def _save(directory: Path, net: LogicNet, optim: torch.optim.Optimizer, meta: dict) -> None:
    """Write the tensors, then the JSON state, each through a temporary file and an atomic
    rename; both carry the step count, so a run killed between the two renames is detected on
    load instead of resuming from mismatched halves."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.contiguous() for k, v in net.state_dict().items()}
    state = optim.state_dict()
    for pid, slots in state["state"].items():
        for name, value in slots.items():
            tensors[f"optim.{pid}.{name}"] = torch.as_tensor(value).contiguous()
    partial = directory / f"{CHECKPOINT}.partial"
    save_file(tensors, str(partial), metadata={"steps": str(meta["steps"])})
    os.replace(partial, directory / CHECKPOINT)
    meta = {**meta, "param_groups": state["param_groups"]}
    partial = directory / f"{STATE}.partial"
    partial.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(partial, directory / STATE)


def _read_checkpoint(directory: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The JSON state and the tensors of a checkpoint, checked to belong to the same step."""
    for name in (STATE, CHECKPOINT):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory / name} not found (expected a `train` --out dir)")
    meta = json.loads((directory / STATE).read_text())
    with safe_open(str(directory / CHECKPOINT), framework="pt") as f:
        saved_steps = (f.metadata() or {}).get("steps")
    if saved_steps != str(meta.get("steps")):
        raise ValueError(
            f"{directory}: {CHECKPOINT} (step {saved_steps}) and {STATE} (step "
            f"{meta.get('steps')}) are from different steps; the run was interrupted while "
            "saving, so neither can be resumed safely"
        )
    return meta, load_file(str(directory / CHECKPOINT))


def _load(directory: Path, net: LogicNet, optim: torch.optim.Optimizer) -> dict[str, Any]:
    meta, tensors = _read_checkpoint(directory)
    net.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, pid, name = key.split(".", 2)
            state.setdefault(int(pid), {})[name] = value
    optim.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return meta


def train(
    config: TrainConfig,
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_eval: torch.Tensor,
    y_eval: torch.Tensor,
    *,
    num_classes: int,
    out_dir: str | Path | None = None,
    resume: bool = False,
    backend: str | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train a :class:`~dlgn_gumbel.LogicNet` on thermometer-encoded ``x_train``.

    Args:
        config: the run.
        x_train, x_eval: ``(N, F)`` float pixels in ``[0, 1]``; y_train, y_eval: ``(N,)`` labels.
        num_classes: number of classes.
        out_dir: where to write ``checkpoint.safetensors`` + ``checkpoint.json`` at every
            evaluation and at the end.
        resume: continue from the checkpoint in ``out_dir``; its config must equal ``config``
            except for ``steps`` and ``time_budget_s``.
        backend: logic-layer backend (``None`` = automatic).
        progress: show a tqdm bar.
    """
    if x_train.dim() != 2 or x_train.shape[0] != y_train.shape[0] or x_train.shape[0] == 0:
        raise ValueError(
            f"x_train (N, F) and y_train (N,) must be non-empty and agree: {x_train.shape}, "
            f"{y_train.shape}"
        )
    encoder = ThermometerEncoder.uniform(config.num_thresholds)
    net = LogicNet.from_config(config.net_config(x_train.shape[1], num_classes), backend=backend)
    optim = torch.optim.Adam(net.parameters(), lr=config.lr)
    result = TrainResult(net, encoder)
    directory = Path(out_dir) if out_dir is not None else None
    if resume:
        if directory is None or not (directory / STATE).is_file():
            raise FileNotFoundError(f"resume: no {STATE} in {directory}")
        meta = _load(directory, net, optim)
        saved, wanted = meta["config"], json.loads(json.dumps(asdict(config)))
        for key in _RUN_LENGTH_KEYS:  # a resumed run may be extended
            saved.pop(key, None)
            wanted.pop(key, None)
        if saved != wanted:
            raise ValueError(f"resume: the checkpoint's config {saved} differs from {wanted}")
        result.steps, result.train_time_s = meta["steps"], meta["train_time_s"]
        result.history = meta["history"]
        logger.info("resumed from %s at step %d", directory, result.steps)

    x_eval_bits = encoder(x_eval)
    clock = time.process_time if config.clock == "process" else time.perf_counter
    loss_sum, loss_count = 0.0, 0
    bar = tqdm(
        total=config.steps if config.time_budget_s is None else None,
        initial=result.steps,
        disable=not progress,
        desc=config.relaxation,
    )

    def checkpoint() -> None:
        if directory is not None:
            meta = {
                "config": asdict(config),
                "net_config": net.config.to_dict(),
                "steps": result.steps,
                "train_time_s": result.train_time_s,
                "history": result.history,
            }
            _save(directory, net, optim, meta)

    def evaluate() -> None:
        nonlocal loss_sum, loss_count
        torch.manual_seed(config.seed * 7_919 - result.steps)  # evaluation's Gumbel noise
        row = {
            "step": result.steps,
            "train_time_s": result.train_time_s,
            "loss": loss_sum / max(loss_count, 1),
            # one Gumbel sample per evaluation batch of the training batch size, as in the paper's
            # code (its training-mode test accuracy is measured batch by batch)
            "train_mode_acc": accuracy(
                net, x_eval_bits, y_eval, train_mode=True, batch_size=config.batch_size
            ),
            "discrete_acc": accuracy(net, x_eval_bits, y_eval, train_mode=False),
        }
        result.history.append(row)
        loss_sum, loss_count = 0.0, 0
        bar.set_postfix(loss=f"{row['loss']:.3f}", disc=f"{row['discrete_acc']:.3f}")
        logger.info("step %d: %s", result.steps, row)

    while result.steps < config.steps:
        if config.time_budget_s is not None and result.train_time_s >= config.time_budget_s:
            break
        start = clock()
        net.train()
        idx = _batch_indices(x_train.shape[0], config.batch_size, result.steps, config.seed)
        torch.manual_seed(config.seed * 7_919 + result.steps)  # this step's Gumbel noise
        loss = torch.nn.functional.cross_entropy(net(encoder(x_train[idx])), y_train[idx])
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        result.train_time_s += clock() - start
        result.steps += 1
        loss_sum, loss_count = loss_sum + loss.item(), loss_count + 1
        bar.update(1)
        if result.steps % config.eval_every == 0 or result.steps == config.steps:
            evaluate()
            checkpoint()
    if not result.history or result.history[-1]["step"] != result.steps:
        evaluate()  # stopped by the time budget between evaluations
    bar.close()
    checkpoint()
    net.eval()
    return result


def load_checkpoint(
    directory: str | Path, *, backend: str | None = None
) -> tuple[LogicNet, TrainConfig]:
    """The network (eval mode) and training config saved by :func:`train` in ``directory``."""
    meta, tensors = _read_checkpoint(Path(directory))
    config = TrainConfig(**meta["config"])
    net = LogicNet.from_config(LogicNetConfig(**meta["net_config"]), backend=backend)
    net.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    return net.eval(), config
