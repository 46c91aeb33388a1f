"""Training loop with periodic evaluation, a wall-clock budget, safetensors checkpoints and resume.

Every step is reproducible from ``(seed, step)`` alone (its mini-batch and its Gumbel noise), so a
resumed run continues exactly as the uninterrupted one would have.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from dlgn_gumbel.choices import LAYOUTS
from dlgn_gumbel.layers import LogicNet, LogicNetConfig, ThermometerEncoder
from dlgn_gumbel.metrics import accuracy
from kernels_common import cli

__all__ = ["TrainConfig", "TrainResult", "check_checkpoint", "load_checkpoint", "train"]

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
        thermometer_layout: ``"feature"`` (a pixel's bits side by side) or ``"threshold"`` (one
            image per threshold, the paper's code); see :class:`~dlgn_gumbel.ThermometerEncoder`.
        tau: GroupSum temperature; relaxation, gumbel_tau, grad_factor, connections, init,
            init_sigma, noise: see :class:`~dlgn_gumbel.LogicLayer`.
        lr: Adam learning rate; batch_size: mini-batch size. lr 0.01, gumbel_tau 1 and
            grad_factor 1 are the paper's code's (shakiryousefi/gumbel-lgn); batch 128 is
            difflogic's (the paper's configurations use 64); ``"unique"`` connections (the
            paper's code uses difflogic's construction, ``"difflogic"``).
        steps: maximum number of steps; time_budget_s: stop once this much training time (not
            counting evaluation) has passed, if set.
        eval_every: evaluate training-mode and discretized accuracy every this many steps.
        seed: seeds the network, the batches and the Gumbel noise.
        clock: ``"wall"`` (``time.perf_counter``; on a GPU each step is timed to its end) or
            ``"process"`` (this process's CPU time, ``time.process_time``): the fair clock for
            comparing CPU runs on a shared machine when torch uses one thread.
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
    init: str = "randn"
    init_sigma: float = 5.0
    noise: str = "shared"
    thermometer_layout: str = "feature"

    def __post_init__(self) -> None:
        if self.clock not in ("wall", "process"):
            raise ValueError(f"clock must be 'wall' or 'process', got {self.clock!r}")
        if self.thermometer_layout not in LAYOUTS:
            raise ValueError(
                f"thermometer_layout must be one of {LAYOUTS}, got {self.thermometer_layout!r}"
            )
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
            self.init,  # type: ignore[arg-type]
            self.init_sigma,
            self.noise,  # type: ignore[arg-type]
        )

    def encoder(self) -> ThermometerEncoder:
        """The thermometer code of the inputs."""
        return ThermometerEncoder.uniform(
            self.num_thresholds,
            layout=self.thermometer_layout,  # type: ignore[arg-type]
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


def batch_indices(n: int, batch_size: int, step: int, seed: int) -> torch.Tensor:
    """Mini-batch of ``step``: a slice of epoch ``e``'s permutation, seeded by ``(seed, e)``."""
    per_epoch = max(n // batch_size, 1)
    epoch, position = divmod(step, per_epoch)
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)[position * batch_size : (position + 1) * batch_size]


def _save(directory: Path, net: LogicNet, optim: torch.optim.Optimizer, meta: dict) -> None:
    """Write the tensors and the JSON state into a temporary folder, then rename each into
    ``directory`` (created only then, so a run that fails before its first checkpoint leaves no
    folder); both carry the step count, so a run killed between the two renames is detected on
    load instead of resuming from mismatched halves."""
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
    state = optim.state_dict()
    for pid, slots in state["state"].items():
        for name, value in slots.items():
            tensors[f"optim.{pid}.{name}"] = torch.as_tensor(value).cpu().contiguous()
    meta = {**meta, "param_groups": state["param_groups"]}
    try:
        with cli.atomic_folder(directory) as staging:
            save_file(tensors, str(staging / CHECKPOINT), metadata={"steps": str(meta["steps"])})
            (staging / STATE).write_text(json.dumps(meta, indent=2) + "\n")
    except OSError as error:  # name the checkpoint folder, not the temporary one
        raise OSError(
            error.errno, f"cannot save a checkpoint ({error.strerror or error})", str(directory)
        ) from error


