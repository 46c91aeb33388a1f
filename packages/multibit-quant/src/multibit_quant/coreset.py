"""Importance scores and coreset selection, per bit-width.

Scores of every training example under one child model (one bit-width), larger = more important:

* ``"el2n"``: ``‖softmax(f(x)) − onehot(y)‖₂`` (Paul et al., 2021).
* ``"grad_norm"``: the norm of the loss gradient of the classifier layer (weight and bias),
  ``‖p − y‖₂·sqrt(‖h‖² + 1)`` for its input features ``h`` (``‖p − y‖₂·‖h‖₂`` without a bias):
  the exact per-example gradient norm of that layer, computed without per-example backward
  passes (GraNd restricted to the last layer).
* ``"forgetting"``: how often an example went from correct to wrong between two of its
  presentations in training (Toneva et al., 2019), never-learned examples (presented, never
  correct) first; counted from the predictions the training steps make anyway, so it needs no
  scoring pass. An example not presented yet at that bit-width (outside its subsets so far) has
  no count: it gets the mean score of the presented ones, neither ranked as never learned nor
  ruled out.
* ``"random"``: uniform noise (the random-subset baseline).

:func:`select` keeps a fraction of the examples: the highest scores (``"top"``), or a random
subset drawn without replacement with probability proportional to the score (``"sample"``,
Gumbel top-k), which keeps some easy examples at high pruning rates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

SCORES = ("el2n", "grad_norm", "forgetting", "random")
MODES = ("sample", "top")


def check_fraction(fraction: object) -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise ValueError(f"coreset fraction must be a number in (0, 1], got {fraction!r}")
    if not 0 < fraction <= 1:
        raise ValueError(f"coreset fraction must be in (0, 1], got {fraction!r}")
    return float(fraction)


def _last_linear(model: nn.Module) -> nn.Linear:
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("grad_norm scores need a final nn.Linear classifier")
    return linears[-1]


@torch.no_grad()
def predictions(
    model: nn.Module, images: torch.Tensor, batch_size: int = 512, features: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Softmax outputs ``(N, classes)`` in eval mode and, if asked, the classifier's inputs."""
    was_training = model.training
    model.eval()
    captured: list[torch.Tensor] = []
    handle = None
    if features:
        handle = _last_linear(model).register_forward_hook(
            lambda module, args, out: captured.append(args[0].detach().flatten(1))
        )
    device = next(model.parameters()).device
    try:
        probs = [
            model(images[i : i + batch_size].to(device)).float().softmax(-1).cpu()
            for i in range(0, len(images), batch_size)
        ]
    finally:
        if handle is not None:
            handle.remove()
        model.train(was_training)
    feats = torch.cat(captured).cpu() if features else None
    return torch.cat(probs), feats


