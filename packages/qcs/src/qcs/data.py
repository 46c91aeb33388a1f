"""Instruction-response pairs, their tokenization with response-only loss, and a target task.

A pair is a user instruction and the assistant's response. :func:`tokenize_pairs` renders each
pair with the tokenizer's chat template and keeps the prompt tokens (system + user turn + the
assistant header) apart from the response tokens (the assistant's text and its end-of-turn
tokens): only response tokens carry loss, and only they get token weights.

Sources:

- :func:`sharegpt_pairs`: the first user -> assistant exchange of each real ShareGPT conversation
  (benchdata), empty or non-text exchanges skipped (and counted);
- :func:`read_pairs`: a user's own JSONL in the Alpaca (``instruction`` / ``input`` /
  ``output``) or ShareGPT (``conversations`` of ``from`` / ``value`` turns) format;
- :func:`arithmetic_pairs`: seeded arithmetic and two-step word problems with a short chain of
  thought ending in ``The answer is N.``, the target task of targeted instruction tuning.
"""

from __future__ import annotations

import json
import logging
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = [
    "FORMATS",
    "InstructionPair",
    "TokenizedPairs",
    "arithmetic_pairs",
    "read_pairs",
    "sharegpt_pairs",
    "tokenize_pairs",
]

logger = logging.getLogger(__name__)

FORMATS = ("alpaca", "sharegpt")


@dataclass(frozen=True)
class InstructionPair:
    """One instruction (``prompt``) and its response; ``answer`` is the target task's gold
    answer (``None`` for open-ended pairs); ``source`` names where it came from."""

    prompt: str
    response: str
    source: str = ""
    answer: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str) or not isinstance(self.response, str):
            raise TypeError("prompt and response must be strings")
        if not self.prompt.strip():
            raise ValueError(f"empty prompt in a pair from {self.source or 'the data'!r}")
        if not self.response.strip():
            raise ValueError(
                f"empty response to prompt {self.prompt[:60]!r} ({self.source or 'the data'}): "
                "a pair without response tokens carries no loss"
            )


def sharegpt_pairs(limit: int | None = None, *, path: str | Path | None = None,
                   skip: int = 0) -> list[InstructionPair]:  # fmt: skip
    """First user -> assistant exchanges of ShareGPT conversations (benchdata's packaged file,
    or ``path``), in file order; conversations ``[skip, skip + …)`` until ``limit`` pairs.

    Conversations that do not open with a user turn followed by a non-empty assistant turn are
    skipped and counted in the log.
    """
    from benchdata import sharegpt_conversations

    if limit is not None and limit < 1:
        raise ValueError(f"limit must be None or >= 1, got {limit}")
    if skip < 0:
        raise ValueError(f"skip must be >= 0, got {skip}")
    pairs, skipped = [], 0
    for conversation in sharegpt_conversations(path=path)[skip:]:
        if limit is not None and len(pairs) >= limit:
            break
        turns = [t for t in conversation if t["role"] != "system"]
        if (
            len(turns) < 2
            or turns[0]["role"] != "user"
            or turns[1]["role"] != "assistant"
            or not turns[0]["text"].strip()
            or not turns[1]["text"].strip()
        ):
            skipped += 1
            continue
        pairs.append(InstructionPair(turns[0]["text"].strip(), turns[1]["text"].strip(),
                                     "sharegpt"))  # fmt: skip
    logger.info("ShareGPT: %d pairs, %d conversations skipped", len(pairs), skipped)
    return pairs


def _alpaca(record: dict) -> InstructionPair:
    instruction = record["instruction"]
    extra = record.get("input") or ""
    prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    return InstructionPair(prompt, record["output"], "alpaca")


def _sharegpt(record: dict) -> InstructionPair:
    turns = [t for t in record["conversations"] if t.get("from") not in ("system",)]
    if len(turns) < 2:
        raise ValueError("a conversation needs a user turn and an assistant turn")
    user, assistant = turns[0], turns[1]
    if user.get("from") not in ("human", "user") or assistant.get("from") not in (
        "gpt", "assistant", "chatgpt",
    ):  # fmt: skip
        raise ValueError(
            f"the first turns must be user then assistant, got {user.get('from')!r} then "
            f"{assistant.get('from')!r}"
        )
    return InstructionPair(user["value"], assistant["value"], "sharegpt")


