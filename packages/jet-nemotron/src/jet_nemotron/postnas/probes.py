"""Held-out tasks that score a placement: each is scored by the loss of its answer tokens.

PostNAS scores candidate placements on the tasks the model must keep (the paper scores MMLU by
the loss of the correct answer). Three probes, built from real text or seeded generators:

* ``"lm"``: language modelling on held-out rows (every next token is an answer token);
* ``"retrieval"``: the passkey prompts of :mod:`jet_nemotron.probe` (a number hidden in a real
  filler text), the answer being the number;
* ``"arithmetic"``: few-shot two-digit additions, the answer being the sum.

A probe is a right-padded ``(N, L)`` batch and a mask of the answer positions; a causal model
never sees the padding from an answer position, so the scores are those of each prompt alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from jet_nemotron.probe import passkey_trial

TASKS = ("lm", "retrieval", "arithmetic")


@dataclass(frozen=True)
class Probe:
    """A task's examples.

    Attributes:
        name: the task.
        input_ids: ``(N, L)`` int64, each prompt followed by its answer, right-padded.
        answer_mask: ``(N, L)`` bool, True where the token is an answer token (never column 0).
    """

    name: str
    input_ids: torch.Tensor
    answer_mask: torch.Tensor

    def __post_init__(self) -> None:
        ids, mask = self.input_ids, self.answer_mask
        if ids.dim() != 2 or ids.dtype != torch.long or mask.shape != ids.shape:
            raise ValueError(
                f"probe {self.name!r}: input_ids must be int64 (N, L) with an answer_mask of the "
                f"same shape, got {ids.dtype} {tuple(ids.shape)} and {tuple(mask.shape)}"
            )
        if mask.dtype != torch.bool or mask[:, 0].any() or not mask.any(1).all():
            raise ValueError(
                f"probe {self.name!r}: every example needs answer tokens, none at position 0"
            )


@dataclass(frozen=True)
class ProbeScore:
    """``loss``: mean over examples of the answer tokens' mean cross-entropy (nats);
    ``accuracy``: share of examples whose every answer token is the model's top choice."""

    loss: float
    accuracy: float


def answer_probe(name: str, sequences: Sequence[tuple[list[int], list[int]]]) -> Probe:
    """A probe of ``(prompt token ids, answer token ids)`` pairs (any task of your own)."""
    if not sequences:
        raise ValueError(f"probe {name!r} needs at least one (prompt, answer) pair")
    length = max(len(p) + len(a) for p, a in sequences)
    ids = torch.zeros(len(sequences), length, dtype=torch.long)
    mask = torch.zeros(len(sequences), length, dtype=torch.bool)
    for row, (prompt, answer) in enumerate(sequences):
        ids[row, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
        mask[row, len(prompt) : len(prompt) + len(answer)] = True
    return Probe(name, ids, mask)


def lm_probe(rows: torch.Tensor) -> Probe:
    """Language modelling on ``rows (N, L)``: every token after the first is scored."""
    if rows.dim() != 2 or rows.shape[1] < 2:
        raise ValueError(f"rows must be (N, L >= 2), got {tuple(rows.shape)}")
    mask = torch.ones_like(rows, dtype=torch.bool)
    mask[:, 0] = False
    return Probe("lm", rows.long(), mask)


def retrieval_probe(
    tokenizer: Any, filler: list[str], context_tokens: int, examples: int, seed: int = 0
) -> Probe:
    """Passkey prompts of about ``context_tokens`` tokens; the answer is ``" <key>"``."""
    if examples < 1:
        raise ValueError(f"examples must be >= 1, got {examples}")
    pairs = []
    for index in range(examples):
        trial = passkey_trial(tokenizer, filler, context_tokens, seed + index)
        answer = tokenizer(" " + trial.key, add_special_tokens=False)["input_ids"]
        pairs.append((trial.input_ids[0].tolist(), answer))
    return answer_probe("retrieval", pairs)


def arithmetic_probe(tokenizer: Any, examples: int, seed: int = 0, shots: int = 3) -> Probe:
    """``shots`` solved two-digit additions then a new one; the answer is ``" <sum>"``."""
    if examples < 1 or shots < 0:
        raise ValueError(f"examples must be >= 1 and shots >= 0, got {examples}, {shots}")
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(examples):
        a, b = torch.randint(10, 100, (2, shots + 1), generator=generator).tolist()
        solved = "".join(f"{x} + {y} = {x + y}\n" for x, y in zip(a[:-1], b[:-1], strict=True))
        prompt = tokenizer(f"{solved}{a[-1]} + {b[-1]} =", add_special_tokens=False)["input_ids"]
        answer = tokenizer(f" {a[-1] + b[-1]}", add_special_tokens=False)["input_ids"]
        pairs.append((prompt, answer))
    return answer_probe("arithmetic", pairs)


@torch.no_grad()
def score_probe(model: nn.Module, probe: Probe, batch_size: int = 8) -> ProbeScore:
    """Score a causal LM (``model.model`` the decoder, ``model.lm_head`` the head: Hugging Face
    Llama/Qwen2, :class:`~jet_nemotron.models.modeling.HybridForCausalLM`) on ``probe``.

    Logits are computed at the answer positions only.

    Raises:
        ValueError: ``batch_size < 1``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = next(model.parameters()).device
    losses, hits = [], []
    for ids, mask in zip(probe.input_ids.split(batch_size), probe.answer_mask.split(batch_size),
                         strict=True):  # fmt: skip
        ids, mask = ids.to(device), mask.to(device)
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        targets = mask[:, 1:]
        logits = model.lm_head(hidden[:, :-1][targets]).float()
        answers = ids[:, 1:][targets]
        token_loss = F.cross_entropy(logits, answers, reduction="none")
        token_hit = (logits.argmax(-1) == answers).float()
        row = targets.nonzero()[:, 0]
        count = targets.sum(1).float()
        zeros = torch.zeros(len(ids), device=device)
        losses.append(zeros.index_add(0, row, token_loss) / count)
        hits.append(zeros.index_add(0, row, token_hit) == count)
    return ProbeScore(torch.cat(losses).mean().item(), torch.cat(hits).float().mean().item())


def default_probes(
    tokenizer: Any,
    heldout_rows: torch.Tensor,
    filler: list[str],
    *,
    examples: int = 4,
    retrieval_context: int = 256,
    seed: int = 0,
) -> list[Probe]:
    """The three probes: ``lm`` on ``heldout_rows[:examples]``, ``retrieval`` (``examples``
    passkey prompts of ``retrieval_context`` tokens hidden in ``filler``) and ``arithmetic``
    (``2 · examples`` few-shot additions), seeded by ``seed``.

    Raises:
        ValueError: fewer than ``examples`` held-out rows.
    """
    if len(heldout_rows) < examples:
        raise ValueError(
            f"the lm probe needs {examples} held-out rows, got {len(heldout_rows)}: read more "
            "texts or ask for fewer examples"
        )
    return [
        lm_probe(heldout_rows[:examples]),
        retrieval_probe(tokenizer, filler, retrieval_context, examples, seed),
        arithmetic_probe(tokenizer, 2 * examples, seed),
    ]
