"""Training the learning-curve PFN on the prior, and transferring it to real curves with mixup.

`train_pfn` fits a `LearningCurvePFN` to fresh prior batches (`sample_training_batch`) by the
negative log density of the bar distribution, with Adam, linear warm-up and cosine decay, and
gradient clipping. It is deterministic on CPU for a given seed (batches come from a seeded
torch.Generator, the initial weights from a forked, seeded global RNG).

`finetune_pfn` is the CFBO authors' transfer step (`train.py` with `HPODataset`) adapted to a
prior-trained model. Their recipe, per step:

1. *meta mixup* (`meta_mixup=1`): pair every task (dataset) with a random other one and mix their
   curves config by config, y ← λ·y + (1 − λ)·y_other, λ ~ Beta(1, 1) per task (the start value
   y₀ too); configurations stay (all their tasks share one grid of configurations);
2. *hyperparameter mixup* (`hparam_mixup=1`): pair every configuration with a random other one
   and mix both the configuration and its curve, λ ~ Beta(1, 1) per configuration;
3. train on 4 mixed tasks per step (context of 0..300 random (config, epoch) points, 2048
   random targets), plus 0.1 × the same loss on single curves cut into prefix and rest; AdamW
   (weight decay 0), lr 2e-5, 100k steps, warm-up over the first quarter then cosine decay,
   gradient norm clipped at 1, a 12-layer d=512 model from scratch, dropout 0.2, 1000 bars with
   borders at quantiles of mixed values.

Here: the same two mixups with λ ~ Beta(a, a) (a = `mixup_alpha`, 1 by default). Tables may
have different configurations; a meta-mixup partner then contributes the curves of randomly
paired rows (the authors' tables share the grid, so they pair rows by index, which we do when the
row counts match). Mixed tables are cut into context and queries exactly like prior tasks
(`cut_tasks`: observed prefixes, as a freeze-thaw run sees them), starting from the prior-trained
weights, for a few hundred steps: the small model and the CPU budget rule out the authors' long
from-scratch run. The start value of real tables is unknown to the model.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from freeze_thaw_bo.pfn.batch import CurveBatch, cut_tasks
from freeze_thaw_bo.pfn.model import LearningCurvePFN, PFNConfig
from freeze_thaw_bo.pfn.prior import CurvePriorConfig, log_uniform_int, sample_training_batch

__all__ = [
    "DEFAULT_PFN_CONFIG",
    "DEFAULT_TRAIN_CONFIG",
    "FinetuneConfig",
    "TrainConfig",
    "evaluate_nll",
    "finetune_pfn",
    "mixup_tables",
    "prior_batches",
    "train_default_pfn",
    "train_pfn",
]

logger = logging.getLogger(__name__)

_EVAL_SEED_OFFSET = 1_000_003  # held-out prior batches never share a stream with training


@dataclass(frozen=True)
class TrainConfig:
    """How `train_pfn` fits a model to the prior.

    Attributes:
        steps: optimizer steps (one fresh prior batch each).
        batch_size: tasks per batch.
        num_queries: most query tokens per task.
        lr: peak learning rate of Adam.
        warmup_fraction: share of steps with a linear warm-up, then cosine decay to 0.
        max_grad_norm: gradient-norm clipping threshold.
        seed: seeds the prior batches and the initial weights.
        log_every: steps between log lines.
    """

    steps: int = 4000
    batch_size: int = 8
    num_queries: int = 128
    lr: float = 2e-3
    warmup_fraction: float = 0.05
    max_grad_norm: float = 1.0
    seed: int = 0
    log_every: int = 100

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "num_queries", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0 or not self.max_grad_norm > 0:
            raise ValueError(
                f"lr and max_grad_norm must be > 0, got {self.lr}, {self.max_grad_norm}"
            )
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ValueError(f"warmup_fraction must lie in [0, 1), got {self.warmup_fraction}")


@dataclass(frozen=True)
class FinetuneConfig:
    """How `finetune_pfn` transfers a model to real curve tables.

    Attributes:
        steps, batch_size, num_queries, lr, warmup_fraction, max_grad_norm, seed, log_every:
            as in `TrainConfig`.
        mixup_alpha: λ ~ Beta(mixup_alpha, mixup_alpha) in both mixups (the authors' 1).
        meta_mixup: mix curves across tables (needs 2+ tables to do anything).
        hparam_mixup: mix configurations and their curves within a table.
        max_configs: most configurations per task drawn from a table.
    """

    steps: int = 300
    batch_size: int = 8
    num_queries: int = 128
    lr: float = 2e-4
    warmup_fraction: float = 0.1
    max_grad_norm: float = 1.0
    seed: int = 0
    log_every: int = 50
    mixup_alpha: float = 1.0
    meta_mixup: bool = True
    hparam_mixup: bool = True
    max_configs: int = 100

    def __post_init__(self) -> None:
        TrainConfig(
            steps=self.steps,
            batch_size=self.batch_size,
            num_queries=self.num_queries,
            lr=self.lr,
            warmup_fraction=self.warmup_fraction,
            max_grad_norm=self.max_grad_norm,
            log_every=self.log_every,
        )
        if not self.mixup_alpha > 0:
            raise ValueError(f"mixup_alpha must be > 0, got {self.mixup_alpha}")
        if self.max_configs < 1:
            raise ValueError(f"max_configs must be >= 1, got {self.max_configs}")


DEFAULT_PFN_CONFIG = PFNConfig()
DEFAULT_TRAIN_CONFIG = TrainConfig()


def _prior_config(config: PFNConfig) -> CurvePriorConfig:
    return CurvePriorConfig(max_dim_x=config.max_dim_x, max_horizon=config.max_horizon)


def prior_batches(
    config: PFNConfig, num_batches: int, *, seed: int, batch_size: int = 8, num_queries: int = 128
) -> list[CurveBatch]:
    """`num_batches` prior batches shaped for `config`, from their own seeded stream."""
    generator = torch.Generator().manual_seed(seed)
    return [
        sample_training_batch(
            batch_size,
            generator,
            max_context=config.max_context,
            num_queries=num_queries,
            config=_prior_config(config),
        )
        for _ in range(num_batches)
    ]


@torch.no_grad()
def evaluate_nll(model: LearningCurvePFN, batches: Sequence[CurveBatch]) -> float:
    """Mean negative log density over every query of `batches` (lower is better)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        total += float(model.nll(batch)) * batch.y_query.numel()
        count += batch.y_query.numel()
    model.train(was_training)
    return total / count


def _fit(
    model: LearningCurvePFN,
    draw_batch: Callable[[], CurveBatch],
    settings: TrainConfig | FinetuneConfig,
    description: str,
    progress: bool,
) -> None:
    """Adam with linear warm-up and cosine decay on `draw_batch()` batches, in place."""
    steps = settings.steps
    warmup = max(1, round(settings.warmup_fraction * steps))
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1.0 + math.cos(math.pi * s / steps)),
    )
    model.train()
    running, started = 0.0, time.perf_counter()
    bar = tqdm(
        range(1, steps + 1), desc=description, disable=None if progress else True, mininterval=10.0
    )
    for step in bar:
        loss = model.nll(draw_batch())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
        optimizer.step()
        schedule.step()
        running += float(loss.detach())
        if step % settings.log_every == 0 or step == steps:
            count = (
                settings.log_every if step % settings.log_every == 0 else step % settings.log_every
            )
            logger.info(
                "%s step %d/%d: nll %.4f (%.0f s)",
                description,
                step,
                steps,
                running / count,
                time.perf_counter() - started,
            )
            bar.set_postfix(nll=f"{running / count:.3f}", refresh=False)
            running = 0.0
    model.eval()