def read_pairs(path: str | Path, format: str = "alpaca") -> list[InstructionPair]:
    """Pairs from a JSONL file, one JSON object a line, in the ``alpaca`` or ``sharegpt`` format.

    A line that does not parse, lacks a field, or has an empty response is an error naming the
    file and line: nothing is dropped silently.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no JSONL file at {path}")
    parse = _alpaca if format == "alpaca" else _sharegpt
    pairs = []
    for number, line in enumerate(path.read_text("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            pairs.append(parse(json.loads(line)))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error.msg})") from None
        except KeyError as error:
            raise ValueError(f"{path}:{number}: missing field {error} ({format} format)") from None
        except (TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"{path}:{number}: {error}") from None
    if not pairs:
        raise ValueError(f"{path} holds no pairs")
    return pairs


_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun")
_ITEMS = ("apples", "books", "stamps", "marbles", "coins", "pencils", "cards", "shells")


def arithmetic_pairs(count: int, seed: int = 0) -> list[InstructionPair]:
    """``count`` seeded arithmetic problems with a short chain of thought (the target task).

    Half are two-digit sums and differences and products by one digit; half are two-step word
    problems (``a + b · c``). Every response ends with ``The answer is N.``; ``answer`` holds ``N``.

    Example:
        >>> arithmetic_pairs(1, seed=0)[0].response.endswith(".")
        True
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    rng = random.Random(seed)
    pairs = []
    for index in range(count):
        if index % 2 == 0:
            op = rng.choice("+-*")
            a, b = rng.randint(10, 99), rng.randint(10, 99) if op != "*" else rng.randint(2, 9)
            if op == "-" and b > a:
                a, b = b, a
            value = a + b if op == "+" else a - b if op == "-" else a * b
            symbol = {"+": "+", "-": "-", "*": "×"}[op]
            prompt = f"What is {a} {symbol} {b}? Think step by step."
            response = f"{a} {symbol} {b} = {value}.\nThe answer is {value}."
        else:
            name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
            a, b, c = rng.randint(2, 30), rng.randint(2, 9), rng.randint(2, 12)
            value = a + b * c
            prompt = (
                f"{name} has {a} {item} and buys {b} packs of {c} {item}. "
                f"How many {item} does {name} have now?"
            )
            response = (
                f"{b} packs of {c} is {b} × {c} = {b * c}.\n"
                f"{a} + {b * c} = {value}.\nThe answer is {value}."
            )
        pairs.append(InstructionPair(prompt, response, "arithmetic", str(value)))
    return pairs


_ANSWER = re.compile(r"answer is:?\s*(-?\d+)")


def extract_answer(text: str) -> str | None:
    """The number after the first ``answer is`` (or ``answer is:``) in a generated text, or
    ``None``."""
    match = _ANSWER.search(text)
    return match.group(1) if match else None


@dataclass
class TokenizedPairs:
    """Tokenized pairs: per example the prompt and response token ids (int64 vectors).

    Attributes:
        prompt_ids: ``n`` vectors of the rendered prompt (system, user turn, assistant header).
        response_ids: ``n`` vectors of the response tokens (the only ones with loss).
        sources: ``n`` source names.
        answers: ``n`` gold answers (``None`` for open-ended pairs).
        noisy_sequence: ``(n,)`` bool, sequences corrupted whole by :func:`qcs.plant_noise`.
        noisy_tokens: ``n`` bool vectors over each response, tokens it injected.
        truncated: ``(n,)`` bool, responses cut at ``max_length``.
        pad_id: the id used to pad batches (never attended to, never scored).
        prompts: the prompt texts (for generation and reports).
    """

    prompt_ids: list[torch.Tensor]
    response_ids: list[torch.Tensor]
    sources: list[str]
    answers: list[str | None]
    pad_id: int
    prompts: list[str]
    noisy_sequence: torch.Tensor = field(default=None)  # type: ignore[assignment]
    noisy_tokens: list[torch.Tensor] = field(default=None)  # type: ignore[assignment]
    truncated: torch.Tensor = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        n = len(self.prompt_ids)
        if not (len(self.response_ids) == len(self.sources) == len(self.answers) == n):
            raise ValueError("prompt_ids, response_ids, sources and answers differ in length")
        if self.noisy_sequence is None:
            self.noisy_sequence = torch.zeros(n, dtype=torch.bool)
        if self.noisy_tokens is None:
            self.noisy_tokens = [torch.zeros(len(r), dtype=torch.bool) for r in self.response_ids]
        if self.truncated is None:
            self.truncated = torch.zeros(n, dtype=torch.bool)
        for i, response in enumerate(self.response_ids):
            if response.numel() == 0:
                raise ValueError(f"example {i} has no response tokens")
            if self.noisy_tokens[i].shape != response.shape:
                raise ValueError(f"noisy_tokens[{i}] does not match its response's length")

    def __len__(self) -> int:
        return len(self.prompt_ids)

    @property
    def response_lengths(self) -> torch.Tensor:
        """``(n,)`` int64: response tokens per example."""
        return torch.tensor([len(r) for r in self.response_ids], dtype=torch.long)

    def subset(self, indices) -> TokenizedPairs:
        """The examples at ``indices``, in that order."""
        idx = [int(i) for i in torch.as_tensor(indices, dtype=torch.long).tolist()]
        if any(i < 0 or i >= len(self) for i in idx):
            raise IndexError(f"indices must lie in [0, {len(self)})")
        return TokenizedPairs(
            [self.prompt_ids[i] for i in idx], [self.response_ids[i] for i in idx],
            [self.sources[i] for i in idx], [self.answers[i] for i in idx], self.pad_id,
            [self.prompts[i] for i in idx], self.noisy_sequence[idx].clone(),
            [self.noisy_tokens[i] for i in idx], self.truncated[idx].clone(),
        )  # fmt: skip

    def batch(self, indices, token_weights: list[torch.Tensor] | None = None) -> dict:
        """A right-padded batch of the examples at ``indices``.

        Returns ``input_ids`` / ``attention_mask`` ``(b, L)``, ``targets`` ``(b, L)`` (the next
        token at each position, ``-100`` where no response token follows) and ``weights``
        ``(b, L)`` float32, each response token's weight (1 without ``token_weights``, which
        holds one vector per *pool* example) at the position that predicts it.
        """
        idx = [int(i) for i in torch.as_tensor(indices, dtype=torch.long).reshape(-1).tolist()]
        if not idx:
            raise ValueError("a batch needs at least one example")
        full = [torch.cat([self.prompt_ids[i], self.response_ids[i]]) for i in idx]
        width = max(len(f) for f in full)
        input_ids = torch.full((len(idx), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(idx), width), dtype=torch.long)
        targets = torch.full((len(idx), width), -100, dtype=torch.long)
        weights = torch.zeros((len(idx), width), dtype=torch.float32)
        for row, (i, ids) in enumerate(zip(idx, full, strict=True)):
            start, end = len(self.prompt_ids[i]), len(ids)
            input_ids[row, :end] = ids
            attention[row, :end] = 1
            # position p predicts token p + 1: response tokens start..end-1 are predicted at
            # positions start-1..end-2
            targets[row, start - 1 : end - 1] = ids[start:end]
            w = 1.0 if token_weights is None else token_weights[i].float()
            weights[row, start - 1 : end - 1] = w
        return {"input_ids": input_ids, "attention_mask": attention, "targets": targets,
                "weights": weights}  # fmt: skip