_STATE_KEYS = {
    "config": dict,
    "net_config": dict,
    "steps": int,
    "train_time_s": (int, float),
    "history": list,
    "param_groups": list,
}


def check_checkpoint(directory: str | Path) -> dict[str, Any]:
    """The JSON state of the checkpoint in ``directory``, checked without loading the tensors.

    Raises:
        FileNotFoundError: the folder or one of its two files is missing.
        ValueError: a file is truncated, not of its format, or the two are from different steps
            (each message names the file).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {directory}")
    for name in (STATE, CHECKPOINT):
        if not (directory / name).is_file():
            raise FileNotFoundError(
                f"{directory / name} not found (expected a folder written by `dlgn-gumbel train`)"
            )
    state_path, tensors_path = directory / STATE, directory / CHECKPOINT
    meta = cli.read_json(state_path, "dlgn-gumbel checkpoint state")
    if not isinstance(meta, dict):
        raise ValueError(f"{state_path} is not a dlgn-gumbel checkpoint state (not a JSON object)")
    for key, kind in _STATE_KEYS.items():
        if not isinstance(meta.get(key), kind):
            raise ValueError(
                f"{state_path} is not a dlgn-gumbel checkpoint state ({key!r} missing or wrong)"
            )
    for key, build in (("config", TrainConfig), ("net_config", LogicNetConfig)):
        try:
            build(**meta[key])
        except (TypeError, ValueError) as error:
            raise ValueError(f"{state_path}: invalid {key!r}: {error}") from None
    try:
        with safe_open(str(tensors_path), framework="pt") as f:
            saved_steps = (f.metadata() or {}).get("steps")
    except SafetensorError as error:
        raise ValueError(
            f"{tensors_path} is not a readable checkpoint (truncated or not safetensors: {error})"
        ) from None
    if saved_steps is None:
        raise ValueError(f"{tensors_path} records no step (not written by `dlgn-gumbel train`)")
    if saved_steps != str(meta["steps"]):
        raise ValueError(
            f"{directory}: {CHECKPOINT} (step {saved_steps}) and {STATE} (step "
            f"{meta['steps']}) are from different steps; the run was interrupted while "
            "saving, so neither can be resumed safely"
        )
    return meta


def _read_checkpoint(directory: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The JSON state and the tensors of a checkpoint, checked to belong to the same step."""
    meta = check_checkpoint(directory)
    return meta, cli.read_safetensors(directory / CHECKPOINT, "checkpoint")


def _load_model(net: LogicNet, tensors: dict[str, torch.Tensor], path: Path) -> None:
    try:
        net.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    except RuntimeError as error:  # missing keys or wrong shapes: not this network's tensors
        raise ValueError(f"{path} does not match its checkpoint.json: {error}") from None


def check_resumable(meta: dict[str, Any], config: TrainConfig, directory: str | Path) -> None:
    """Refuse to resume a checkpoint whose config differs from ``config`` in more than the
    run length (``steps``, ``time_budget_s``)."""
    # the saved config through TrainConfig: a checkpoint from before a field existed holds its
    # default
    saved = json.loads(json.dumps(asdict(TrainConfig(**meta["config"]))))
    wanted = json.loads(json.dumps(asdict(config)))
    for key in _RUN_LENGTH_KEYS:  # a resumed run may be extended
        saved.pop(key, None)
        wanted.pop(key, None)
    if saved != wanted:
        changed = ", ".join(
            f"{key}={saved.get(key)!r} (now {wanted.get(key)!r})"
            for key in sorted(set(saved) | set(wanted))
            if saved.get(key) != wanted.get(key)
        )
        raise ValueError(
            f"resume: the config of the checkpoint in {directory} differs: it was trained with "
            f"{changed}"
        )


