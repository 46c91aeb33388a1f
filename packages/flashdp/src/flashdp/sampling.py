"""Poisson sampling: every example joins each batch independently with probability q.

This is the sampling the accountant assumes; batches have random sizes (possibly zero), so the
gradient is divided by the expected batch size q·N (``expected_batch_size`` in
:func:`flashdp.make_private`), never by the actual one.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


class PoissonSampler:
    """Batches of example indices, each index drawn independently with ``sample_rate``.

    Usable as a ``batch_sampler`` of ``torch.utils.data.DataLoader`` (mind empty batches there).

    Args:
        num_examples: N, the dataset size.
        sample_rate: q in (0, 1].
        steps: batches per iteration over the sampler (default: ⌈1/q⌉, one "epoch").
        generator: random generator (default: a fresh nondeterministic one).
    """

    def __init__(
        self,
        num_examples: int,
        sample_rate: float,
        steps: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 1:
            raise ValueError(f"num_examples must be a positive int, got {num_examples!r}")
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        if steps is not None and (not isinstance(steps, int) or steps < 1):
            raise ValueError(f"steps must be a positive int or None, got {steps!r}")
        self.num_examples = num_examples
        self.sample_rate = float(sample_rate)
        self.steps = steps if steps is not None else int(-(-1 // sample_rate))
        if generator is None:
            generator = torch.Generator()
            generator.seed()
        self.generator = generator

    @property
    def expected_batch_size(self) -> int:
        """q·N rounded to the nearest integer (at least 1)."""
        return max(1, round(self.sample_rate * self.num_examples))

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            mask = torch.rand(self.num_examples, generator=self.generator) < self.sample_rate
            yield mask.nonzero().flatten().tolist()


class PoissonLoader:
    """Poisson-sampled batches of tensors that share their first (example) dimension.

    Yields tuples of the tensors indexed by each batch; an empty batch yields tensors with a
    first dimension of 0.

    Example:
        >>> import torch
        >>> x, y = torch.randn(100, 3), torch.arange(100)
        >>> loader = PoissonLoader(
        ...     (x, y), sample_rate=0.1, steps=2, generator=torch.Generator().manual_seed(0)
        ... )
        >>> [tuple(t.shape[0] for t in batch) for batch in loader]
        [(13, 13), (9, 9)]
    """

    def __init__(
        self,
        tensors: tuple[torch.Tensor, ...],
        sample_rate: float,
        steps: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
            raise TypeError("tensors must be a non-empty tuple of tensors")
        sizes = {t.shape[0] if t.dim() else None for t in tensors}
        if len(sizes) != 1 or None in sizes:
            raise ValueError(
                f"tensors must share their first dimension, got {sorted(map(str, sizes))}"
            )
        self.tensors = tensors
        self.sampler = PoissonSampler(tensors[0].shape[0], sample_rate, steps, generator)

    @property
    def expected_batch_size(self) -> int:
        return self.sampler.expected_batch_size

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        for indices in self.sampler:
            index = torch.tensor(indices, dtype=torch.long)
            yield tuple(t.index_select(0, index.to(t.device)) for t in self.tensors)
