"""Request traces: build them from multi-turn conversations, save and load them as JSONL.

A trace is a time-ordered list of :class:`Request` s. Each request is one user turn of a
conversation: its prompt is the whole conversation so far (every earlier turn plus the new user
turn), tokenized turn by turn and concatenated, so the prompt of turn ``k + 1`` starts with the
prompt of turn ``k`` followed by the reply to it.

JSONL format (one request per line, UTF-8; blank lines are ignored)::

    {
        "time": 12.5,
        "conversation_id": "c17",
        "turn": 0,
        "prompt_token_ids": [9906, 11, ...],
        "output_tokens": 231,
        "last_turn": false,
        "user_text": "optional: the new user prompt",
    }

``time`` is the arrival time in seconds (non-negative, lines in non-decreasing order),
``turn`` counts the conversation's user turns from 0, ``output_tokens`` is the length of the
recorded reply, ``last_turn`` says that no further user turn of this conversation follows (the
label the continuation predictor learns); within a conversation turns increase and no request
follows one marked ``last_turn``. ``user_text`` is optional; the predictor needs it.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kernels_common.cli import atomic_file

logger = logging.getLogger(__name__)

_REQUIRED = {
    "time": (int, float),
    "conversation_id": (str,),
    "turn": (int,),
    "prompt_token_ids": (list,),
    "output_tokens": (int,),
    "last_turn": (bool,),
}


@dataclass(frozen=True, eq=False)
class Request:
    """One user turn of a conversation.

    Attributes:
        time: arrival time in seconds.
        conversation_id: the conversation this turn belongs to.
        turn: index of this user turn in its conversation (0, 1, ...).
        prompt: int32 ``(prompt_len,)`` token ids, read-only; the conversation so far.
        output_tokens: number of tokens of the reply.
        last_turn: no further user turn of this conversation follows.
        user_text: the new user prompt, or None when the trace does not carry it.
    """

    time: float
    conversation_id: str
    turn: int
    prompt: np.ndarray
    output_tokens: int
    last_turn: bool
    user_text: str | None = None

    def to_json(self) -> dict:
        record = {
            "time": self.time,
            "conversation_id": self.conversation_id,
            "turn": self.turn,
            "prompt_token_ids": self.prompt.tolist(),
            "output_tokens": self.output_tokens,
            "last_turn": self.last_turn,
        }
        if self.user_text is not None:
            record["user_text"] = self.user_text
        return record


@dataclass(eq=False)
class Trace:
    """A time-ordered list of requests (``trace.requests``), with per-block-size caches of the
    simulator's preprocessing (filled by :mod:`lpc_cache.simulator`)."""

    requests: list[Request]
    prepared: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        times = [r.time for r in self.requests]
        if any(b < a for a, b in itertools.pairwise(times)):
            raise ValueError("trace requests must be in non-decreasing time order")

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def conversations(self) -> list[str]:
        """Conversation ids in order of first appearance."""
        return list(dict.fromkeys(r.conversation_id for r in self.requests))

    def subset(self, conversation_ids: Iterable[str]) -> Trace:
        """The requests of the given conversations only (times unchanged)."""
        keep = set(conversation_ids)
        return Trace([r for r in self.requests if r.conversation_id in keep])

    @property
    def prompt_tokens(self) -> int:
        return int(sum(len(r.prompt) for r in self.requests))


@dataclass(frozen=True)
class TraceConfig:
    """How conversations become a timed trace.

    Attributes:
        arrival_rate: new conversations per second (Poisson process).
        mean_gap_s: mean of the exponential gap between a conversation's user turns (the paper:
            100 s).
        max_concurrent: at most this many conversations are active at once (the paper: 200); a
            new conversation waits for a free slot.
        max_prompt_tokens: a conversation ends before the first turn whose prompt would exceed
            this many tokens (a serving context limit).
        seed: seed of the arrival and gap draws.
    """

    arrival_rate: float = 1.0
    mean_gap_s: float = 100.0
    max_concurrent: int = 200
    max_prompt_tokens: int = 8192
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.arrival_rate > 0 and math.isfinite(self.arrival_rate)):
            raise ValueError(f"arrival_rate must be a positive number, got {self.arrival_rate}")
        if not (self.mean_gap_s >= 0 and math.isfinite(self.mean_gap_s)):
            raise ValueError(f"mean_gap_s must be a non-negative number, got {self.mean_gap_s}")
        if self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {self.max_concurrent}")
        if self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")


