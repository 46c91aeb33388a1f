"""Multi-bit training: one set of full-precision weights, several bit-widths per run.

Schedules (which bit-widths a step trains):

* ``"all"``: every trained bit-width on every step, gradients summed, one optimizer step
  (Any-Precision DNNs); from the highest bit-width down.
* ``"round_robin"``: one bit-width per step, in turn.
* ``"sampled"``: one bit-width per step, drawn uniformly (seeded).

Distillation: ``"highest"`` trains every lower bit-width on the softened output of the highest
one (soft cross-entropy), ``"recursive"`` on the output of the next higher one (Any-Precision's
recursive supervision); the highest always learns from the labels. A teacher output computed on
the same batch in the same step is reused, otherwise it costs one extra forward pass.

Bit-wise coresets (``coreset=fraction``): every bit-width trains on its own subset, re-selected
every ``resample_every`` epochs from the importance scores of its own child model (see
:mod:`multibit_quant.coreset`); the first epoch uses random subsets. An epoch is one pass over
each bit-width's subset, so a fraction ``f`` costs ``f`` of a full epoch plus the scoring passes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from multibit_quant.coreset import MODES, SCORES, BitwiseCoreset, check_fraction
from multibit_quant.data import ImageData
from multibit_quant.layers import check_bit_setting
from multibit_quant.model import MultiBitModel

logger = logging.getLogger(__name__)

SCHEDULES = ("all", "round_robin", "sampled")
DISTILLATION = ("none", "highest", "recursive")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _positive_number(name: str, value: object, zero_ok: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):
        raise ValueError(
            f"{name} must be a finite number > {'=' if zero_ok else ''}0, got {value!r}"
        )


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one multi-bit training run (the bit-widths are the model's trained bits).

    Attributes:
        epochs, batch_size, lr, weight_decay: Adam with a cosine schedule over the run (the
            Any-Precision code trains with Adam at 1e-3).
        schedule: ``"all"``, ``"round_robin"`` or ``"sampled"`` (see the module docstring).
        distill: ``"none"``, ``"highest"`` or ``"recursive"``.
        coreset: fraction of the training set each bit-width trains on per epoch, or ``None``.
        coreset_score / coreset_mode / resample_every: see :mod:`multibit_quant.coreset`.
        augment: random horizontal flips.
        seed: data order, flips, sampled schedule and coreset draws.
    """

    epochs: int = 3
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.0
    schedule: str = "all"
    distill: str = "none"
    coreset: float | None = None
    coreset_score: str = "el2n"
    coreset_mode: str = "sample"
    resample_every: int = 1
    augment: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        _positive_int("epochs", self.epochs)
        _positive_int("batch_size", self.batch_size)
        _positive_int("resample_every", self.resample_every)
        _positive_number("lr", self.lr)
        _positive_number("weight_decay", self.weight_decay, zero_ok=True)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.distill not in DISTILLATION:
            raise ValueError(f"distill must be one of {DISTILLATION}, got {self.distill!r}")
        if self.coreset is not None:
            check_fraction(self.coreset)
        if self.coreset_score not in SCORES:
            raise ValueError(f"coreset_score must be one of {SCORES}, got {self.coreset_score!r}")
        if self.coreset_mode not in MODES:
            raise ValueError(f"coreset_mode must be one of {MODES}, got {self.coreset_mode!r}")


@dataclass
class TrainResult:
    """What a run cost and how its losses went."""

    config: dict
    train_seconds: float = 0.0
    scoring_seconds: float = 0.0
    steps: int = 0
    trained_examples: dict[int, int] = field(default_factory=dict)  # forward+backward passes
    scored_examples: int = 0  # forward-only passes of the coreset scoring
    teacher_examples: int = 0  # forward-only passes of distillation teachers
    losses: dict[int, list[float]] = field(default_factory=dict)  # mean loss per epoch

    @property
    def seconds(self) -> float:
        return self.train_seconds + self.scoring_seconds

    def to_dict(self) -> dict:
        out = asdict(self)
        out["seconds"] = self.seconds
        return out


