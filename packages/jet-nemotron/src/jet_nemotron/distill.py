"""Distillation that recovers the quality lost when attention layers become JetBlocks.

Two stages, both against the original (teacher) model on real text:

1. **Layer-wise** (cheap): the teacher runs once per batch with hooks on its attention layers;
   every new JetBlock gets the same input as the attention it replaces and learns to reproduce that
   attention's output (mean squared error relative to the target's mean square). Only the
   JetBlocks' own forward and backward run, so hundreds of steps fit on a CPU.
2. **End-to-end**: the hybrid's next-token distribution is pulled towards the teacher's
   (KL(teacher ‖ student) at a temperature) plus the relative squared error of every layer's
   hidden state, backpropagating through the whole hybrid.

In both stages only the JetBlocks' parameters move (those that require grad): embeddings, norms,
MLPs, the LM head and the attention layers that were kept stay as the original model has them,
as in PostNAS, which trains the new attention blocks of a frozen pretrained model.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from jet_nemotron.modules.jet_block import JetBlock

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistillConfig:
    """Settings of :func:`distill`.

    Attributes:
        layerwise_steps: optimizer steps of stage 1 (0 skips it).
        end_to_end_steps: optimizer steps of stage 2 (0 skips it).
        batch_size: rows per step.
        lr: AdamW learning rate (both stages).
        temperature: softmax temperature of the KL term.
        hidden_weight: weight of the hidden-state term of stage 2.
        max_grad_norm: gradient clipping.
        seed: order of the rows.
    """

    layerwise_steps: int = 200
    end_to_end_steps: int = 50
    batch_size: int = 4
    lr: float = 1e-3
    temperature: float = 1.0
    hidden_weight: float = 1.0
    max_grad_norm: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("layerwise_steps", "end_to_end_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        for name in ("lr", "temperature", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_weight < 0:
            raise ValueError(f"hidden_weight must be >= 0, got {self.hidden_weight}")


@dataclass
class DistillHistory:
    """Loss per optimizer step of each stage."""

    layerwise: list[float] = field(default_factory=list)
    end_to_end: list[float] = field(default_factory=list)


def jet_blocks(model: nn.Module) -> dict[int, JetBlock]:
    """The model's JetBlocks by layer index."""
    return {m.layer_idx: m for m in model.modules() if isinstance(m, JetBlock)}  # type: ignore[misc]


