"""The tiny xLSTM language model, fortunes data and DiLoCo replica job shared by
``test_diloco_xlstm.py`` and ``test_annealing_xlstm.py``.

The replica function must be importable by the processes ``launch_local`` starts, so it lives in
this module (the tests put this folder on ``sys.path``; multiprocessing hands it to the children).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from scaling_laws.diloco import DiLoCoConfig, DiLoCoTrainer
from tfla_mlstm import xLSTMConfig, xLSTMLM

SEQ_LEN = 64
# 2 chunks per sequence: the chunkwise path carries its (C, n, m) state across a chunk border
CHUNK_SIZE = 32
VALIDATION_SEED = 10_000


def xlstm_config(backend: str | None = "reference") -> xLSTMConfig:
    """2 blocks, width 64, 4 heads, byte vocabulary (~118k parameters)."""
    return xLSTMConfig(
        vocab_size=256,
        d_model=64,
        num_layers=2,
        num_heads=4,
        chunk_size=CHUNK_SIZE,
        backend=backend,
    )


def build_xlstm(seed: int = 0, backend: str | None = "reference") -> xLSTMLM:
    torch.manual_seed(seed)
    return xLSTMLM(xlstm_config(backend))


def lm_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean next-byte cross-entropy in nats; ``batch = (inputs, targets)``, int64 ``(B, S)``."""
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@functools.cache
def fortunes_tokens(split: str) -> torch.Tensor:
    """UTF-8 bytes of the fortunes corpus split (``"train"`` or ``"validation"``), int64."""
    from benchdata import fortunes_corpus

    return fortunes_corpus().byte_tokens(split)


def shard(tokens: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Replica ``rank``'s contiguous, disjoint slice of the token stream."""
    size = tokens.numel() // world_size
    return tokens[rank * size : (rank + 1) * size]


def validation_batch(sequences: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed held-out batch: ``sequences`` windows of the validation split (same every call)."""
    from benchdata import lm_batch

    generator = torch.Generator().manual_seed(VALIDATION_SEED)
    return lm_batch(fortunes_tokens("validation"), sequences, SEQ_LEN, generator)


@torch.no_grad()
def evaluate(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
    was_training = model.training
    model.eval()
    loss = float(lm_loss(model, batch))
    model.train(was_training)
    return loss


def parameter_digest(model: nn.Module) -> str:
    """sha256 of every parameter's bytes: equal digests mean bit-identical parameters."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


class StatefulxLSTM(nn.Module):
    """An xLSTM LM trained statefully: each batch starts from the recurrent state the previous
    batch ended in, kept (detached) in buffers, as truncated backpropagation through time does."""

    def __init__(self, model: xLSTMLM, batch_size: int) -> None:
        super().__init__()
        self.model = model
        config = model.config
        qk_dim, v_dim = config.head_dims()
        heads = (batch_size, config.num_heads)
        for index in range(config.num_layers):
            self.register_buffer(f"C{index}", torch.zeros(*heads, qk_dim, v_dim))
            self.register_buffer(f"n{index}", torch.zeros(*heads, qk_dim))
            self.register_buffer(f"m{index}", torch.zeros(*heads, 1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        layers = range(self.model.config.num_layers)
        states = [tuple(getattr(self, f"{name}{i}").clone() for name in "Cnm") for i in layers]
        logits, last = self.model(tokens, states, return_states=True)
        for i, state in zip(layers, last, strict=True):
            for name, value in zip("Cnm", state, strict=True):
                getattr(self, f"{name}{i}").copy_(value.detach())
        return logits


@dataclass(frozen=True)
class XLSTMJob:
    """One DiLoCo run of the tiny xLSTM on fortunes.

    Attributes:
        config: the DiLoCo hyperparameters (M is the number of processes launched).
        batch_size: sequences of ``SEQ_LEN`` bytes per replica per inner step.
        probe_steps: inner steps (1-based, between syncs) after which each replica records a
            digest of its inner parameters.
        record_syncs: sync steps after which the full parameters are returned too.
        eval_sequences: held-out windows for the loss before and after training.
        checkpoint_dir: where to write a checkpoint at the end (``None``: none).
        stateful: train :class:`StatefulxLSTM` (recurrent state carried in buffers).
    """

    config: DiLoCoConfig
    batch_size: int = 8
    probe_steps: tuple[int, ...] = ()
    record_syncs: tuple[int, ...] = ()
    eval_sequences: int = 64
    checkpoint_dir: str | None = None
    stateful: bool = False


def xlstm_job(rank: int, world_size: int, job: XLSTMJob) -> dict:
    """Train one replica; return parameter digests at every sync and probe, losses and the final
    parameters (picklable)."""
    from benchdata import lm_batch

    core = build_xlstm()
    model = StatefulxLSTM(core, job.batch_size) if job.stateful else core
    tokens = shard(fortunes_tokens("train"), rank, world_size)
    validation = validation_batch(job.eval_sequences)
    val_start = evaluate(core, validation)
    trainer = DiLoCoTrainer(model, lm_loss, job.config)
    config = job.config
    syncs: list[tuple[int, str]] = []
    probes: list[tuple[int, str]] = []
    recorded: dict[int, list[np.ndarray]] = {}

    def batch_fn(step: int, rank: int, generator: torch.Generator):
        return lm_batch(tokens, job.batch_size, SEQ_LEN, generator)

    def callback(trainer: DiLoCoTrainer, loss: float) -> None:
        if trainer.step % config.inner_steps == 0 or trainer.step == config.total_steps:
            syncs.append((trainer.step, parameter_digest(model)))
            if trainer.step in job.record_syncs:
                recorded[trainer.step] = [p.detach().numpy().copy() for p in model.parameters()]
        elif trainer.step in job.probe_steps:
            probes.append((trainer.step, parameter_digest(model)))

    losses = trainer.fit(
        batch_fn,
        checkpoint_dir=job.checkpoint_dir,
        checkpoint_every=config.total_steps if job.checkpoint_dir else None,
        callback=callback,
    )
    return {
        "syncs": syncs,
        "probes": probes,
        "losses": np.asarray(losses),
        "val_start": val_start,
        "val_end": evaluate(core, validation),
        "recorded": recorded,
        "outer_steps": trainer.outer_steps,
        "communicated_bytes": trainer.communicated_bytes,
    }


def train_with_schedule(
    lrs: np.ndarray,
    *,
    batch_size: int = 8,
    eval_every: int = 10,
    eval_sequences: int = 32,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """AdamW (β = 0.9, 0.95, no weight decay, clip 1) on the tiny xLSTM for ``len(lrs)`` steps,
    ``lrs[i]`` at step ``i + 1``; the held-out loss every ``eval_every`` steps and at the end.

    Runs with the same ``seed`` share the initialisation and every batch, so schedules differ
    only in their learning rates. Returns ``(steps, losses)``: 1-based steps, nats/byte.
    """
    from benchdata import lm_batch

    model = build_xlstm(seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=float(lrs[0]), betas=(0.9, 0.95), weight_decay=0.0
    )
    tokens = fortunes_tokens("train")
    validation = validation_batch(eval_sequences)
    generator = torch.Generator().manual_seed(seed + 1)
    steps, losses = [], []
    for step, lr in enumerate(lrs, 1):
        optimizer.param_groups[0]["lr"] = float(lr)
        optimizer.zero_grad(set_to_none=True)
        lm_loss(model, lm_batch(tokens, batch_size, SEQ_LEN, generator)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % eval_every == 0 or step == len(lrs):
            steps.append(step)
            losses.append(evaluate(model, validation))
    return np.array(steps), np.array(losses)