ROLE_HEADERS = {"system": "<|system|>\n", "user": "<|user|>\n", "assistant": "<|assistant|>\n"}


def turn_text(turn: dict) -> str:
    """The text a turn contributes to the prompt: a role header, then the turn's text."""
    return ROLE_HEADERS.get(turn["role"], "") + turn["text"]


def conversation_requests(
    turns: Sequence[dict], pieces: Sequence[Sequence[int]], max_prompt_tokens: int
) -> list[tuple[np.ndarray, int, str]]:
    """Untimed requests of one conversation: ``(prompt, output_tokens, user_text)`` per user turn.

    Every turn is tokenized on its own (:func:`turn_text`); prompts are prefixes of one token
    array (views, no copies). A user turn with no reply still makes a request (output 0 tokens).

    Args:
        turns: ``[{"role": "user" | "assistant" | "system", "text": str}, ...]``.
        pieces: the token ids of :func:`turn_text` of each turn.
        max_prompt_tokens: stop before the first prompt longer than this.
    """
    if not turns:
        return []
    tokens = np.fromiter(
        (tok for piece in pieces for tok in piece), dtype=np.int32, count=sum(map(len, pieces))
    )
    tokens.flags.writeable = False
    ends = np.cumsum([len(p) for p in pieces])
    out = []
    for i, turn in enumerate(turns):
        if turn["role"] != "user":
            continue
        end = int(ends[i])
        if end > max_prompt_tokens:
            break
        reply = 0
        for j in range(i + 1, len(turns)):
            if turns[j]["role"] == "user":
                break
            reply += len(pieces[j])
        out.append((tokens[:end], reply, turn["text"]))
    return out


def build_trace(
    conversations: Sequence[Sequence[dict]],
    encode: Callable[[list[str]], list[list[int]]],
    config: TraceConfig = TraceConfig(),
    *,
    ids: Sequence[str] | None = None,
) -> Trace:
    """Time a list of conversations into a trace.

    New conversations arrive as a Poisson process of rate ``config.arrival_rate``; a conversation
    starts at its arrival or, when ``max_concurrent`` are active, when the first of them ends. Its
    user turns follow each other after exponential gaps of mean ``mean_gap_s``.

    Args:
        conversations: ShareGPT-style lists of ``{"role", "text"}`` turns.
        encode: batch tokenizer (e.g. ``tiktoken.Encoding.encode_batch``).
        config: arrival process.
        ids: conversation ids (default ``"c<index>"``).
    """
    if ids is not None and len(ids) != len(conversations):
        raise ValueError(f"{len(ids)} ids for {len(conversations)} conversations")
    rng = np.random.default_rng(config.seed)
    # one batch call for every turn of every conversation: tokenizers parallelise it
    pieces = encode([turn_text(t) for turns in conversations for t in turns])
    offset = 0
    active: list[float] = []  # end times of active conversations
    clock = 0.0
    requests = []
    for index, turns in enumerate(conversations):
        own = pieces[offset : offset + len(turns)]
        offset += len(turns)
        turns_requests = conversation_requests(turns, own, config.max_prompt_tokens)
        if not turns_requests:
            continue
        clock += rng.exponential(1.0 / config.arrival_rate)
        while active and active[0] <= clock:
            heapq.heappop(active)
        start = clock
        if len(active) >= config.max_concurrent:
            start = heapq.heappop(active)
        time = start
        cid = ids[index] if ids is not None else f"c{index}"
        for turn, (prompt, output, text) in enumerate(turns_requests):
            if turn:
                time += rng.exponential(config.mean_gap_s)
            last = turn == len(turns_requests) - 1
            requests.append(Request(time, cid, turn, prompt, output, last, text))
        heapq.heappush(active, time)
    requests.sort(key=lambda r: r.time)
    return Trace(requests)


