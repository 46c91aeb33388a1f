"""One entry point for every method, and one way to judge a selection.

:class:`Workbench` wraps a copy of the model with LoRA once, caches the frozen prefix of every
example once (:class:`qcs.ResponseScorer`), and resets the adapters before each method and each
evaluation, so all methods see the same model, data and initial adapters. :func:`select` is the
one-call form.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import replace

import torch

from qcs.baselines import (
    LessConfig,
    full_selection,
    ifd_selection,
    less_selection,
    random_selection,
)
from qcs.data import TokenizedPairs
from qcs.lm import LoraSettings, ResponseScorer, add_lora
from qcs.selection import Selection
from qcs.solver import QCSConfig, run_qcs
from qcs.train import TrainConfig, exact_match, finetune, load_lora_state, lora_state

__all__ = ["METHODS", "Workbench", "noise_metrics", "select"]

METHODS = ("qcs", "qcs-seq", "less", "ifd", "random", "full")


class Workbench:
    """A model with LoRA adapters, a pool, a validation (target) set and held-out sets.

    Args:
        model: a Hugging Face causal LM (not modified: a copy is wrapped).
        pool: the candidate training examples.
        validation: the small set selection aims at (QCS's outer loss, LESS's targets).
        lora: the adapters (``layers`` set: only the top layers train, and the frozen prefix of
            every example is cached).
        heldout: named evaluation sets, scored by mean response-token loss.
    """

    def __init__(self, model, pool: TokenizedPairs, validation: TokenizedPairs,
                 lora: LoraSettings = LoraSettings(), *,
                 heldout: dict[str, TokenizedPairs] | None = None, seed: int = 0,
                 batch_size: int = 16) -> None:  # fmt: skip
        for name, data in (("pool", pool), ("validation", validation)):
            if not isinstance(data, TokenizedPairs):
                raise TypeError(f"{name} must be TokenizedPairs (see qcs.tokenize_pairs)")
            if len(data) == 0:
                raise ValueError(f"the {name} set is empty")
        self.model = add_lora(copy.deepcopy(model), lora, seed)
        self.model.eval()
        self.initial = lora_state(self.model)
        self.pool = ResponseScorer(self.model, pool, batch_size=batch_size)
        self.validation = ResponseScorer(self.model, validation, batch_size=batch_size)
        self.heldout = {name: ResponseScorer(self.model, data, batch_size=batch_size)
                        for name, data in (heldout or {}).items()}  # fmt: skip
        self.seed = seed
        # IFD and LESS scores do not depend on the budget: computed once per settings
        self._scores: dict[tuple, tuple[torch.Tensor, float]] = {}

    def forget_scores(self) -> None:
        """Drop the cached IFD / LESS scores (the next selection computes them again)."""
        self._scores.clear()

    def reset(self) -> None:
        """Adapters back to their initial state (the untrained model)."""
        load_lora_state(self.model, self.initial)

    def select(self, method: str, budget: float, *, config: QCSConfig | None = None,
               less: LessConfig = LessConfig(), seed: int | None = None,
               progress: bool | None = False) -> Selection:  # fmt: skip
        """One method's selection at ``budget`` (``config`` sets QCS; its budget and, for
        ``qcs-seq``, its token level are overridden)."""
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
        seed = self.seed if seed is None else seed
        self.reset()
        n = len(self.pool.data)
        start = time.perf_counter()
        if method in ("qcs", "qcs-seq"):
            config = replace(config or QCSConfig(), budget=budget,
                             token_level=method == "qcs")  # fmt: skip
            selection = run_qcs(self.pool, self.validation, config, seed=seed, progress=progress)
        elif method in ("less", "ifd"):
            key = ("less", less, seed) if method == "less" else ("ifd",)
            cached = self._scores.get(key)
            scores = None if cached is None else cached[0]
            if method == "less":
                selection = less_selection(self.pool, self.validation, budget, less, seed=seed,
                                           scores=scores)  # fmt: skip
            else:
                selection = ifd_selection(self.pool, budget, scores)
            if cached is None:
                self._scores[key] = (selection.scores, selection.seconds)
            else:  # the cost of this selection is the scoring it reuses
                selection.seconds = cached[1]
        elif method == "random":
            selection = random_selection(n, budget, seed)
        else:
            selection = full_selection(n)
        self.reset()
        if method not in ("less", "ifd"):
            selection.seconds = time.perf_counter() - start
        return selection

    def finetune(self, selection: Selection, train: TrainConfig, *, epochs: int | None = None,
                 seed: int | None = None) -> list[float]:  # fmt: skip
        """Reset, then train the adapters on ``selection`` (with its token weights).
        ``epochs`` (when set) replaces ``train.steps`` by ``epochs · ⌈k / batch_size⌉``."""
        if selection.pool_size != len(self.pool.data):
            raise ValueError(f"the selection is over a pool of {selection.pool_size}, "
                             f"this pool has {len(self.pool.data)}")  # fmt: skip
        if epochs is not None:
            steps = epochs * math.ceil(len(selection) / train.batch_size)
            train = replace(train, steps=steps)
        self.reset()
        weights = selection.weights_for(self.pool.data.response_lengths)
        return finetune(self.pool, selection.indices, train, token_weights=weights,
                        seed=self.seed if seed is None else seed)  # fmt: skip

    def evaluate(self, selection: Selection, train: TrainConfig, *, epochs: int | None = None,
                 target: TokenizedPairs | None = None, tokenizer=None,
                 seed: int | None = None) -> dict[str, float | None]:  # fmt: skip
        """Fine-tune fresh adapters on ``selection``, then measure: the loss on every held-out
        set, the validation loss, the target task's exact match (with ``target`` and
        ``tokenizer``) and the planted-noise metrics (:func:`noise_metrics`)."""
        losses = self.finetune(selection, train, epochs=epochs, seed=seed)
        row: dict[str, float | None] = {
            "method": selection.method, "budget": selection.budget, "size": len(selection),
            "select_seconds": selection.seconds, "train_steps": len(losses),
            "val_loss": self.validation.mean_loss(),
        }  # fmt: skip
        for name, scorer in self.heldout.items():
            row[f"{name}_loss"] = scorer.mean_loss()
        if target is not None:
            if tokenizer is None:
                raise ValueError("exact match on the target task needs the tokenizer")
            row["target_exact_match"] = exact_match(self.model, tokenizer, target)
        row |= noise_metrics(self.pool.data, selection)
        self.reset()
        return row


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def noise_metrics(pool: TokenizedPairs, selection: Selection) -> dict[str, float | None]:
    """How a selection treats the planted noise of ``pool``.

    - sequences: ``exclusion_precision`` (noisy among the excluded), ``exclusion_recall`` (noisy
      sequences excluded), ``selected_clean`` (clean among the selected; the pool's clean rate
      is ``pool_clean``);
    - tokens, inside the selected sequences: ``downweight_precision`` (garbage among the tokens
      given weight below 1/2) and ``downweight_recall`` (garbage tokens given weight below 1/2;
      0 for a method without token weights). ``None`` where the denominator is empty.
    """
    if selection.pool_size != len(pool):
        raise ValueError(f"the selection is over a pool of {selection.pool_size}, "
                         f"not this one of {len(pool)}")  # fmt: skip
    chosen = torch.zeros(len(pool), dtype=torch.bool)
    chosen[selection.indices] = True
    noisy = pool.noisy_sequence
    excluded = ~chosen
    out = {
        "exclusion_precision": _ratio(float((noisy & excluded).sum()), float(excluded.sum())),
        "exclusion_recall": _ratio(float((noisy & excluded).sum()), float(noisy.sum())),
        "selected_clean": float((~noisy & chosen).sum()) / float(chosen.sum()),
        "pool_clean": float((~noisy).float().mean()),
    }
    weights = selection.weights_for(pool.response_lengths)
    garbage = down = garbage_down = 0.0
    for i in selection.indices.tolist():
        marks = pool.noisy_tokens[i]
        low = torch.zeros_like(marks) if weights is None else weights[i] < 0.5
        garbage += float(marks.sum())
        down += float(low.sum())
        garbage_down += float((marks & low).sum())
    out["downweight_precision"] = _ratio(garbage_down, down)
    out["downweight_recall"] = _ratio(garbage_down, garbage)
    return out


def select(dataset: TokenizedPairs, model, budget: float = 0.05, token_ratio: float = 0.5, *,
           validation: TokenizedPairs, method: str = "qcs", epsilon: float = 0.1,
           config: QCSConfig | None = None, lora: LoraSettings = LoraSettings(),
           less: LessConfig = LessConfig(), seed: int = 0,
           progress: bool | None = False) -> Selection:  # fmt: skip
    """Select a coreset of ``dataset`` for instruction tuning ``model`` towards ``validation``.

    Args:
        dataset: the pool (:func:`qcs.tokenize_pairs`).
        model: a Hugging Face causal LM (a copy gets LoRA adapters; ``model`` is unchanged).
        budget: sequences kept, a fraction of the pool in ``(0, 1]``.
        token_ratio: QCS's share of each response's tokens kept at weight ``1 − ε``.
        validation: the target set the selection should help.
        method: one of :data:`METHODS`.
        epsilon: QCS's elastic weight ``ε``.
        config: further QCS settings (its budget, ratio and ``ε`` are set from the arguments).

    Example:
        >>> selection = select(pool, model, 0.05, validation=target_val)  # doctest: +SKIP
        >>> selection.indices, selection.token_weights  # doctest: +SKIP
    """
    config = replace(config or QCSConfig(), budget=budget, token_ratio=token_ratio,
                     epsilon=epsilon)  # fmt: skip
    bench = Workbench(model, dataset, validation, lora, seed=seed)
    return bench.select(method, budget, config=config, less=less, seed=seed, progress=progress)
