"""Seeded planted noise, so that selection quality can be measured against a known truth.

Sequence-level noise corrupts a whole response (the sequence should be left out):

- ``shuffle``: the responses of the chosen examples are permuted among them with no fixed point,
  so every one answers a different prompt (a lone chosen example, which no permutation can
  move, is truncated instead);
- ``truncate``: the response keeps only its first quarter of tokens (at least one) and stops.

Token-level noise (``garbage``) replaces one contiguous span of an otherwise good response
(``span`` of its tokens, default a quarter, never its last token) by uniformly drawn non-special
tokens, each different from the token it replaces; the sequence stays clean and its injected
tokens are marked, so the tokens (not the sequence) should be down-weighted.

Every corruption is recorded exactly: ``noisy_sequence[i]`` for the first kind,
``noisy_tokens[i][t]`` for the second.
"""

from __future__ import annotations

import torch

from qcs.data import TokenizedPairs
from qcs.selection import seeded

__all__ = ["SEQUENCE_NOISE", "plant_noise"]

SEQUENCE_NOISE = ("shuffle", "truncate")


def _check_fraction(name: str, value: float) -> None:
    if not isinstance(value, int | float) or not 0 <= value < 1:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")


def plant_noise(
    data: TokenizedPairs,
    *,
    sequence_fraction: float = 0.2,
    token_fraction: float = 0.2,
    sequence_kinds: tuple[str, ...] = SEQUENCE_NOISE,
    span: float = 0.25,
    vocab_size: int,
    special_ids: tuple[int, ...] = (),
    seed: int = 0,
) -> TokenizedPairs:
    """A copy of ``data`` with planted noise (see the module docstring).

    Args:
        sequence_fraction: of the examples, corrupted whole (split evenly over
            ``sequence_kinds``).
        token_fraction: of the examples, another disjoint set that gets one garbage span.
        span: the garbage span's share of its response.
        vocab_size: garbage tokens are drawn from ``[0, vocab_size)`` minus ``special_ids``.
        seed: the random choices.
    """
    _check_fraction("sequence_fraction", sequence_fraction)
    _check_fraction("token_fraction", token_fraction)
    if sequence_fraction + token_fraction >= 1:
        raise ValueError("sequence_fraction + token_fraction must stay below 1")
    if not 0 < span < 1:
        raise ValueError(f"span must be in (0, 1), got {span!r}")
    unknown = [k for k in sequence_kinds if k not in SEQUENCE_NOISE]
    if unknown or not sequence_kinds:
        raise ValueError(f"sequence_kinds must be among {SEQUENCE_NOISE}, got {sequence_kinds!r}")
    if data.noisy_sequence.any() or any(t.any() for t in data.noisy_tokens):
        raise ValueError("data already holds planted noise")
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[[i for i in special_ids if 0 <= i < vocab_size]] = False
    candidates = torch.nonzero(allowed).flatten()
    if candidates.numel() < 2:
        raise ValueError("the vocabulary has fewer than two non-special tokens to draw from")

    generator = seeded(seed, "noise")
    n = len(data)
    order = torch.randperm(n, generator=generator).tolist()
    n_sequence, n_token = round(sequence_fraction * n), round(token_fraction * n)
    sequence_set, token_set = order[:n_sequence], order[n_sequence : n_sequence + n_token]
    out = data.subset(range(n))
    responses = [r.clone() for r in out.response_ids]
    noisy_tokens = [t.clone() for t in out.noisy_tokens]

    groups = [sequence_set[k :: len(sequence_kinds)] for k in range(len(sequence_kinds))]
    for kind, members in zip(sequence_kinds, groups, strict=True):
        if kind == "shuffle" and len(members) >= 2:
            # a cyclic shift of a random order: a permutation with no fixed point
            shifted = members[1:] + members[:1]
            originals = [data.response_ids[i] for i in shifted]
            for i, response in zip(members, originals, strict=True):
                responses[i] = response.clone()
        elif kind == "truncate" or len(members) == 1:
            for i in members:
                responses[i] = responses[i][: max(1, len(responses[i]) // 4)].clone()
        for i in members:
            out.noisy_sequence[i] = True
            noisy_tokens[i] = torch.zeros(len(responses[i]), dtype=torch.bool)

    for i in token_set:
        length = len(responses[i])
        width = min(max(1, round(span * length)), length - 1)
        if width < 1:
            continue  # a one-token response has no span to corrupt
        start = int(torch.randint(0, length - width, (1,), generator=generator))
        for t in range(start, start + width):
            draw = candidates[torch.randint(0, candidates.numel(), (1,), generator=generator)]
            while int(draw) == int(responses[i][t]):
                draw = candidates[torch.randint(0, candidates.numel(), (1,), generator=generator)]
            responses[i][t] = draw
            noisy_tokens[i][t] = True
    out.response_ids, out.noisy_tokens = responses, noisy_tokens
    return out
