"""LoPE's noise generators: character-level text noise and embedding noise ``E + α·N⊙M``.

Example:
    >>> import random
    >>> noisy = char_noise("the quick brown fox", rate=0.2, rng=random.Random(0))
    >>> noisy != "the quick brown fox"
    True
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

OPERATIONS = ("shuffle", "insert", "delete")
_ALPHABET = string.ascii_letters + string.digits + string.punctuation + " "


def char_noise(text: str, rate: float, rng: random.Random) -> str:
    """Corrupt ``text`` character by character.

    Each character is, with probability ``rate``, hit by one operation drawn uniformly from
    ``shuffle`` (swapped with the next character), ``insert`` (a random printable character is
    inserted before it) or ``delete`` (dropped).
    """
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate!r}")
    chars = list(text)
    out: list[str] = []
    i = 0
    while i < len(chars):
        if rng.random() >= rate:
            out.append(chars[i])
            i += 1
            continue
        operation = rng.choice(OPERATIONS)
        if operation == "shuffle" and i + 1 < len(chars):
            out += [chars[i + 1], chars[i]]
            i += 2
        elif operation == "insert":
            out += [rng.choice(_ALPHABET), chars[i]]
            i += 1
        elif operation == "delete":
            i += 1
        else:  # shuffle of the last character: nothing to swap with
            out.append(chars[i])
            i += 1
    return "".join(out)


def embedding_noise(
    embeds: torch.Tensor,
    alpha: float = 0.05,
    token_rate: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``E' = E + α·N⊙M``: ``N ~ U(-1, 1)`` per entry, ``M`` a per-token Bernoulli(``token_rate``)
    mask broadcast over the hidden dimension. ``embeds``: ``(…, L, H)``."""
    if alpha < 0 or not 0.0 <= token_rate <= 1.0:
        raise ValueError(f"need alpha >= 0 and token_rate in [0, 1], got {alpha}, {token_rate}")
    noise = torch.rand(embeds.shape, generator=generator, dtype=torch.float32) * 2 - 1
    keep = torch.rand(embeds.shape[:-1], generator=generator) < token_rate
    noise = noise * keep.unsqueeze(-1)
    return embeds + alpha * noise.to(device=embeds.device, dtype=embeds.dtype)


@contextmanager
def embedding_noise_hook(
    model: nn.Module,
    alpha: float = 0.05,
    token_rate: float = 1.0,
    generator: torch.Generator | None = None,
) -> Iterator[None]:
    """Within the block, the model's input embeddings come out with :func:`embedding_noise`."""
    embedding = model.get_input_embeddings()

    def add_noise(module, args, output):
        return embedding_noise(output, alpha, token_rate, generator)

    handle = embedding.register_forward_hook(add_noise)
    try:
        yield
    finally:
        handle.remove()
