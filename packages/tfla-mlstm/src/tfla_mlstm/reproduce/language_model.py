"""Byte-level language modelling on the fortunes corpus: xLSTM (mLSTM), xLSTM (mLSTMsig) and a
Transformer of the same size, trained on the same batches for the same number of tokens."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from tfla_mlstm.model import xLSTMConfig, xLSTMLM
from tfla_mlstm.reproduce.transformer import TransformerLM

LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class LMSettings:
    d_model: int
    num_layers: int
    num_heads: int
    seq_len: int
    batch_size: int
    steps: int
    eval_every: int
    eval_batches: int
    lr: float = 3e-3
    seed: int = 0


def build_models(s: LMSettings) -> dict[str, nn.Module]:
    """The three models, seeded alike (same sizes; parameter counts within a few percent)."""
    models = {}
    for name, cell in (("xLSTM (mLSTM)", "mlstm"), ("xLSTM (mLSTMsig)", "mlstmsig")):
        torch.manual_seed(s.seed)
        config = xLSTMConfig(
            vocab_size=256, d_model=s.d_model, num_layers=s.num_layers, num_heads=s.num_heads,
            cell=cell, chunk_size=64, backend="reference",
        )  # fmt: skip
        models[name] = xLSTMLM(config)
    torch.manual_seed(s.seed)
    ffn_hidden = models["xLSTM (mLSTM)"].config.ffn_hidden()
    models["Transformer"] = TransformerLM(
        256, s.d_model, s.num_layers, s.num_heads, ffn_hidden, s.seq_len
    )
    return models


def evaluate(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    model.eval()
    with torch.no_grad():
        losses = [F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item() for x, y in batches]
    model.train()
    return sum(losses) / len(losses)


def train_all(s: LMSettings, train_tokens, validation_tokens, lm_batch) -> dict:
    """Train every model; return ``{name: {"tokens": [...], "val_loss": [...], "params": n}}``."""
    val_gen = torch.Generator().manual_seed(s.seed + 1)
    val_batches = [
        lm_batch(validation_tokens, s.batch_size, s.seq_len, val_gen) for _ in range(s.eval_batches)
    ]
    curves = {}
    # tiny gate weights early in training make denormal floats, which x86 CPUs handle ~100x slower
    torch.set_flush_denormal(True)
    for name, model in build_models(s).items():
        optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / 30) * 0.5 * (1 + math.cos(
                math.pi * step / s.steps))
        )  # fmt: skip
        train_gen = torch.Generator().manual_seed(s.seed)  # the same batches for every model
        curve = {"tokens": [0], "val_loss": [evaluate(model, val_batches)]}
        for step in tqdm(range(1, s.steps + 1), desc=name, leave=False):
            x, y = lm_batch(train_tokens, s.batch_size, s.seq_len, train_gen)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            if step % s.eval_every == 0 or step == s.steps:
                curve["tokens"].append(step * s.batch_size * s.seq_len)
                curve["val_loss"].append(evaluate(model, val_batches))
        curve["params"] = sum(p.numel() for p in model.parameters())
        LOGGER.info("%s: validation loss %.4f", name, curve["val_loss"][-1])
        curves[name] = curve
    torch.set_flush_denormal(False)
    return curves