def _batches(rows: torch.Tensor, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    while True:
        for index in torch.randperm(len(rows), generator=generator).split(batch_size):
            if len(index) == batch_size or len(rows) < batch_size:
                yield rows[index]


def relative_mse(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error of ``prediction`` over the mean square of ``target`` (float32)."""
    return (prediction.float() - target.float()).square().mean() / target.float().square().mean()


def attention_io(teacher: nn.Module, layers: list[int], input_ids: torch.Tensor):
    """Run the teacher (no grad); return ``{layer: (attention input, attention output)}`` of the
    mixers at ``teacher.model.layers[i].self_attn``."""
    captured: dict[int, list[torch.Tensor]] = {}
    handles = []
    decoder_layers = teacher.model.layers
    for index in layers:
        attention = decoder_layers[index].self_attn

        def pre_hook(module, args, kwargs, index=index):
            captured[index] = [kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]]

        def post_hook(module, args, output, index=index):
            captured[index].append(output[0] if isinstance(output, tuple) else output)

        handles.append(attention.register_forward_pre_hook(pre_hook, with_kwargs=True))
        handles.append(attention.register_forward_hook(post_hook))
    try:
        with torch.no_grad():
            teacher(input_ids=input_ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return {index: (x, y) for index, (x, y) in captured.items()}


def _check_pair(student: nn.Module, teacher: nn.Module) -> None:
    """The student must be a hybrid of the teacher: same vocabulary, depth and width."""
    fields = ("vocab_size", "num_hidden_layers", "hidden_size")
    mismatched = {
        name: (getattr(student.config, name, None), getattr(teacher.config, name, None))
        for name in fields
        if getattr(student.config, name, None) != getattr(teacher.config, name, None)
    }
    if mismatched:
        raise ValueError(
            "the student is not a hybrid of this teacher: (student, teacher) "
            + ", ".join(f"{name} {values}" for name, values in mismatched.items())
        )


def progress_options(progress: bool | None) -> dict[str, Any]:
    """tqdm options: on a terminal only (``None``), sparse updates."""
    return {"disable": None if progress is None else not progress, "mininterval": 10}


def log_progress(stage: str, losses: list[float], steps: int) -> None:
    """A log line every tenth of a stage (progress bars are off when stderr is not a terminal)."""
    if len(losses) % max(1, steps // 10) == 0 or len(losses) == steps:
        logger.info("%s step %d/%d: loss %.4f", stage, len(losses), steps, losses[-1])


def optimizer_step(
    loss: torch.Tensor, params: list[nn.Parameter], optimizer: Any, max_grad_norm: float
) -> None:
    """Backward, clip ``params``' gradient norm, step."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()


def distill(
    student: nn.Module,
    teacher: nn.Module,
    rows: torch.Tensor,
    config: DistillConfig = DistillConfig(),
    *,
    progress: bool | None = None,
) -> DistillHistory:
    """Train the student's new blocks against the teacher (see the module docstring).

    Args:
        student: a hybrid LM (``HybridForCausalLM``) whose JetBlocks replace teacher attentions
            at the same layer indices.
        teacher: the original Hugging Face causal LM (left unchanged).
        rows: ``(N, L)`` int64 token rows (see :func:`jet_nemotron.data.text_rows`).
        config: steps, learning rate, loss weights.
        progress: show a progress bar (``None``: only on a terminal).

    Returns:
        The loss of every step.
    """
    if rows.dim() != 2 or rows.dtype != torch.long:
        raise ValueError(
            f"rows must be an int64 (N, L) tensor, got {rows.dtype} {tuple(rows.shape)}"
        )
    blocks = jet_blocks(student)
    if not blocks:
        raise ValueError("the student has no JetBlock to distil")
    _check_pair(student, teacher)
    device = next(student.parameters()).device
    teacher.eval()
    history = DistillHistory()
    batches = _batches(rows, config.batch_size, config.seed)
    params = [p for block in blocks.values() for p in block.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the student's JetBlocks have no parameter that requires grad")
    trained = {id(p) for p in params}
    # nothing else needs a weight gradient (it would only cost time): switched off meanwhile
    others = [p for p in student.parameters() if p.requires_grad and id(p) not in trained]
    was_training = student.training
    for p in others:
        p.requires_grad_(False)
    student.train()
    try:
        if config.layerwise_steps:
            optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
            bar = tqdm(
                range(config.layerwise_steps), desc="layer-wise", **progress_options(progress)
            )
            for _ in bar:
                pairs = attention_io(teacher, sorted(blocks), next(batches).to(device))
                loss = sum(relative_mse(blocks[i](x)[0], y) for i, (x, y) in pairs.items())
                loss = loss / len(pairs)
                optimizer_step(loss, params, optimizer, config.max_grad_norm)
                history.layerwise.append(loss.item())
                log_progress("layer-wise", history.layerwise, config.layerwise_steps)
        if config.end_to_end_steps:
            optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
            bar = tqdm(
                range(config.end_to_end_steps), desc="end-to-end", **progress_options(progress)
            )
            for _ in bar:
                loss = _end_to_end_loss(student, teacher, next(batches).to(device), config)
                optimizer_step(loss, params, optimizer, config.max_grad_norm)
                history.end_to_end.append(loss.item())
                log_progress("end-to-end", history.end_to_end, config.end_to_end_steps)
    finally:
        student.train(was_training)
        for p in others:
            p.requires_grad_(True)
    return history


def _end_to_end_loss(
    student: nn.Module, teacher: nn.Module, input_ids: torch.Tensor, config: DistillConfig
) -> torch.Tensor:
    with torch.no_grad():
        target = teacher(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    output = student(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    return distillation_loss(output, target, config.temperature, config.hidden_weight)


def distillation_loss(
    output: Any, target: Any, temperature: float, hidden_weight: float
) -> torch.Tensor:
    """KL(teacher ‖ student) of the next-token distributions at ``temperature`` (scaled by its
    square) plus ``hidden_weight`` times the mean relative squared error of every layer's output.

    Args:
        output, target: the student's and the teacher's causal-LM outputs, both with ``logits
            (B, T, vocab)`` and ``hidden_states`` (embeddings first, as transformers returns them).
    """
    t = temperature
    kl = F.kl_div(
        F.log_softmax(output.logits.float() / t, -1).flatten(0, 1),
        F.log_softmax(target.logits.float() / t, -1).flatten(0, 1),
        log_target=True,
        reduction="batchmean",
    ) * (t * t)
    hidden = sum(
        relative_mse(s, h)
        for s, h in zip(output.hidden_states[1:], target.hidden_states[1:], strict=True)
    ) / (len(target.hidden_states) - 1)
    return kl + hidden_weight * hidden


@torch.no_grad()
def heldout_loss(model: nn.Module, rows: torch.Tensor, batch_size: int = 4) -> float:
    """Mean next-token cross-entropy (nats) of a causal LM over ``rows (N, L)``."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    try:
        for batch in rows.split(batch_size):
            batch = batch.to(device)
            logits: Any = model(input_ids=batch, use_cache=False).logits[:, :-1].float()
            losses = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")
            total += losses.item()
            count += batch[:, 1:].numel()
    finally:
        model.train(was_training)
    return total / count
