"""The baselines QCS is measured against: full data, random, IFD and LESS.

- **IFD** (instruction-following difficulty, Cherry LLM): ``PPL(response | instruction) /
  PPL(response)`` under the base model; the response-alone perplexity predicts each response
  token from the response tokens before it (the first token has no context and is not scored),
  as Cherry LLM computes it. Examples with IFD ≥ 1 (the instruction does not help: a misaligned
  pair) are ranked last; the rest by IFD, highest first.
- **LESS** (Xia et al.): LoRA warm-up on a random ``warmup_fraction`` of the pool for
  ``warmup_epochs`` epochs with a checkpoint after each; at each checkpoint every pool example's
  gradient of the LoRA parameters is turned into Adam's update direction
  ``m' / sqrt(v' + 1e-8)`` with ``m' = β₁ m + (1 − β₁) g``, ``v' = β₂ v + (1 − β₂) g²`` from the
  checkpoint's optimizer moments, every validation example's plain gradient is kept as is; both
  are projected by a seeded Rademacher matrix and normalised; the score is the checkpoints'
  average (equal learning rates, so equal weights) of the mean cosine to the validation
  gradients; the top examples are chosen.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass

import torch

from qcs.data import TokenizedPairs
from qcs.lm import ResponseScorer
from qcs.selection import Selection, budget_count, seeded
from qcs.train import TrainConfig, finetune, load_lora_state, lora_state, trainable

__all__ = [
    "LessConfig",
    "RademacherProjector",
    "full_selection",
    "ifd_scores",
    "ifd_selection",
    "less_scores",
    "less_selection",
    "random_selection",
]


def random_selection(pool_size: int, budget: float, seed: int = 0) -> Selection:
    """``round(budget · n)`` sequences uniformly at random (seeded)."""
    k = budget_count(budget, pool_size)
    order = torch.randperm(pool_size, generator=seeded(seed, "random"))
    return Selection("random", order[:k], torch.full((pool_size,), k / pool_size), budget,
                     settings={"seed": seed})  # fmt: skip


def full_selection(pool_size: int) -> Selection:
    """Every sequence (budget 1)."""
    return Selection("full", torch.arange(pool_size), torch.ones(pool_size), 1.0)


def _adapters_off(model):
    return (
        model.disable_adapter() if hasattr(model, "disable_adapter") else contextlib.nullcontext()
    )


@torch.no_grad()
def ifd_scores(scorer: ResponseScorer) -> torch.Tensor:
    """``(n,)`` float64 IFD of every example of ``scorer.data`` under the base model."""
    data = scorer.data
    short = [i for i, r in enumerate(data.response_ids) if len(r) < 2]
    if short:
        raise ValueError(f"IFD needs responses of >= 2 tokens; examples {short[:5]} have fewer")
    tails = [r[1:] for r in data.response_ids]
    alone = TokenizedPairs([r[:1] for r in data.response_ids], tails, data.sources, data.answers,
                           data.pad_id, data.prompts)  # fmt: skip
    after_first = TokenizedPairs(
        [torch.cat([p, r[:1]]) for p, r in zip(data.prompt_ids, data.response_ids, strict=True)],
        tails, data.sources, data.answers, data.pad_id, data.prompts,
    )  # fmt: skip
    with _adapters_off(scorer.model):
        conditioned = ResponseScorer(scorer.model, after_first, cache_prefix=False,
                                     batch_size=scorer.batch_size).per_example_loss()  # fmt: skip
        alone_loss = ResponseScorer(scorer.model, alone, cache_prefix=False,
                                    batch_size=scorer.batch_size).per_example_loss()  # fmt: skip
    return torch.exp(conditioned - alone_loss)


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    return torch.argsort(scores, descending=True, stable=True)[:k]


def ifd_selection(scorer: ResponseScorer, budget: float, scores: torch.Tensor | None = None
                  ) -> Selection:  # fmt: skip
    """The ``round(budget · n)`` examples of highest IFD below 1 (see the module docstring);
    ``scores`` reuses IFD computed before (it does not depend on the budget)."""
    start = time.perf_counter()
    scores = ifd_scores(scorer) if scores is None else scores
    k = budget_count(budget, len(scores))
    ranking = torch.where(scores < 1, scores, -scores)  # IFD >= 1 after every IFD < 1
    return Selection("ifd", _top(ranking, k), scores, budget,
                     seconds=time.perf_counter() - start)  # fmt: skip


class RademacherProjector:
    """A seeded ``(dim_in, dim_out)`` matrix of ``±1/√dim_out``, generated block by block (never
    held whole), so ``E[⟨Px, Py⟩] = ⟨x, y⟩`` (Johnson-Lindenstrauss)."""

    def __init__(self, dim_in: int, dim_out: int, seed: int = 0, block: int = 4096) -> None:
        if dim_in < 1 or dim_out < 1:
            raise ValueError(f"dimensions must be positive, got {dim_in} -> {dim_out}")
        self.dim_in, self.dim_out, self.seed, self.block = dim_in, dim_out, seed, block

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``(b, dim_in)`` -> ``(b, dim_out)`` float32, on ``x``'s device (the signs are drawn
        on the CPU, so every device projects alike)."""
        if x.dim() != 2 or x.shape[1] != self.dim_in:
            raise ValueError(f"expected (b, {self.dim_in}), got {tuple(x.shape)}")
        out = torch.zeros(x.shape[0], self.dim_out, device=x.device)
        scale = 1 / math.sqrt(self.dim_out)
        for number, first in enumerate(range(0, self.dim_in, self.block)):
            rows = min(self.block, self.dim_in - first)
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + number)
            signs = torch.randint(0, 2, (rows, self.dim_out), generator=generator, dtype=torch.int8)
            out += x[:, first : first + rows].float() @ (signs.to(x.device).float() * 2 - 1)
        return out * scale


