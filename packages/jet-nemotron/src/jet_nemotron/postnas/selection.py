"""Which linear-attention block: candidates trained the same way at a fixed placement.

With the attention placement fixed, each candidate block replaces the attention of every other
layer of the same pretrained model, starts from the attention's projections, is trained by
:func:`~jet_nemotron.postnas.supernet.train_supernet` with the same data, steps and seed (the
path fixed to the placement), and is scored on the same probes. Candidates are ranked by their
mean excess loss over the original model across tasks (nats per answer token; lower is
better), reported beside each task's scores, the blocks' parameter count and the state each
carries per sequence while decoding.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from jet_nemotron.postnas.blocks import LINEAR_BLOCKS, state_numel
from jet_nemotron.postnas.probes import Probe, ProbeScore, score_probe
from jet_nemotron.postnas.supernet import SupernetTrainConfig, SuperNetwork, train_supernet

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BlockResult:
    """One candidate at the fixed placement.

    Attributes:
        block: the candidate's name.
        scores: per task, the probe score.
        excess_loss: mean over tasks of (loss - the original model's loss), nats.
        parameters: parameters of one layer's block.
        state_numel: floats one layer's block carries per sequence while decoding.
        final_train_loss: the last training step's loss.
    """

    block: str
    scores: dict[str, ProbeScore]
    excess_loss: float
    parameters: int
    state_numel: int
    final_train_loss: float


def select_block(
    model: nn.Module,
    rows: torch.Tensor,
    placement: Sequence[int],
    probes: Sequence[Probe],
    blocks: Sequence[str] = LINEAR_BLOCKS,
    config: SupernetTrainConfig = SupernetTrainConfig(),
    *,
    head_v_dim: int | None = None,
    batch_size: int = 8,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
) -> tuple[dict[str, ProbeScore], list[BlockResult]]:
    """Train and score each candidate block at ``placement``.

    Args:
        model: the pretrained causal LM (Llama / Qwen2; not modified).
        rows: ``(N, L)`` training rows.
        placement: the layers that keep attention.
        probes: the tasks to score on.
        blocks: candidate names (see :data:`~jet_nemotron.postnas.blocks.LINEAR_BLOCKS`).
        config: training settings shared by every candidate (its ``fixed_path`` is replaced by
            ``placement``).
        head_v_dim: value dim per head of every candidate (default the attention's head dim).
        batch_size: rows per forward pass when scoring.
        checkpoint_dir: a folder for each candidate's training checkpoint (``<block>.pt``): a
            rerun resumes an interrupted candidate and does not retrain finished ones.
        progress: progress bars (``None``: on a terminal).

    Returns:
        The original model's scores, and the candidates' results from best to worst.

    Raises:
        ValueError: no candidate, an unknown or repeated block, or no probe.
    """
    if not blocks:
        raise ValueError(f"give at least one candidate block of {LINEAR_BLOCKS}")
    unknown = sorted(set(blocks) - set(LINEAR_BLOCKS))
    if unknown or len(set(blocks)) != len(blocks):
        raise ValueError(
            f"candidate blocks must be distinct names of {LINEAR_BLOCKS}, got {list(blocks)}"
        )
    if not probes:
        raise ValueError("give at least one probe to score the candidates on")
    config = dataclasses.replace(config, fixed_path=tuple(placement))
    original = {p.name: score_probe(model, p, batch_size) for p in probes}
    results = []
    for name in blocks:
        logger.info("candidate %s", name)
        with torch.random.fork_rng(devices=[]):  # every candidate's initialisation: one stream
            torch.manual_seed(config.seed)
            supernet = SuperNetwork(model, name, head_v_dim=head_v_dim)
        checkpoint = None if checkpoint_dir is None else Path(checkpoint_dir) / f"{name}.pt"
        history = train_supernet(supernet, rows, config, checkpoint=checkpoint, progress=progress)
        with supernet.path(config.fixed_path or ()):
            scores = {p.name: score_probe(supernet.model, p, batch_size) for p in probes}
        block = supernet.linear_blocks()[0]
        losses = history.paths or history.layerwise
        results.append(
            BlockResult(
                block=name,
                scores=scores,
                excess_loss=sum(scores[t].loss - original[t].loss for t in scores) / len(scores),
                parameters=sum(p.numel() for p in block.parameters()),
                state_numel=state_numel(block),
                final_train_loss=losses[-1] if losses else float("nan"),
            )
        )
        del supernet
    return original, sorted(results, key=lambda r: r.excess_loss)
