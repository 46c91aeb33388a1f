"""Synthetic token sequences with controllable statistics: Zipf unigrams plus in-context copies."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class TokenSequences(NamedTuple):
    """`tokens` int64 `(N, L)`; `copied` bool `(N, L)`: True where a token repeats an earlier one
    of the same sequence by construction; `source` int64 `(N, L)`: the position it was copied
    from (-1 where not copied)."""

    tokens: torch.Tensor
    copied: torch.Tensor
    source: torch.Tensor


def zipf_pmf(vocab_size: int, exponent: float) -> np.ndarray:
    """P(rank r) ∝ r^(-exponent) for r = 1..vocab_size (token id r-1), float64 `(vocab_size,)`."""
    weights = np.arange(1, vocab_size + 1, dtype=np.float64) ** -exponent
    return weights / weights.sum()


def token_sequences(
    num_sequences: int,
    seq_len: int,
    vocab_size: int,
    *,
    zipf_exponent: float = 1.0,
    copy_prob: float = 0.0,
    copy_span: int = 1,
    seed: int = 0,
) -> TokenSequences:
    """Sequences whose fresh tokens follow a Zipf law and which repeat their own earlier spans.

    Each position starts, with probability `copy_prob`, a copy of `copy_span` consecutive tokens
    from a uniformly chosen earlier position of the same sequence (as in-context recall and
    repeated n-grams in text); otherwise it draws a fresh token with `P(id) ∝ (id+1)^-exponent`.
    A copy in progress is not interrupted; the first position is always fresh.

    Args:
        zipf_exponent: >= 0 (0: uniform tokens; natural language is near 1).
        copy_prob: in [0, 1).
        copy_span: >= 1 tokens per copy.

    Example:
        >>> data = token_sequences(4, 128, 1000, copy_prob=0.1, copy_span=4)
        >>> data.tokens.shape
        torch.Size([4, 128])
    """
    if num_sequences < 1 or seq_len < 1 or vocab_size < 2:
        raise ValueError(
            "need num_sequences >= 1, seq_len >= 1, vocab_size >= 2; got "
            f"{num_sequences}, {seq_len}, {vocab_size}"
        )
    if zipf_exponent < 0:
        raise ValueError(f"zipf_exponent must be >= 0, got {zipf_exponent}")
    if not 0.0 <= copy_prob < 1.0:
        raise ValueError(f"copy_prob must be in [0, 1), got {copy_prob}")
    if copy_span < 1:
        raise ValueError(f"copy_span must be >= 1, got {copy_span}")
    rng = np.random.default_rng(seed)
    tokens = rng.choice(
        vocab_size, size=(num_sequences, seq_len), p=zipf_pmf(vocab_size, zipf_exponent)
    )
    source = np.full((num_sequences, seq_len), -1, dtype=np.int64)
    starts = rng.random((num_sequences, seq_len)) < copy_prob
    remaining = np.zeros(num_sequences, dtype=np.int64)  # tokens left in each copy in progress
    offset = np.zeros(num_sequences, dtype=np.int64)  # distance back to the copied span
    rows = np.arange(num_sequences)
    for t in range(1, seq_len):
        begin = (remaining == 0) & starts[:, t]
        offset[begin] = t - rng.integers(0, t, size=int(begin.sum()))
        remaining[begin] = copy_span
        active = remaining > 0
        source[active, t] = t - offset[active]
        tokens[rows[active], t] = tokens[rows[active], t - offset[active]]
        remaining[active] -= 1
    return TokenSequences(
        torch.from_numpy(tokens.astype(np.int64)),
        torch.from_numpy(source >= 0),
        torch.from_numpy(source),
    )
