"""Train a small byte-level GPT with a given per-step lr schedule and weight decay, recording the
validation loss: the measurement behind the LR-annealing and Power Lines reproductions.

Runs with the same ``seed`` share the initialisation and the exact sequence of batches, so two
schedules (or two weight decays) differ only in what is being compared.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from scaling_laws.models import GPTConfig, TinyGPT, count_parameters, lm_loss

__all__ = ["LMData", "LMRun", "train_lm"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LMData:
    """Training token stream and a fixed validation batch ``(inputs, targets)``."""

    train: torch.Tensor
    validation: tuple[torch.Tensor, torch.Tensor]

    @classmethod
    def fortunes(cls, seq_len: int, eval_sequences: int = 128, seed: int = 10_000) -> LMData:
        from benchdata import fortunes_corpus, lm_batch

        corpus = fortunes_corpus()
        validation = lm_batch(
            corpus.byte_tokens("validation"),
            eval_sequences,
            seq_len,
            torch.Generator().manual_seed(seed),
        )
        return cls(corpus.byte_tokens("train"), validation)


@dataclass(frozen=True)
class LMRun:
    """Result of :func:`train_lm`: validation losses at ``steps`` (1-based) and sizes."""

    steps: np.ndarray
    val_loss: np.ndarray
    parameters: int
    non_embedding_parameters: int
    tokens: int


def train_lm(
    data: LMData,
    config: GPTConfig,
    lrs: np.ndarray,
    *,
    batch_size: int,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.95),
    eval_every: int = 10,
    seed: int = 0,
    max_grad_norm: float = 1.0,
) -> LMRun:
    """AdamW on ``len(lrs)`` steps of ``batch_size`` random windows; validation loss every
    ``eval_every`` steps and at the end."""
    from benchdata import lm_batch

    torch.manual_seed(seed)
    model = TinyGPT(config)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=float(lrs[0]), betas=betas, weight_decay=weight_decay
    )
    generator = torch.Generator().manual_seed(seed + 1)
    steps, losses = [], []
    for step, lr in enumerate(lrs, 1):
        for group in optimizer.param_groups:
            group["lr"] = float(lr)
        batch = lm_batch(data.train, batch_size, config.seq_len, generator)
        optimizer.zero_grad(set_to_none=True)
        lm_loss(model, batch).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        if step % eval_every == 0 or step == len(lrs):
            model.eval()
            with torch.no_grad():
                losses.append(float(lm_loss(model, data.validation)))
            model.train()
            steps.append(step)
    return LMRun(
        steps=np.array(steps),
        val_loss=np.array(losses),
        parameters=count_parameters(model),
        non_embedding_parameters=count_parameters(model, non_embedding=True),
        tokens=len(lrs) * batch_size * config.seq_len,
    )
