"""Text for distillation and evaluation: ShareGPT first exchanges or fortunes, packed into rows.

Both sources install offline through ``benchdata`` (extras ``sharegpt`` and ``fortunes``).
ShareGPT conversations contribute their first user/assistant exchange rendered with the
tokenizer's chat template (the format the instruction-tuned teacher was trained on); fortunes are
plain texts ended by the EOS token. Token streams are packed into ``(N, seq_len)`` rows with no
padding, and split into disjoint train / validation rows by text, not by row.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

SOURCES = ("sharegpt", "fortunes")


@dataclass(frozen=True)
class TokenRows:
    """Packed token rows of a text source."""

    train: torch.Tensor  # (N_train, seq_len) int64
    validation: torch.Tensor  # (N_validation, seq_len) int64


def _sharegpt_texts(tokenizer: Any, limit: int) -> list[str]:
    from benchdata import sharegpt_conversations

    texts = []
    for turns in sharegpt_conversations(limit=4 * limit):
        pair = [t for t in turns if t["role"] in ("user", "assistant")][:2]
        if len(pair) < 2 or pair[0]["role"] != "user" or pair[1]["role"] != "assistant":
            continue
        messages = [{"role": t["role"], "content": t["text"]} for t in pair]
        texts.append(tokenizer.apply_chat_template(messages, tokenize=False))
        if len(texts) == limit:
            break
    return texts


def _fortune_texts(limit: int) -> list[str]:
    from benchdata import fortunes_corpus

    corpus = fortunes_corpus()
    return (corpus.train + corpus.validation)[:limit]


def _pack(tokenizer: Any, texts: list[str], seq_len: int) -> torch.Tensor:
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for text in texts:
        stream.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if eos is not None:
            stream.append(eos)
    rows = len(stream) // seq_len
    return torch.tensor(stream[: rows * seq_len], dtype=torch.long).view(rows, seq_len)


def text_rows(
    tokenizer: Any,
    source: str = "sharegpt",
    *,
    seq_len: int = 256,
    num_texts: int = 2000,
    validation_fraction: float = 0.1,
) -> TokenRows:
    """Packed rows of a real text source.

    Args:
        tokenizer: a Hugging Face tokenizer (with a chat template for ``"sharegpt"``).
        source: ``"sharegpt"`` or ``"fortunes"``.
        seq_len: tokens per row.
        num_texts: texts read (ShareGPT: first exchanges; fortunes: entries).
        validation_fraction: share of the texts (the last ones) held out.

    Returns:
        :class:`TokenRows` with at least one row on each side.

    Example:
        >>> import benchdata
        >>> lm = benchdata.smollm2_135m()
        >>> rows = text_rows(lm.tokenizer, "fortunes", seq_len=64, num_texts=200)
        >>> rows.train.shape[1]
        64
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    if seq_len < 2 or num_texts < 2:
        raise ValueError(f"seq_len and num_texts must be >= 2, got {seq_len}, {num_texts}")
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    texts = (
        _sharegpt_texts(tokenizer, num_texts) if source == "sharegpt" else _fortune_texts(num_texts)
    )
    cut = len(texts) - max(1, round(validation_fraction * len(texts)))
    train = _pack(tokenizer, texts[:cut], seq_len)
    validation = _pack(tokenizer, texts[cut:], seq_len)
    if len(train) == 0 or len(validation) == 0:
        raise ValueError(
            f"{len(texts)} {source} texts give {len(train)} train and {len(validation)} validation "
            f"rows of {seq_len} tokens; read more texts or use shorter rows"
        )
    logger.info("%s: %d train and %d validation rows of %d tokens", source, len(train),
                len(validation), seq_len)  # fmt: skip
    return TokenRows(train, validation)