def el2n(probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``‖p − onehot(y)‖₂`` per example."""
    return (probs - F.one_hot(labels, probs.shape[1]).float()).norm(dim=1)


def last_layer_grad_norm(
    probs: torch.Tensor, labels: torch.Tensor, feats: torch.Tensor, bias: bool = True
) -> torch.Tensor:
    """Per-example norm of the cross-entropy gradient of a linear classifier's weight and, if it
    has one (``bias``), its bias: the gradients are ``(p − y) hᵀ`` and ``p − y``, so the norm is
    ``‖p − y‖·sqrt(‖h‖² + 1)``, or ``‖p − y‖·‖h‖`` without a bias."""
    return el2n(probs, labels) * (feats.square().sum(1) + float(bias)).sqrt()


class ForgettingTracker:
    """Counts forgetting events (correct at one presentation, wrong at the next) per example."""

    def __init__(self, size: int) -> None:
        self.events = torch.zeros(size, dtype=torch.long)
        self.ever_correct = torch.zeros(size, dtype=torch.bool)
        self.last_correct = torch.zeros(size, dtype=torch.bool)
        self.seen = torch.zeros(size, dtype=torch.bool)

    def update(self, correct: torch.Tensor, indices: torch.Tensor | None = None) -> None:
        """Record the predictions of the examples ``indices`` (default: all, in order)."""
        if indices is None:
            indices = torch.arange(len(self.events))
        forgotten = self.seen[indices] & self.last_correct[indices] & ~correct
        self.events.index_add_(0, indices, forgotten.long())
        self.ever_correct[indices] |= correct
        self.last_correct[indices] = correct
        self.seen[indices] = True

    def scores(self) -> torch.Tensor:
        """Events per presented example, never-learned ones (presented, never correct) above
        every learned one; examples never presented get the mean score of the presented ones
        (0 for all if none was): their count carries no information, so they neither displace
        the examples known to be hard nor are they excluded."""
        events = self.events.float()
        never_learned = self.seen & ~self.ever_correct
        scores = torch.where(never_learned, events + len(self.events) + 1.0, events)
        if self.seen.any():
            scores[~self.seen] = scores[self.seen].mean()
        return scores


def importance_scores(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    score: str,
    generator: torch.Generator | None = None,
    tracker: ForgettingTracker | None = None,
    batch_size: int = 512,
) -> torch.Tensor:
    """Scores ``(N,)`` of every example under ``model`` as it runs now (its current bit-width);
    ``"forgetting"`` reads ``tracker`` (fed during training) and runs no model."""
    if score not in SCORES:
        raise ValueError(f"unknown score {score!r}; choose one of {SCORES}")
    if score == "random":
        return torch.rand(len(labels), generator=generator)
    if score == "forgetting":
        if tracker is None:
            raise ValueError("forgetting scores need a ForgettingTracker fed during training")
        return tracker.scores()
    probs, feats = predictions(model, images, batch_size, features=score == "grad_norm")
    if score == "el2n":
        return el2n(probs, labels)
    return last_layer_grad_norm(probs, labels, feats, bias=_last_linear(model).bias is not None)


def select(
    scores: torch.Tensor, fraction: float, mode: str = "sample", generator=None
) -> torch.Tensor:
    """Sorted indices of ``ceil(fraction·N)`` examples chosen by ``scores`` (see the module)."""
    fraction = check_fraction(fraction)
    if mode not in MODES:
        raise ValueError(f"unknown selection mode {mode!r}; choose one of {MODES}")
    size = math.ceil(fraction * len(scores))
    if mode == "top":  # the highest scores; ties broken at random, not by index
        order = torch.randperm(len(scores), generator=generator)
        ranked = order[torch.sort(scores[order].double(), descending=True, stable=True).indices]
        return ranked[:size].sort().values
    # Gumbel top-k: a weighted sample without replacement, weights = scores
    weights = scores.double().clamp_min(0) + 1e-12
    uniform = torch.rand(len(scores), generator=generator, dtype=torch.float64)
    keys = weights.log() - (-uniform.clamp_min(1e-300).log()).log()
    return keys.topk(size).indices.sort().values


class BitwiseCoreset:
    """One subset per bit-width, re-selected every ``resample_every`` epochs from the scores of
    that bit-width's child model."""

    def __init__(
        self,
        size: int,
        bits: Iterable[int],
        fraction: float,
        score: str = "el2n",
        mode: str = "sample",
        resample_every: int = 1,
        seed: int = 0,
    ) -> None:
        if score not in SCORES:
            raise ValueError(f"unknown score {score!r}; choose one of {SCORES}")
        if mode not in MODES:
            raise ValueError(f"unknown selection mode {mode!r}; choose one of {MODES}")
        if not isinstance(resample_every, int) or resample_every < 1:
            raise ValueError(f"resample_every must be a positive integer, got {resample_every!r}")
        self.fraction = check_fraction(fraction)
        self.score, self.mode, self.resample_every = score, mode, resample_every
        self.bits = tuple(bits)
        self.generator = torch.Generator().manual_seed(seed)
        self.trackers = {b: ForgettingTracker(size) for b in self.bits}
        # before any model exists to score with: random subsets
        self.subsets = {
            b: select(torch.rand(size, generator=self.generator), self.fraction, "top")
            for b in self.bits
        }
        self.scoring_passes = 0

    def due(self, epoch: int) -> bool:
        """Whether the subsets are re-selected before ``epoch`` (0-based; never before 0)."""
        return epoch > 0 and epoch % self.resample_every == 0

    def observe(self, bits: int, indices: torch.Tensor, correct: torch.Tensor) -> None:
        """Training predictions of ``indices`` at ``bits`` (for forgetting scores)."""
        if self.score == "forgetting":
            self.trackers[bits].update(correct, indices)

    def refresh(self, model, images: torch.Tensor, labels: torch.Tensor) -> int:
        """Score every example at every bit-width and select each bit-width's subset; returns
        the forward passes it ran (none for random and forgetting scores)."""
        for b in self.bits:
            with model.bits_as(b):
                scores = importance_scores(
                    model, images, labels, self.score, self.generator, self.trackers[b]
                )
            self.subsets[b] = select(scores, self.fraction, self.mode, self.generator)
        self.scoring_passes += 1
        return len(labels) * len(self.bits) if self.score in ("el2n", "grad_norm") else 0