def train_pfn(
    config: PFNConfig, training: TrainConfig | None = None, *, progress: bool = True
) -> LearningCurvePFN:
    """A `LearningCurvePFN` with architecture `config` trained on the FT-PFN-style prior.

    Example:
        >>> from freeze_thaw_bo.pfn.model import PFNConfig
        >>> model = train_pfn(
        ...     PFNConfig(d_model=16, num_layers=1, num_bars=32, max_context=20),
        ...     TrainConfig(steps=2, batch_size=2, num_queries=8),
        ...     progress=False,
        ... )
    """
    training = training or TrainConfig()
    generator = torch.Generator().manual_seed(training.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(training.seed)
        model = LearningCurvePFN(config)
    prior = _prior_config(config)

    def draw() -> CurveBatch:
        return sample_training_batch(
            training.batch_size,
            generator,
            max_context=config.max_context,
            num_queries=training.num_queries,
            config=prior,
        )

    _fit(model, draw, training, "prior", progress)
    return model


def _as_tables(
    tables: Sequence[tuple[np.ndarray | torch.Tensor, np.ndarray | torch.Tensor]],
    config: PFNConfig,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Validated float32 (x (N, D), values (N, T)) tables with one D and one T."""
    if len(tables) == 0:
        raise ValueError("need at least one curve table")
    out = []
    for i, table in enumerate(tables):
        if len(table) != 2:
            raise ValueError(f"table {i} must be a pair (x (N, D), values (N, T))")
        x = torch.as_tensor(np.asarray(table[0], dtype=np.float32))
        values = torch.as_tensor(np.asarray(table[1], dtype=np.float32))
        if x.ndim != 2 or values.ndim != 2 or x.shape[0] != values.shape[0] or x.shape[0] < 1:
            raise ValueError(
                f"table {i}: x must be (N, D) and values (N, T) with N >= 1, got "
                f"{tuple(x.shape)} and {tuple(values.shape)}"
            )
        for name, v in (("x", x), ("values", values)):
            if not torch.isfinite(v).all() or (v < 0).any() or (v > 1).any():
                raise ValueError(f"table {i}: {name} must be finite and lie in [0, 1]")
        out.append((x, values))
    dims = {x.shape[1] for x, _ in out}
    horizons = {v.shape[1] for _, v in out}
    if len(dims) > 1 or len(horizons) > 1:
        raise ValueError(f"tables must share D and T, got D {sorted(dims)}, T {sorted(horizons)}")
    if dims.pop() > config.max_dim_x or horizons.pop() > config.max_horizon:
        raise ValueError(
            f"this model takes D <= {config.max_dim_x} and T <= {config.max_horizon}, got "
            f"D {out[0][0].shape[1]}, T {out[0][1].shape[1]}"
        )
    return out


def _beta(alpha: float, count: int, generator: torch.Generator) -> torch.Tensor:
    """(count,) Beta(alpha, alpha) draws by inverse transform of seeded uniforms."""
    u = torch.rand(count, generator=generator, dtype=torch.float64)
    if alpha == 1.0:
        return u.float()
    from scipy.special import betaincinv  # lazy: importing the package never imports scipy

    return torch.from_numpy(betaincinv(alpha, alpha, u.numpy())).float()


def mixup_tables(
    tables: Sequence[tuple[torch.Tensor, torch.Tensor]],
    generator: torch.Generator,
    *,
    alpha: float = 1.0,
    meta: bool = True,
    hparam: bool = True,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One draw of the authors' learning-curve mixup (meta, then hyperparameter) of `tables`."""
    mixed = [(x, values) for x, values in tables]
    if meta:
        partner = torch.randperm(len(mixed), generator=generator)
        lam = _beta(alpha, len(mixed), generator)
        out = []
        for i, (x, values) in enumerate(mixed):
            other = mixed[int(partner[i])][1]
            if other.shape[0] == values.shape[0]:
                other_rows = other
            else:
                other_rows = other[
                    torch.randint(other.shape[0], (values.shape[0],), generator=generator)
                ]
            out.append((x, lam[i] * values + (1.0 - lam[i]) * other_rows))
        mixed = out
    if hparam:
        out = []
        for x, values in mixed:
            partner = torch.randperm(x.shape[0], generator=generator)
            lam = _beta(alpha, x.shape[0], generator)[:, None]
            out.append(
                (lam * x + (1 - lam) * x[partner], lam * values + (1 - lam) * values[partner])
            )
        mixed = out
    return mixed


def finetune_pfn(
    model: LearningCurvePFN,
    tables: Sequence[tuple[np.ndarray | torch.Tensor, np.ndarray | torch.Tensor]],
    finetune: FinetuneConfig | None = None,
    *,
    progress: bool = True,
) -> LearningCurvePFN:
    """A copy of `model` fine-tuned on real curve tables with learning-curve mixup.

    Args:
        model: a (prior-trained) `LearningCurvePFN`; it is not modified.
        tables: pairs (x (N, D) in [0, 1], values (N, T) in [0, 1]); every table one task,
            all with the same D and T.
        finetune: the recipe (`FinetuneConfig`).
    """
    finetune = finetune or FinetuneConfig()
    data = _as_tables(tables, model.config)
    generator = torch.Generator().manual_seed(finetune.seed)
    tuned = LearningCurvePFN(model.config)
    tuned.load_state_dict(model.state_dict())
    most_configs = min(finetune.max_configs, min(x.shape[0] for x, _ in data))

    def draw() -> CurveBatch:
        mixed = mixup_tables(
            data,
            generator,
            alpha=finetune.mixup_alpha,
            meta=finetune.meta_mixup,
            hparam=finetune.hparam_mixup,
        )
        num_configs = log_uniform_int(1, most_configs, generator)
        which = torch.randint(len(mixed), (finetune.batch_size,), generator=generator)
        xs, curves = [], []
        for i in which.tolist():
            rows = torch.randperm(mixed[i][0].shape[0], generator=generator)[:num_configs]
            xs.append(mixed[i][0][rows])
            curves.append(mixed[i][1][rows])
        size = finetune.batch_size
        return cut_tasks(
            torch.stack(xs),
            torch.stack(curves),
            torch.zeros(size),
            torch.zeros(size, dtype=torch.bool),
            generator,
            max_context=model.config.max_context,
            num_queries=finetune.num_queries,
        )

    _fit(tuned, draw, finetune, "finetune", progress)
    return tuned


def train_default_pfn(
    out: str | Path,
    *,
    seed: int = 0,
    steps: int = DEFAULT_TRAIN_CONFIG.steps,
    progress: bool = True,
) -> Path:
    """Train the shipped model (`DEFAULT_PFN_CONFIG`, `DEFAULT_TRAIN_CONFIG`) and save it.

    Evaluates the held-out prior NLL (32 batches from a separate stream) and stores it, the
    training time and the settings in the JSON next to the weights. Returns the weights' path
    (`save_pfn` naming). The shipped file was made with
    `freeze-thaw-bo train-surrogate --out src/freeze_thaw_bo/weights` (which trains on one
    thread and writes `ftpfn_small.safetensors` + `.json` into that folder).
    """
    from freeze_thaw_bo.pfn.checkpoint import save_pfn

    training = TrainConfig(**{**asdict(DEFAULT_TRAIN_CONFIG), "seed": seed, "steps": steps})
    started = time.perf_counter()
    model = train_pfn(DEFAULT_PFN_CONFIG, training, progress=progress)
    seconds = time.perf_counter() - started
    held_out = prior_batches(DEFAULT_PFN_CONFIG, 32, seed=seed + _EVAL_SEED_OFFSET)
    nll = evaluate_nll(model, held_out)
    logger.info("trained in %.0f s; held-out prior NLL %.4f", seconds, nll)
    metadata = {
        "training": asdict(training),
        "train_seconds": round(seconds, 1),
        "held_out_prior_nll": round(nll, 4),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    return save_pfn(model, out, metadata=metadata)
