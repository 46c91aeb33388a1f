"""One benchmark task end to end: LookWhere and every baseline from the same teacher, judged at
several operating points each (accuracy, counted FLOPs, measured time).

Protocol: every method starts from the teacher's weights and gets the same number of supervised
fine-tuning steps (the dense ViT is the teacher trained on for those steps). LookWhere first
distils the teacher without labels (selector from its first blocks, extractor from all of it),
then fine-tunes with its selector frozen. Methods with a token knob (LookWhere's and random
selection's `k`, EViT's keep rate, ToMe's `r`) fine-tune once, the knob drawn per step over its
range, and are judged at several values of it.
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from lookwhere.baselines import (
    DenseClassifier,
    EViTClassifier,
    LowResClassifier,
    RandomTokenClassifier,
    ToMeClassifier,
    tome_tokens,
)
from lookwhere.data import ImageTask
from lookwhere.evaluate import OperatingPoint, judge, target_recall
from lookwhere.model import LookWhere, lookwhere_from_teacher
from lookwhere.pretrain import pretrain
from lookwhere.train import TrainConfig, device_of, train_classifier, uniform_k

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MethodSettings:
    """What each method is run with.

    Attributes:
        selector_depth: Teacher blocks the selector keeps.
        selector_size: The selector's input resolution in pixels.
        pretrain: Optimisation of LookWhere's distillation pre-training.
        finetune: Optimisation of every method's supervised fine-tuning.
        k_range: Tokens kept per step in pre-training and fine-tuning (LookWhere, random).
        ks: The `k` each token-selection method is judged at.
        low_sizes: Resolutions of the low-resolution ViT baseline (one fine-tune each).
        evit_rates: EViT keep rates judged (fine-tuned with the rate drawn over their range).
        tome_rs: ToMe merges per block judged (fine-tuned with `r` drawn over their range).
        time_batch: Images per timed batch.
    """

    selector_depth: int = 1
    selector_size: int = 48
    pretrain: TrainConfig = field(default_factory=lambda: TrainConfig(steps=250, lr=5e-4))
    finetune: TrainConfig = field(default_factory=lambda: TrainConfig(steps=150, lr=3e-4))
    k_range: tuple[int, int] = (4, 36)
    ks: tuple[int, ...] = (6, 12, 24, 36)
    low_sizes: tuple[int, ...] = (48, 64)
    evit_rates: tuple[float, ...] = (0.5, 0.7, 0.85)
    tome_rs: tuple[int, ...] = (8, 16, 24)
    time_batch: int = 32

    def __post_init__(self) -> None:
        low, high = self.k_range
        if not 1 <= low <= high:
            raise ValueError(f"k_range {self.k_range} must satisfy 1 <= low <= high")
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"ks {self.ks} must be positive token counts")
        if not self.evit_rates or not all(0 < r <= 1 for r in self.evit_rates):
            raise ValueError(f"evit_rates {self.evit_rates} must be in (0, 1]")
        if not self.tome_rs or min(self.tome_rs) < 0:
            raise ValueError(f"tome_rs {self.tome_rs} must be merges >= 0")
        if not self.low_sizes:
            raise ValueError("low_sizes needs at least one resolution")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TaskResult:
    """Every operating point of every method on one task, and the trained models.

    Attributes:
        task: The task's name.
        points: Every method at every setting.
        lookwhere: The fine-tuned LookWhere model.
        pretrain_log: Its distillation loss terms per step.
        models: Every fine-tuned model by name ("dense", "low-res 48px", "random", "evit",
            "tome", "lookwhere").
    """

    task: str
    points: list[OperatingPoint]
    lookwhere: LookWhere
    pretrain_log: list[dict[str, float]]
    models: dict[str, nn.Module] = field(default_factory=dict)

    def by_method(self) -> dict[str, list[OperatingPoint]]:
        out: dict[str, list[OperatingPoint]] = {}
        for point in self.points:
            out.setdefault(point.method, []).append(point)
        return out


def finetune_lookwhere(
    model: LookWhere, task: ImageTask, settings: MethodSettings, progress: bool = False
) -> None:
    """Supervised fine-tuning of the extractor and head, the selector frozen, `k` drawn per step
    from `settings.k_range`. The selector's `requires_grad` flags are restored afterwards (a
    later `pretrain` trains it again)."""
    trainable = {param: param.requires_grad for param in model.selector.parameters()}
    model.selector.requires_grad_(False)
    low, high = settings.k_range

    def forward(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return model(images, k=uniform_k(low, high, generator)).logits

    params = [*model.extractor.parameters(), *model.head.parameters()]
    try:
        train_classifier(
            model,
            task,
            settings.finetune,
            forward=forward,
            params=params,
            progress="finetune lookwhere" if progress else None,
        )
    finally:
        for param, flag in trainable.items():
            param.requires_grad_(flag)
    model.selector.eval()


def run_lookwhere(
    teacher: DenseClassifier,
    train: ImageTask,
    settings: MethodSettings,
    *,
    progress: bool = False,
) -> tuple[LookWhere, list[dict[str, float]]]:
    """LookWhere from `teacher`: label-free distillation, then fine-tuning with the selector
    frozen; the classification head starts from the teacher's."""
    model = lookwhere_from_teacher(
        teacher.vit,
        selector_depth=settings.selector_depth,
        selector_size=settings.selector_size,
        num_classes=teacher.head.out_features,
        k=settings.ks[len(settings.ks) // 2],
    )
    model.head.load_state_dict(teacher.head.state_dict())
    model = model.to(device_of(teacher))
    log = pretrain(
        model,
        teacher.vit,
        train,
        settings.pretrain,
        k_range=settings.k_range,
        progress="pretrain lookwhere" if progress else None,
    )
    finetune_lookwhere(model, train, settings, progress)
    return model.eval(), log


def _copy(teacher: DenseClassifier) -> DenseClassifier:
    """A trainable copy: every baseline fine-tunes all of its weights."""
    return copy.deepcopy(teacher).requires_grad_(True)


def _baseline(cls, teacher: DenseClassifier, *args) -> DenseClassifier:
    """`cls(copy of the teacher's ViT, classes, *args)`, starting from the teacher's head."""
    base = _copy(teacher)
    model = cls(base.vit, base.head.out_features, *args)
    model.head.load_state_dict(base.head.state_dict())
    return model.to(device_of(teacher))


def _finetune(
    model, train: ImageTask, settings: MethodSettings, name: str, progress: bool, forward=None
):
    train_classifier(
        model,
        train,
        settings.finetune,
        forward=forward,
        progress=f"finetune {name}" if progress else None,
    )
    return model.eval()


def run_task(
    teacher: DenseClassifier,
    train: ImageTask,
    test: ImageTask,
    settings: MethodSettings,
    *,
    progress: bool = False,
) -> TaskResult:
    """Fine-tune and judge LookWhere and every baseline from `teacher` on one task."""
    config = teacher.vit.config
    device = device_of(teacher)
    patches = config.grid**2
    low_k, high_k = settings.k_range
    points: list[OperatingPoint] = []

    def point(method, setting, predict, tokens, recall=None):
        result = judge(
            method,
            setting,
            predict,
            test,
            tokens=tokens,
            time_batch=settings.time_batch,
            device=device,
            target_recall=recall,
        )
        logger.info(
            "%s %s %s: %.3f, %.4f GFLOPs",
            test.name,
            method,
            setting,
            result.accuracy,
            result.gflops,
        )
        points.append(result)

    lookwhere, log = run_lookwhere(teacher, train, settings, progress=progress)
    for k in settings.ks:
        recall = target_recall(lookwhere, test, k) if test.name == "sparse" else None
        point("lookwhere", f"k={k}", lambda x, k=k: lookwhere(x, k=k).logits, k, recall)

    models: dict[str, nn.Module] = {"lookwhere": lookwhere}
    dense = models["dense"] = _finetune(_copy(teacher), train, settings, "dense", progress)
    point("dense", "all", dense, patches)

    for size in settings.low_sizes:
        low = _baseline(LowResClassifier, teacher, size)
        models[f"low-res {size}px"] = _finetune(low, train, settings, f"low-res {size}", progress)
        point("low-res", f"{size}px", low, (size // config.patch_size) ** 2)

    random = models["random"] = _baseline(RandomTokenClassifier, teacher, high_k)
    _finetune(
        random, train, settings, "random", progress,
        forward=lambda x, g: random(x, k=uniform_k(low_k, high_k, g), generator=g),
    )  # fmt: skip
    for k in settings.ks:
        point(
            "random",
            f"k={k}",
            lambda x, k=k: random(x, k=k, generator=torch.Generator().manual_seed(0)),
            k,
        )

    evit = models["evit"] = _baseline(EViTClassifier, teacher, settings.evit_rates[0])
    rates = settings.evit_rates

    def evit_forward(x, g):
        rate = min(rates) + (max(rates) - min(rates)) * float(torch.rand((), generator=g))
        return evit(x, keep_rate=rate)

    _finetune(evit, train, settings, "evit", progress, forward=evit_forward)
    for rate in rates:
        point(
            "evit",
            f"keep={rate:g}",
            lambda x, rate=rate: evit(x, keep_rate=rate),
            evit_tokens(patches, rate, evit.locations, config.depth),
        )

    tome = models["tome"] = _baseline(ToMeClassifier, teacher, settings.tome_rs[0])
    rs = settings.tome_rs
    _finetune(
        tome, train, settings, "tome", progress,
        forward=lambda x, g: tome(x, r=uniform_k(min(rs), max(rs), g)),
    )  # fmt: skip
    for r in rs:
        point(
            "tome", f"r={r}", lambda x, r=r: tome(x, r=r), tome_tokens(patches, config.depth, r)[-1]
        )
    return TaskResult(
        task=test.name, points=points, lookwhere=lookwhere, pretrain_log=log, models=models
    )


def evit_tokens(patches: int, rate: float, locations: list[int], depth: int) -> int:
    """Non-prefix tokens (kept plus the fused one) entering EViT's last block (as
    `tome_tokens(...)[-1]` for ToMe): reductions in earlier blocks only."""
    tokens = patches
    for _ in [i for i in locations if i < depth - 1]:
        kept = math.ceil(rate * tokens)
        tokens = kept + 1 if kept < tokens else tokens
    return tokens
