"""Tokenised batches and the tasks of the trainer: fortunes (domain adaptation), generated
arithmetic word problems (exact match), ShareGPT replies (forgetting), corrupted copies (noise).

Example:
    >>> tok = ByteTokenizer()
    >>> batch = lm_batch(tok, ["hello", "hi"], max_len=8, context_len=2)
    >>> batch.input_ids.shape, int(batch.attention_mask[1].sum())
    (torch.Size([2, 5]), 2)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from peft_zoo.noise import char_noise


class ByteTokenizer:
    """UTF-8 bytes as tokens (ids 0–255) plus ``pad``/``eos`` (256/257): the ``tiny`` model's
    tokenizer, offline and deterministic. Implements the call and ``decode`` used here."""

    pad_token_id = 256
    eos_token_id = 257
    vocab_size = 258

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": list(text.encode("utf-8"))}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")


@dataclass
class Batch:
    """Right-padded training batch.

    Attributes:
        input_ids: ``(B, L)`` long.
        attention_mask: ``(B, L)`` long, 1 on real tokens.
        labels: ``(B, L)`` long, -100 where no loss is taken.
        context_mask: ``(B, L)`` long, 1 on the instruction/context part (what prompt methods may
            summarise without seeing targets).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    context_mask: torch.Tensor


def pad_id(tokenizer) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    return pad if pad is not None else tokenizer.eos_token_id


def _pack(tokenizer, pieces: list[tuple[list[int], list[int]]]) -> Batch:
    """Right-pad ``(context ids, target ids)`` pairs; loss on the targets only."""
    length = max(len(c) + len(t) for c, t in pieces)
    ids = torch.full((len(pieces), length), pad_id(tokenizer))
    mask = torch.zeros(len(pieces), length, dtype=torch.long)
    labels = torch.full((len(pieces), length), -100)
    context = torch.zeros(len(pieces), length, dtype=torch.long)
    for i, (c, t) in enumerate(pieces):
        row = torch.tensor(c + t)
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
        labels[i, len(c) : len(row)] = torch.tensor(t)
        context[i, : len(c)] = 1
    return Batch(ids, mask, labels, context)


def lm_batch(tokenizer, texts: list[str], max_len: int, context_len: int) -> Batch:
    """Texts cut to ``max_len`` tokens; the first ``context_len`` are context (no loss)."""
    pieces = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_len]
        pieces.append((ids[:context_len], ids[context_len:]))
    return _pack(tokenizer, pieces)


def qa_batch(tokenizer, pairs: list[tuple[str, str]], eos: bool = True) -> Batch:
    """Question/answer pairs; loss on the answer (and, if ``eos``, an end-of-sequence token)."""
    pieces = []
    for question, answer in pairs:
        q = tokenizer(question, add_special_tokens=False)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"]
        if not q or not a:
            raise ValueError(f"question and answer must both have tokens, got {(question, answer)}")
        pieces.append((q, [*a, tokenizer.eos_token_id] if eos else a))
    return _pack(tokenizer, pieces)


_NAMES = ("Tom", "Ana", "Li", "Sara", "Omar", "Eva", "Raj", "Mia")
_ITEMS = ("apples", "books", "coins", "pens", "cards", "shells")


def arithmetic_problems(count: int, seed: int, max_value: int = 50) -> list[tuple[str, str]]:
    """Generated word problems with one addition or subtraction of numbers in ``[1, max_value]``:
    ``(question, answer)``, the answer a space and the integer (e.g. ``" 12"``)."""
    if max_value < 2:
        raise ValueError(f"max_value must be >= 2, got {max_value}")
    rng = random.Random(seed)
    problems = []
    for _ in range(count):
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        a, b = rng.randint(2, max_value), rng.randint(1, max_value)
        if rng.random() < 0.5:
            question = f"{name} has {a} {item} and gets {b} more. How many {item} now?"
            answer = a + b
        else:
            a, b = max(a, b), min(a, b)
            question = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
            answer = a - b
        problems.append((f"Question: {question}\nAnswer:", f" {answer}"))
    return problems


def corrupt(texts: list[str], fraction: float, char_rate: float, seed: int) -> list[str]:
    """A copy of ``texts`` with ``round(fraction·len)`` of them (chosen at random) passed through
    :func:`~peft_zoo.noise.char_noise` at ``char_rate``."""
    rng = random.Random(seed)
    chosen = set(rng.sample(range(len(texts)), round(fraction * len(texts))))
    return [char_noise(t, char_rate, rng) if i in chosen else t for i, t in enumerate(texts)]


def sharegpt_replies(limit: int, min_chars: int = 200) -> list[str]:
    """Assistant replies from ShareGPT (needs ``benchdata[sharegpt]``)."""
    from benchdata import sharegpt_conversations

    replies = []
    for conversation in sharegpt_conversations(limit=limit * 4):
        for turn in conversation:
            if turn["role"] == "assistant" and len(turn["text"]) >= min_chars:
                replies.append(turn["text"])
                break
        if len(replies) == limit:
            break
    return replies