def save_trace(trace: Trace, path: str | Path) -> Path:
    """Write ``trace`` as JSONL (format in the module docstring). The file appears whole or not
    at all: it is written under a temporary name and renamed."""
    path = Path(path)
    with atomic_file(path) as temporary, temporary.open("w", encoding="utf-8") as file:
        for request in trace.requests:
            file.write(json.dumps(request.to_json(), ensure_ascii=False) + "\n")
    return path


def _parse(line: str, where: str) -> Request:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not valid JSON ({error.msg})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key, types in _REQUIRED.items():
        if key not in record:
            raise ValueError(f"{where}: missing field {key!r} (required: {sorted(_REQUIRED)})")
        value = record[key]
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            names = " or ".join(t.__name__ for t in types)
            raise ValueError(f"{where}: field {key!r} must be {names}, got {value!r:.40}")
    time, ids = float(record["time"]), record["prompt_token_ids"]
    if not (math.isfinite(time) and time >= 0):
        raise ValueError(f"{where}: time must be a finite number >= 0, got {time}")
    if record["turn"] < 0 or record["output_tokens"] < 0:
        raise ValueError(f"{where}: turn and output_tokens must be >= 0")
    if not ids or not all(type(t) is int and 0 <= t < 2**31 for t in ids):
        raise ValueError(f"{where}: prompt_token_ids must be a non-empty list of ints in [0, 2^31)")
    text = record.get("user_text")
    if text is not None and not isinstance(text, str):
        raise ValueError(f"{where}: user_text must be a string when present")
    prompt = np.asarray(ids, dtype=np.int32)
    prompt.flags.writeable = False
    return Request(
        time,
        record["conversation_id"],
        record["turn"],
        prompt,
        record["output_tokens"],
        record["last_turn"],
        text,
    )


def load_trace(path: str | Path) -> Trace:
    """Read a JSONL trace; a malformed line raises ``ValueError`` naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no trace file at {path}")
    requests: list[Request] = []
    seen: dict[str, Request] = {}  # the latest request of each conversation
    with path.open("rb") as file:
        for number, raw in enumerate(file, 1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{where}: not UTF-8 text (is this a JSONL trace?)") from None
            if not line.strip():
                continue
            request = _parse(line, where)
            if requests and request.time < requests[-1].time:
                raise ValueError(f"{where}: time {request.time} is earlier than the line before")
            before = seen.get(request.conversation_id)
            if before is not None and before.last_turn:
                raise ValueError(
                    f"{where}: conversation {request.conversation_id!r} continues after a "
                    "request marked last_turn"
                )
            if before is not None and request.turn <= before.turn:
                raise ValueError(
                    f"{where}: turn {request.turn} of conversation {request.conversation_id!r} "
                    f"does not follow turn {before.turn}"
                )
            seen[request.conversation_id] = request
            requests.append(request)
    if not requests:
        raise ValueError(f"{path}: the trace holds no requests")
    return Trace(requests)


def sharegpt_trace(
    limit: int | None = None,
    config: TraceConfig = TraceConfig(),
    *,
    offset: int = 0,
    path: str | Path | None = None,
) -> Trace:
    """A trace of the ShareGPT conversations ``[offset, offset + limit)`` tokenized with cl100k
    (needs ``benchdata[sharegpt,cl100k]``); conversation ids are ``"sharegpt-<index>"``."""
    from benchdata import sharegpt_conversations, tokenizer_cl100k

    conversations = sharegpt_conversations(None if limit is None else offset + limit, path=path)
    conversations = conversations[offset:]
    tokenizer = tokenizer_cl100k()

    def encode(texts: list[str]) -> list[list[int]]:
        return tokenizer.encode_ordinary_batch(texts)

    ids = [f"sharegpt-{offset + i}" for i in range(len(conversations))]
    trace = build_trace(conversations, encode, config, ids=ids)
    logger.info(
        "ShareGPT trace: %d conversations, %d requests, %d prompt tokens",
        len(trace.conversations),
        len(trace),
        trace.prompt_tokens,
    )
    return trace