def _load(directory: Path, net: LogicNet, optim: torch.optim.Optimizer) -> dict[str, Any]:
    meta, tensors = _read_checkpoint(directory)
    _load_model(net, tensors, directory / CHECKPOINT)
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, pid, name = key.split(".", 2)
            state.setdefault(int(pid), {})[name] = value
    try:
        optim.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    except (KeyError, RuntimeError, ValueError) as error:
        raise ValueError(
            f"{directory}: the optimizer state does not match the network: {error}"
        ) from None
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
    device: str | torch.device = "cpu",
) -> TrainResult:
    """Train a :class:`~dlgn_gumbel.LogicNet` on thermometer-encoded ``x_train``.

    Args:
        config: the run.
        x_train: ``(N, F)`` float training pixels in ``[0, 1]``.
        y_train: ``(N,)`` training labels.
        x_eval: ``(N, F)`` float evaluation pixels in ``[0, 1]``.
        y_eval: ``(N,)`` evaluation labels.
        num_classes: number of classes.
        out_dir: where to write ``checkpoint.safetensors`` + ``checkpoint.json`` at every
            evaluation and at the end.
        resume: continue from the checkpoint in ``out_dir``; its config must equal ``config``
            except for ``steps`` and ``time_budget_s``.
        backend: logic-layer backend (``None`` = automatic).
        progress: show a tqdm bar.
        device: where the network trains; the data stay where they are and each batch is moved
            (``"cuda"`` with ``backend=None`` runs the Triton kernel).
    """
    if x_train.dim() != 2 or x_train.shape[0] != y_train.shape[0] or x_train.shape[0] == 0:
        raise ValueError(
            f"x_train (N, F) and y_train (N,) must be non-empty and agree: {x_train.shape}, "
            f"{y_train.shape}"
        )
    device = torch.device(device)
    encoder = config.encoder().to(device)
    net = LogicNet.from_config(config.net_config(x_train.shape[1], num_classes), backend=backend)
    net.to(device)
    optim = torch.optim.Adam(net.parameters(), lr=config.lr)
    result = TrainResult(net, encoder)
    directory = Path(out_dir) if out_dir is not None else None
    if resume:
        if directory is None:
            raise ValueError("resume=True needs out_dir, the folder of the checkpoint")
        check_resumable(check_checkpoint(directory), config, directory)
        meta = _load(directory, net, optim)
        saved_net = LogicNetConfig(**meta["net_config"]).to_dict()
        if saved_net != net.config.to_dict():  # e.g. another GroupSum k: no tensor shows it
            raise ValueError(
                f"resume: the network in {directory} was {saved_net}, this run builds "
                f"{net.config.to_dict()}"
            )
        result.steps, result.train_time_s = meta["steps"], meta["train_time_s"]
        result.history = meta["history"]
        logger.info("resumed from %s at step %d", directory, result.steps)

    x_eval_bits = encoder(x_eval.to(device))
    clock = time.process_time if config.clock == "process" else time.perf_counter
    if device.type == "cuda":
        if config.clock == "process":
            raise ValueError("clock='process' counts CPU time only; time a GPU run with 'wall'")

        def synchronize() -> None:
            torch.cuda.synchronize(device)
    else:

        def synchronize() -> None:
            pass

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

    try:  # the bar ends its line even when a step or a save fails
        while result.steps < config.steps:
            if config.time_budget_s is not None and result.train_time_s >= config.time_budget_s:
                break
            synchronize()
            start = clock()
            net.train()
            idx = batch_indices(x_train.shape[0], config.batch_size, result.steps, config.seed)
            torch.manual_seed(config.seed * 7_919 + result.steps)  # this step's Gumbel noise
            x_batch, y_batch = x_train[idx].to(device), y_train[idx].to(device)
            loss = torch.nn.functional.cross_entropy(net(encoder(x_batch)), y_batch)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            synchronize()  # a GPU step is timed to its end, not to its last launch
            result.train_time_s += clock() - start
            result.steps += 1
            loss_sum, loss_count = loss_sum + loss.item(), loss_count + 1
            bar.update(1)
            if result.steps % config.eval_every == 0 or result.steps == config.steps:
                evaluate()
                checkpoint()
        if not result.history or result.history[-1]["step"] != result.steps:
            evaluate()  # stopped by the time budget between evaluations
    finally:
        bar.close()
    checkpoint()
    net.eval()
    return result


def load_checkpoint(
    directory: str | Path, *, backend: str | None = None
) -> tuple[LogicNet, TrainConfig]:
    """The network (eval mode) and training config saved by :func:`train` in ``directory``."""
    directory = Path(directory)
    meta, tensors = _read_checkpoint(directory)
    config = TrainConfig(**meta["config"])
    net = LogicNet.from_config(LogicNetConfig(**meta["net_config"]), backend=backend)
    _load_model(net, tensors, directory / CHECKPOINT)
    return net.eval(), config