def _render(tokenizer, pair: InstructionPair) -> tuple[list[int], list[int], str]:
    user = [{"role": "user", "content": pair.prompt}]
    prompt_text = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
    full_text = tokenizer.apply_chat_template(
        [*user, {"role": "assistant", "content": pair.response}], tokenize=False
    )
    if not full_text.startswith(prompt_text):
        raise ValueError(
            "the chat template does not render the prompt as a prefix of the conversation; "
            "response tokens cannot be separated from the prompt"
        )
    prompt = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    full = tokenizer(full_text, add_special_tokens=False)["input_ids"]
    if full[: len(prompt)] != prompt:  # a token merged across the boundary: split the text there
        rest = tokenizer(full_text[len(prompt_text) :], add_special_tokens=False)["input_ids"]
        full = prompt + rest
    return prompt, full[len(prompt) :], prompt_text


def tokenize_pairs(
    pairs: list[InstructionPair],
    tokenizer,
    *,
    max_length: int = 512,
    min_response_tokens: int = 4,
) -> TokenizedPairs:
    """Render pairs with the tokenizer's chat template and split prompt from response tokens.

    A sequence longer than ``max_length`` keeps its whole prompt and loses the end of its
    response (marked in ``truncated``); a pair whose prompt leaves fewer than
    ``min_response_tokens`` response tokens is an error (shorten the prompt or raise
    ``max_length``): nothing is dropped silently.

    Raises:
        ValueError: a tokenizer without a chat template, no pairs, or a prompt too long.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "the tokenizer has no chat template (tokenizer.chat_template is None); instruction "
            "pairs are rendered with it: use an instruct model's tokenizer or set a template"
        )
    if not pairs:
        raise ValueError("no pairs to tokenize")
    if min_response_tokens < 1 or max_length <= min_response_tokens:
        raise ValueError(
            f"need 1 <= min_response_tokens < max_length, got {min_response_tokens}, {max_length}"
        )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompts, responses, texts, truncated = [], [], [], []
    for index, pair in enumerate(pairs):
        prompt, response, text = _render(tokenizer, pair)
        room = max_length - len(prompt)
        if room < min_response_tokens:
            raise ValueError(
                f"pair {index}: its prompt takes {len(prompt)} of max_length={max_length} tokens, "
                f"leaving fewer than {min_response_tokens} for the response"
            )
        truncated.append(len(response) > room)
        prompts.append(torch.tensor(prompt, dtype=torch.long))
        responses.append(torch.tensor(response[:room], dtype=torch.long))
        texts.append(text)
    cut = sum(truncated)
    if cut:
        logger.info("%d of %d responses cut to max_length=%d", cut, len(pairs), max_length)
    return TokenizedPairs(
        prompts, responses, [p.source for p in pairs], [p.answer for p in pairs], pad_id, texts,
        truncated=torch.tensor(truncated, dtype=torch.bool),
    )  # fmt: skip


def fit_pairs(pairs: list[InstructionPair], tokenizer, max_prompt_tokens: int
              ) -> list[InstructionPair]:  # fmt: skip
    """The pairs whose rendered prompt has at most ``max_prompt_tokens`` tokens (a documented
    filter for building small pools; the count dropped is logged)."""
    kept = [p for p in pairs if len(_render(tokenizer, p)[0]) <= max_prompt_tokens]
    if len(kept) < len(pairs):
        logger.info("%d of %d pairs have prompts over %d tokens: left out", len(pairs) - len(kept),
                    len(pairs), max_prompt_tokens)  # fmt: skip
    return kept
