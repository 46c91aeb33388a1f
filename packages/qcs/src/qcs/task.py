"""The experiment's data: a noisy instruction pool with a target task inside, and clean sets.

:func:`build_task` assembles, from real ShareGPT exchanges and the seeded arithmetic task
(:func:`qcs.arithmetic_pairs`):

- ``pool``: ShareGPT pairs plus target-task items, shuffled, with planted sequence and token
  noise (:func:`qcs.plant_noise`) on a documented share of the pool;
- ``validation``: a small clean target-task set, what selection aims at (targeted instruction
  tuning, as LESS and QCS's targeted setting);
- ``heldout``: clean ShareGPT pairs never in the pool (general quality) and the clean target test
  set (target loss);
- ``target_test``: the target test set for exact match of generated answers.

Seeds: the pool's arithmetic items use ``seed``, the validation set ``seed + 1``, the test set
``seed + 2``, so the three sets are drawn independently.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from qcs.data import (
    InstructionPair,
    TokenizedPairs,
    arithmetic_pairs,
    fit_pairs,
    sharegpt_pairs,
    tokenize_pairs,
)
from qcs.noise import plant_noise

__all__ = ["Task", "TaskSettings", "build_task"]


@dataclass(frozen=True)
class TaskSettings:
    """Sizes and noise of :func:`build_task` (all counts are examples)."""

    pool_general: int = 160
    pool_target: int = 40
    validation: int = 16
    heldout: int = 48
    target_test: int = 40
    max_length: int = 128
    max_prompt_tokens: int = 64
    sequence_noise: float = 0.2
    token_noise: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("pool_general", "validation", "heldout", "target_test", "max_length",
                     "max_prompt_tokens"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.pool_target < 0:
            raise ValueError(f"pool_target must be >= 0, got {self.pool_target}")
        if self.max_prompt_tokens >= self.max_length:
            raise ValueError("max_prompt_tokens must be below max_length")


@dataclass
class Task:
    pool: TokenizedPairs
    validation: TokenizedPairs
    heldout: dict[str, TokenizedPairs]
    target_test: TokenizedPairs


def build_task(tokenizer, settings: TaskSettings = TaskSettings(), *,
               general: list[InstructionPair] | None = None) -> Task:  # fmt: skip
    """Build the pool and the clean sets (see the module docstring). ``general``: your own
    pairs instead of ShareGPT (the first ``pool_general`` form the pool, the next ``heldout``
    the held-out set)."""
    need = settings.pool_general + settings.heldout
    if general is None:
        # ShareGPT pairs whose prompts fit, in file order: enough for pool and held-out
        general = fit_pairs(sharegpt_pairs(limit=6 * need), tokenizer, settings.max_prompt_tokens)
    if len(general) < need:
        raise ValueError(f"{len(general)} general pairs fit max_prompt_tokens="
                         f"{settings.max_prompt_tokens}; the task needs {need}")  # fmt: skip
    seed = settings.seed
    pool_pairs = general[: settings.pool_general] + (
        arithmetic_pairs(settings.pool_target, seed) if settings.pool_target else []
    )
    random.Random(seed).shuffle(pool_pairs)

    def tokenize(pairs):
        return tokenize_pairs(pairs, tokenizer, max_length=settings.max_length)

    pool = plant_noise(
        tokenize(pool_pairs), sequence_fraction=settings.sequence_noise,
        token_fraction=settings.token_noise, vocab_size=len(tokenizer),
        special_ids=tuple(tokenizer.all_special_ids), seed=seed,
    )  # fmt: skip
    target_test = tokenize(arithmetic_pairs(settings.target_test, seed + 2))
    return Task(
        pool=pool,
        validation=tokenize(arithmetic_pairs(settings.validation, seed + 1)),
        heldout={"general": tokenize(general[settings.pool_general : need]), "target": target_test},
        target_test=target_test,
    )