def _batches(indices: torch.Tensor, batch_size: int, generator: torch.Generator):
    order = indices[torch.randperm(len(indices), generator=generator)]
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _flip_where(images: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """``images (N, C, H, W)`` with the ones where ``flips (N,)`` bool is set mirrored left to
    right; ``flips`` is drawn on the CPU (the seeded generator) and moved to the images."""
    mask = flips.to(images.device)[:, None, None, None]
    return torch.where(mask, images.flip(-1), images)


def _soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return -(target * logits.log_softmax(-1)).sum(-1).mean()


def _step_plan(bits: tuple[int, ...], schedule: str, steps: int, generator) -> list[list[int]]:
    """The bit-widths each step of an epoch trains, highest first within a step."""
    descending = sorted(bits, reverse=True)
    if schedule == "all":
        return [descending] * steps
    if schedule == "round_robin":
        return [[descending[i % len(bits)]] for i in range(steps)]
    picks = torch.randint(len(bits), (steps,), generator=generator).tolist()
    return [[descending[p]] for p in picks]


def train_multibit(
    model: MultiBitModel,
    data: ImageData,
    config: TrainConfig | None = None,
    *,
    progress: bool | None = None,
) -> TrainResult:
    """Train ``model`` at its trained bit-widths on ``data`` (in place); returns the costs.

    ``progress``: a progress bar per epoch (``None``: only on a terminal).
    """
    config = TrainConfig() if config is None else config
    bits = tuple(check_bit_setting(b) for b in model.trained_bits)
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    size = len(data)
    coreset = None
    if config.coreset is not None:
        coreset = BitwiseCoreset(
            size, bits, config.coreset, config.coreset_score, config.coreset_mode,
            config.resample_every, config.seed,
        )  # fmt: skip
    per_epoch = math.ceil(
        (math.ceil(config.coreset * size) if coreset else size) / config.batch_size
    )
    steps_per_epoch = per_epoch * (1 if config.schedule == "all" else len(bits))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=max(1, steps_per_epoch * config.epochs)
    )
    result = TrainResult(asdict(config), trained_examples=dict.fromkeys(bits, 0))
    result.losses = {b: [] for b in bits}
    everything = torch.arange(size)
    for epoch in range(config.epochs):
        if coreset is not None and coreset.due(epoch):
            start = time.perf_counter()
            result.scored_examples += coreset.refresh(model, data.images, data.labels)
            result.scoring_seconds += time.perf_counter() - start
        model.train()
        start = time.perf_counter()
        # without coresets an "all" step trains every bit-width on one batch (Any-Precision)
        same_batch = coreset is None and config.schedule == "all"
        if same_batch:
            shared_queue = _batches(everything, config.batch_size, generator)
            queues = dict.fromkeys(bits, shared_queue)
        else:
            queues = {
                b: _batches(coreset.subsets[b] if coreset else everything, config.batch_size,
                            generator)
                for b in bits
            }  # fmt: skip
        plan = _step_plan(bits, config.schedule, steps_per_epoch, generator)
        sums = dict.fromkeys(bits, 0.0)
        counts = dict.fromkeys(bits, 0)
        cursor = dict.fromkeys(bits, 0)
        bar = tqdm(plan, desc=f"epoch {epoch + 1}/{config.epochs}", disable=progress is False
                   if progress is not None else None, mininterval=5.0, leave=False)  # fmt: skip
        for step_bits in bar:
            optimizer.zero_grad(set_to_none=True)
            outputs: dict[int, torch.Tensor] = {}
            flips = None
            for b in step_bits:
                queue = queues[b]
                index = queue[cursor[b] % len(queue)]
                cursor[b] += 1
                if flips is None or not same_batch:
                    flips = torch.rand(len(index), generator=generator) < 0.5
                x = data.images[index]
                if config.augment:
                    x = _flip_where(x, flips)
                x, y = x.to(device), data.labels[index].to(device)
                model.set_bits(b)
                logits = model(x)
                if coreset is not None and coreset.score == "forgetting":  # per presentation
                    coreset.observe(b, index, logits.detach().argmax(1).cpu() == data.labels[index])
                loss = _distill_loss(model, logits, x, y, b, bits, config.distill, outputs,
                                     same_batch, result)  # fmt: skip
                loss.backward()
                outputs[b] = logits.detach()
                sums[b] += float(loss.detach()) * len(index)
                counts[b] += len(index)
                result.trained_examples[b] += len(index)
            optimizer.step()
            scheduler.step()
            result.steps += 1
        result.train_seconds += time.perf_counter() - start
        for b in bits:
            result.losses[b].append(sums[b] / counts[b] if counts[b] else math.nan)
        logger.info(
            "epoch %d: %s", epoch + 1,
            ", ".join(f"{b}-bit loss {result.losses[b][-1]:.4f}" for b in bits),
        )  # fmt: skip
    model.set_bits(max(bits))
    model.eval()
    return result


def _distill_loss(model, logits, x, y, b, bits, distill, outputs, same_batch, result):
    highest = max(bits)
    if distill == "none" or b == highest:
        return F.cross_entropy(logits, y)
    higher = sorted(t for t in bits if t > b)
    teacher_bits = highest if distill == "highest" else higher[0]
    if same_batch and teacher_bits in outputs:  # computed this step on this very batch
        teacher = outputs[teacher_bits]
    else:
        # train mode, as the teacher's own training forward would be, without adding one more
        # update of the (shared) BatchNorm running statistics
        with torch.no_grad(), model.bits_as(teacher_bits), _running_stats_kept(model):
            teacher = model(x)
        result.teacher_examples += len(x)
    return _soft_cross_entropy(logits, teacher.float().softmax(-1))


@contextlib.contextmanager
def _running_stats_kept(model: torch.nn.Module):
    """BatchNorm running statistics unchanged inside (momentum 0, batch statistics still used):
    no in-place write that a pending backward pass would object to."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    saved = [(m.momentum, None if m.num_batches_tracked is None else m.num_batches_tracked.clone())
             for m in norms]  # fmt: skip
    for module in norms:
        module.momentum = 0.0
    try:
        yield
    finally:
        for module, (momentum, tracked) in zip(norms, saved, strict=True):
            module.momentum = momentum
            if tracked is not None:  # not read by the backward pass: safe to restore in place
                module.num_batches_tracked.copy_(tracked)


@torch.no_grad()
def evaluate(
    model: MultiBitModel, data: ImageData, bits: tuple[int, ...] | list[int], batch_size: int = 512
) -> dict[int, float]:
    """Top-1 accuracy at each bit-width (eval mode: BatchNorm running statistics)."""
    device = next(model.parameters()).device
    model.eval()
    accuracy = {}
    for b in bits:
        correct = 0
        with model.bits_as(b):
            for i in range(0, len(data), batch_size):
                logits = model(data.images[i : i + batch_size].to(device))
                correct += int((logits.argmax(1).cpu() == data.labels[i : i + batch_size]).sum())
        accuracy[b] = correct / len(data)
    return accuracy
