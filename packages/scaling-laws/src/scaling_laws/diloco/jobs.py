"""Ready-made DiLoCo / data-parallel jobs: one function per replica, usable by the local launcher,
torchrun scripts, the CLI and ``reproduce``.

``train_job(rank, world_size, spec)`` builds the model (same seed on every rank), trains it with
:class:`DiLoCoTrainer` on the spec's data (replica r draws its own batches from generator seed
``config.seed + r``), and returns a picklable summary: final parameters, a digest of the
parameters after every sync boundary, losses, validation loss and bytes all-reduced.

Example (two gloo replicas on CPU):
    >>> from scaling_laws.diloco import DiLoCoConfig, launch_local
    >>> from scaling_laws.diloco.jobs import JobSpec, train_job
    >>> spec = JobSpec(DiLoCoConfig(total_steps=4, inner_steps=2), model="mlp", data="synthetic")
    >>> out = launch_local(train_job, 2, (spec,))  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from scaling_laws.diloco.config import DiLoCoConfig
from scaling_laws.diloco.trainer import DiLoCoTrainer
from scaling_laws.models import GPTConfig, TinyGPT, count_parameters, lm_loss

__all__ = ["FAILURE_EXIT_CODE", "JobSpec", "build_model", "parameter_digest", "train_job"]

MODELS = ("gpt", "mlp")
DATA = ("fortunes", "synthetic")
FAILURE_EXIT_CODE = 3
_INPUTS = 8


@dataclass(frozen=True)
class JobSpec:
    """What one DiLoCo / data-parallel job trains.

    Attributes:
        config: trainer hyperparameters.
        model: ``"gpt"`` (:class:`TinyGPT`, needs ``data="fortunes"``) or ``"mlp"`` (a 2-layer
            tanh MLP regressing a fixed random teacher, ``data="synthetic"``).
        gpt: transformer sizes for ``model="gpt"``.
        mlp_width: hidden width for ``model="mlp"``.
        batch_size: sequences (or examples) per replica per inner step.
        model_seed: initialisation seed (identical on every rank).
        eval_sequences: validation windows for the final loss (GPT only).
        checkpoint_dir / checkpoint_every: see :meth:`DiLoCoTrainer.fit`.
        fail_at_step / fail_rank: fault drill: replica ``fail_rank`` exits with code 3 right after
            step ``fail_at_step`` (and its checkpoint, if one is due): resume by launching again.
        fail_by_raising: the drill raises ``RuntimeError`` instead (a bug in user code) while
            the other replicas wait in the next collective.
    """

    config: DiLoCoConfig
    model: str = "gpt"
    gpt: GPTConfig = field(default_factory=GPTConfig)
    mlp_width: int = 32
    batch_size: int = 16
    data: str = "fortunes"
    model_seed: int = 0
    eval_sequences: int = 64
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    fail_at_step: int | None = None
    fail_rank: int = 0
    fail_by_raising: bool = False

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.data not in DATA:
            raise ValueError(f"data must be one of {DATA}, got {self.data!r}")
        if (self.model == "gpt") != (self.data == "fortunes"):
            raise ValueError("model 'gpt' trains on 'fortunes', model 'mlp' on 'synthetic'")
        if self.batch_size < 1 or self.mlp_width < 1:
            raise ValueError("batch_size and mlp_width must be >= 1")


def build_model(spec: JobSpec) -> nn.Module:
    torch.manual_seed(spec.model_seed)
    if spec.model == "gpt":
        return TinyGPT(spec.gpt)
    return nn.Sequential(
        nn.Linear(_INPUTS, spec.mlp_width), nn.Tanh(), nn.Linear(spec.mlp_width, 1)
    )


def parameter_digest(model: nn.Module) -> str:
    """sha256 of the parameters' bytes: equal digests mean bit-identical parameters."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def _data(spec: JobSpec):
    """``(batch_fn, loss_fn, validation batch or None)``."""
    if spec.data == "synthetic":
        teacher = torch.randn(_INPUTS, generator=torch.Generator().manual_seed(1234))

        def synthetic(step: int, rank: int, generator: torch.Generator):
            x = torch.randn(spec.batch_size, _INPUTS, generator=generator)
            return x, torch.sin(x @ teacher)[:, None]

        return synthetic, _mse, None
    from benchdata import fortunes_corpus, lm_batch

    corpus = fortunes_corpus()
    train_tokens = corpus.byte_tokens("train")
    seq_len = spec.gpt.seq_len

    def fortunes(step: int, rank: int, generator: torch.Generator):
        return lm_batch(train_tokens, spec.batch_size, seq_len, generator)

    validation = lm_batch(
        corpus.byte_tokens("validation"),
        spec.eval_sequences,
        seq_len,
        torch.Generator().manual_seed(10_000),
    )
    return fortunes, lm_loss, validation


def train_job(rank: int, world_size: int, spec: JobSpec) -> dict:
    """Train one replica (inside an initialised process group, or alone) and summarise it."""
    started = time.perf_counter()
    model = build_model(spec)
    batch_fn, loss_fn, validation = _data(spec)
    trainer = DiLoCoTrainer(model, loss_fn, spec.config)
    digests: list[tuple[int, str]] = []
    sync_every = spec.config.inner_steps if spec.config.algorithm == "diloco" else 1

    def callback(trainer: DiLoCoTrainer, loss: float) -> None:
        if trainer.step % sync_every == 0 or trainer.step == spec.config.total_steps:
            digests.append((trainer.step, parameter_digest(model)))
        if trainer.step == spec.fail_at_step and rank == spec.fail_rank:
            if spec.fail_by_raising:
                raise RuntimeError(f"fault drill: replica {rank} raised after step {trainer.step}")
            os._exit(FAILURE_EXIT_CODE)

    losses = trainer.fit(
        batch_fn,
        checkpoint_dir=spec.checkpoint_dir,
        checkpoint_every=spec.checkpoint_every,
        callback=callback,
    )
    val_loss = None
    if validation is not None:
        model.eval()
        with torch.no_grad():
            val_loss = float(loss_fn(model, validation))
    return {
        "rank": rank,
        "world_size": world_size,
        "final": [p.detach().cpu().numpy().copy() for p in model.parameters()],
        "digests": digests,
        "losses": np.asarray(losses),
        "val_loss": val_loss,
        "communicated_bytes": trainer.communicated_bytes,
        "outer_steps": trainer.outer_steps,
        "parameters": count_parameters(model),
        "elapsed_s": time.perf_counter() - started,
    }