@dataclass(frozen=True)
class LessConfig:
    """LESS's settings: the warm-up share of the pool and its epochs (the paper: 5%, 4), the
    warm-up training, and the projection dimension (LESS: 8192)."""

    warmup_fraction: float = 0.05
    warmup_epochs: int = 4
    train: TrainConfig = TrainConfig(steps=1, batch_size=8, lr=1e-3)
    projection_dim: int = 8192
    beta1: float = 0.9
    beta2: float = 0.999

    def __post_init__(self) -> None:
        if not 0 < self.warmup_fraction <= 1:
            raise ValueError(f"warmup_fraction must be in (0, 1], got {self.warmup_fraction}")
        if self.warmup_epochs < 1 or self.projection_dim < 1:
            raise ValueError("warmup_epochs and projection_dim must be positive")


def _flat_gradient(scorer: ResponseScorer, index: int, params) -> torch.Tensor:
    loss = scorer.weighted_loss([index])
    grads = torch.autograd.grad(loss, params)
    return torch.cat([g.reshape(-1) for g in grads])


def less_scores(pool: ResponseScorer, validation: ResponseScorer, config: LessConfig = LessConfig(),
                *, seed: int = 0) -> torch.Tensor:  # fmt: skip
    """``(n,)`` float64 LESS influence of every pool example on the validation set (see the
    module docstring). The adapters are restored to their initial state on return."""
    if pool.model is not validation.model:
        raise ValueError("pool and validation scorers must share one model")
    model = pool.model
    params = trainable(model)
    initial = lora_state(model)
    n = len(pool.data)
    warm = torch.randperm(n, generator=seeded(seed, "less-warmup"))[
        : budget_count(config.warmup_fraction, n)
    ]
    per_epoch = math.ceil(len(warm) / config.train.batch_size)
    checkpoints: list = []
    train = TrainConfig(steps=per_epoch * config.warmup_epochs,
                        batch_size=config.train.batch_size, lr=config.train.lr,
                        clip_norm=config.train.clip_norm)  # fmt: skip
    projector = RademacherProjector(sum(p.numel() for p in params), config.projection_dim, seed)
    total = torch.zeros(n, dtype=torch.float64)
    try:
        finetune(pool, warm, train, seed=seed, checkpoints=checkpoints, checkpoint_every=per_epoch)
        for state, avg, avg_sq in checkpoints:
            load_lora_state(model, state)
            rows = []
            for i in range(n):
                g = _flat_gradient(pool, i, params)
                m = config.beta1 * avg + (1 - config.beta1) * g
                v = config.beta2 * avg_sq + (1 - config.beta2) * g**2
                rows.append(m / torch.sqrt(v + 1e-8))
            targets = [_flat_gradient(validation, j, params) for j in range(len(validation.data))]
            train_proj = torch.nn.functional.normalize(projector(torch.stack(rows)), dim=1)
            val_proj = torch.nn.functional.normalize(projector(torch.stack(targets)), dim=1)
            total += (train_proj @ val_proj.T).mean(1).double().cpu()
    finally:
        load_lora_state(model, initial)
    return total / len(checkpoints)


def less_selection(pool: ResponseScorer, validation: ResponseScorer, budget: float,
                   config: LessConfig = LessConfig(), *, seed: int = 0,
                   scores: torch.Tensor | None = None) -> Selection:  # fmt: skip
    """The ``round(budget · n)`` pool examples of highest LESS score; ``scores`` reuses scores
    computed before with the same settings (they do not depend on the budget)."""
    start = time.perf_counter()
    scores = less_scores(pool, validation, config, seed=seed) if scores is None else scores
    k = budget_count(budget, len(scores))
    return Selection("less", _top(scores, k), scores, budget,
                     settings=asdict(config) | {"seed": seed},
                     seconds=time.perf_counter() - start)  # fmt: skip
