"""Poisson sampling: every example joins each batch independently with probability q.

This is the sampling the accountant assumes; batches have random sizes (possibly zero), so the
gradient is divided by the expected batch size q·N (``expected_batch_size`` in
:func:`flashdp.make_private`), never by the actual one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch


def _steps_per_epoch(sample_rate: float) -> int:
    """⌈1/q⌉, exact when 1/q is an integer that floating-point division misses (q = 1/49)."""
    nearest = round(1 / sample_rate)
    return nearest if math.isclose(nearest * sample_rate, 1.0) else math.ceil(1 / sample_rate)


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
        self.steps = steps if steps is not None else _steps_per_epoch(self.sample_rate)
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
        [(9, 9), (14, 14)]
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


class DistributedPoissonSampler:
    """Poisson-sampled logical batches split across the ranks of a process group.

    Every rank draws the same global batch (each of the N examples independently with
    probability q, from a generator seeded with ``seed``) and keeps every ``world_size``-th of
    its indices, starting at its rank: the ranks' local batches are disjoint, together form the
    logical batch, differ in size by at most one, and may be empty. The logical batch does not
    depend on the number of ranks, so the accountant's sample rate is q and its expected size
    q·N (``expected_batch_size`` in :func:`flashdp.make_private`), as in one process.

    Run every step on every rank inside ``controller.accumulate()``. DDP's and FSDP2's forward
    and backward are collectives, so a rank whose local batch is empty runs one placeholder
    example (any index) with its loss multiplied by 0: its clipped gradient is exactly zero and
    the gradient's denominator is the expected batch size, so the release is unchanged.
    Checkpoint the sampler with the model (:meth:`state_dict`): restarting from the seed would
    draw the same batches again, which the accountant does not assume.

    Args:
        num_examples: N, the dataset size.
        sample_rate: q in (0, 1].
        seed: seed of the global draw; must be the same on every rank (checked, modulo 2²⁰,
            when a process group is initialised: a collective, so build the sampler on every
            rank; under NCCL on the current CUDA device, so call ``torch.cuda.set_device``
            first).
        steps: batches per iteration over the sampler (default: ⌈1/q⌉).
        rank: this process's rank (default: from ``torch.distributed``, or 0).
        world_size: the number of ranks (default: from ``torch.distributed``, or 1).
    """

    def __init__(
        self,
        num_examples: int,
        sample_rate: float,
        *,
        seed: int,
        steps: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int (the same on every rank), got {seed!r}")
        initialised = torch.distributed.is_available() and torch.distributed.is_initialized()
        if world_size is None:
            world_size = torch.distributed.get_world_size() if initialised else 1
        if rank is None:
            rank = torch.distributed.get_rank() if initialised else 0
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
        self.global_sampler = PoissonSampler(
            num_examples, sample_rate, steps, torch.Generator().manual_seed(seed)
        )
        self.rank, self.world_size = rank, world_size
        if initialised and torch.distributed.get_world_size() == world_size > 1:
            _check_same_seed(seed)

    @property
    def sample_rate(self) -> float:
        return self.global_sampler.sample_rate

    @property
    def expected_batch_size(self) -> int:
        """q·N rounded (the logical batch's expected size over all ranks)."""
        return self.global_sampler.expected_batch_size

    def __len__(self) -> int:
        return len(self.global_sampler)

    def __iter__(self) -> Iterator[list[int]]:
        for indices in self.global_sampler:
            yield indices[self.rank :: self.world_size]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The generator's state: where the sequence of global batches stands."""
        return {"generator": self.global_sampler.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Continue the sequence of global batches from :meth:`state_dict`."""
        if not isinstance(state, dict) or set(state) != {"generator"}:
            raise ValueError("a sampler state has exactly the key 'generator'")
        self.global_sampler.generator.set_state(state["generator"])


def _check_same_seed(seed: int) -> None:
    """All ranks must draw the same global batches."""
    from flashdp.distributed import sum_and_compare

    device = torch.device("cpu")
    if torch.distributed.get_backend() == "nccl":  # multi-backend groups take CPU tensors
        device = torch.device("cuda", torch.cuda.current_device())
    folded = seed % (1 << 20)  # W·folded² stays far inside int64
    _, (same,) = sum_and_compare([], [folded], None, device)
    if not same:
        raise ValueError(
            "DistributedPoissonSampler got different seeds on different ranks: each rank would "
            "draw its own logical batches, so an example could be sampled on several ranks. "
            "Pass the same seed on every rank"
        )
