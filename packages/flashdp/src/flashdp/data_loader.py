"""Poisson-sampled data loading with empty batches of the right structure.

:class:`DPDataLoader` draws every example of a map-style dataset independently with probability
q (as Opacus' ``DPDataLoader``, which the RDP accountant assumes) and yields an empty batch as
the structure one example collates to, with every tensor cut to zero examples, so that a plain
training loop runs it through the model (a private model releases noise only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data._utils.collate import default_collate

from flashdp.sampling import PoissonSampler

_NEEDS_MAP_STYLE = (
    "Poisson sampling draws examples by index: it needs a map-style dataset, not an IterableDataset"
)


class _EmptySafeCollate:
    """The user's collate function, plus zero-size batches of the same structure.

    The empty form (every tensor with a first dimension of 0, its trailing shape and dtype
    kept) comes from collating ``dataset[0]`` once; it is built at construction so that a
    structure without an empty form is refused before training, and so that worker processes
    need no access to the dataset.
    """

    def __init__(self, collate_fn: Callable[[list[Any]], Any], dataset: Dataset) -> None:
        self.collate_fn = collate_fn
        self.empty = _empty_like(collate_fn([dataset[0]]), "batch")

    def __call__(self, examples: list[Any]) -> Any:
        if examples:
            return self.collate_fn(examples)
        return _empty_like(self.empty, "batch")  # new containers: the caller may mutate them


def _empty_like(batch: Any, path: str) -> Any:
    """``batch`` with every tensor cut to zero examples (containers rebuilt, types kept)."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            raise TypeError(
                f"{path} is a scalar tensor, not a batch: Poisson sampling yields empty batches, "
                "which need the examples in the first dimension of every tensor"
            )
        return batch[:0].clone()
    if isinstance(batch, Mapping):
        return {key: _empty_like(value, f"{path}[{key!r}]") for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        fields = zip(batch._fields, batch, strict=True)
        return type(batch)(*(_empty_like(value, f"{path}.{field}") for field, value in fields))
    if isinstance(batch, list | tuple):
        return type(batch)(_empty_like(value, f"{path}[{i}]") for i, value in enumerate(batch))
    raise TypeError(
        f"{path} is a {type(batch).__name__}: Poisson sampling yields empty batches, and only "
        "tensors (in dicts, lists and tuples) have an empty form; make the collate function "
        "return tensors"
    )


class DPDataLoader(DataLoader):
    """A data loader whose batches are Poisson-sampled: each example joins each batch
    independently with probability ``sample_rate``, so batches have random sizes, possibly 0.

    An empty batch has the structure the collate function gives one example, with every tensor
    cut to zero examples (same trailing shape and dtype).

    Args:
        dataset: a map-style dataset (``dataset[i]``, ``len(dataset)``).
        sample_rate: q in (0, 1].
        steps: batches per iteration over the loader (default: ⌈1/q⌉).
        collate_fn: merges a list of examples into a batch (default: PyTorch's
            ``default_collate``).
        sampling_generator: random generator of the sampling (default: a new one seeded from
            PyTorch's global generator, so ``torch.manual_seed`` makes runs reproducible).
        **loader_options: further :class:`torch.utils.data.DataLoader` options (``num_workers``,
            ``pin_memory``...), except the batching ones (``batch_size``, ``shuffle``,
            ``sampler``, ``batch_sampler``, ``drop_last``), which Poisson sampling replaces.

    Raises:
        TypeError: an iterable-style dataset, or a collated example without an empty form.
        ValueError: an empty dataset or a sample rate outside (0, 1].

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> data = TensorDataset(torch.randn(100, 3), torch.arange(100))
        >>> loader = DPDataLoader(
        ...     data, sample_rate=0.1, steps=2, sampling_generator=torch.Generator().manual_seed(0)
        ... )
        >>> [tuple(x.shape) for x, _ in loader]
        [(9, 3), (14, 3)]
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        sample_rate: float,
        steps: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        sampling_generator: torch.Generator | None = None,
        **loader_options: Any,
    ) -> None:
        if isinstance(dataset, IterableDataset):
            raise TypeError(_NEEDS_MAP_STYLE)
        if sampling_generator is None:
            seed = int(torch.randint(0, 2**62, (1,)))
            sampling_generator = torch.Generator().manual_seed(seed)
        self.sample_rate = float(sample_rate)
        sampler = PoissonSampler(len(dataset), sample_rate, steps, sampling_generator)
        super().__init__(
            dataset,
            batch_sampler=sampler,
            collate_fn=_EmptySafeCollate(collate_fn or default_collate, dataset),
            **loader_options,
        )

    @property
    def expected_batch_size(self) -> int:
        """⌊q·N⌋ (at least 1), the gradient's denominator, as Opacus' ``DPDataLoader`` sets it
        (a switched script keeps its gradient scale)."""
        return max(1, int(self.sample_rate * len(self.dataset)))

    @classmethod
    def from_data_loader(
        cls, data_loader: DataLoader, *, sampling_generator: torch.Generator | None = None
    ) -> DPDataLoader:
        """The Poisson-sampled counterpart of ``data_loader``: its dataset, collate function
        and worker options, q = 1/len(data_loader) (the same expected batch size) and as many
        batches per iteration.

        Args:
            data_loader: a loader over a map-style dataset.
            sampling_generator: random generator of the sampling (default: the loader's
                ``generator``, else one seeded from PyTorch's global generator).

        Returns:
            The new loader.
        """
        steps = batches_per_epoch(data_loader)
        options = {
            name: getattr(data_loader, name)
            for name in (
                "num_workers",
                "pin_memory",
                "timeout",
                "worker_init_fn",
                "multiprocessing_context",
                "generator",
                "prefetch_factor",
                "persistent_workers",
                "pin_memory_device",
                "in_order",
            )
        }
        return cls(
            data_loader.dataset,
            sample_rate=1 / steps,
            steps=steps,
            collate_fn=data_loader.collate_fn,
            sampling_generator=(
                data_loader.generator if sampling_generator is None else sampling_generator
            ),
            **options,
        )


def batches_per_epoch(data_loader: DataLoader) -> int:
    """len(data_loader), the number of batches of one epoch: q = 1/len as in Opacus."""
    if not isinstance(data_loader, DataLoader):
        raise TypeError(
            f"data_loader must be a torch.utils.data.DataLoader, got {type(data_loader).__name__}"
        )
    if isinstance(data_loader.dataset, IterableDataset):
        raise TypeError(_NEEDS_MAP_STYLE)
    batches = len(data_loader)
    if batches == 0:
        raise ValueError("data_loader yields no batches: its dataset is empty")
    return batches
