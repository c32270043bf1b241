"""One owner for a run's data: the order, the loader, the placement and the preparation of its batches.

A trainer used to wire these by hand (a sampler, a DataLoader over it, a generator that moves each batch
to the device and prepares it, the loop told about the sampler so it counts consumption, the loader
remembered for closing and for naming dead workers). A :class:`DataSource` is that wiring as one object:

* iterating gives batches on the device, prepared for the model;
* ``state_dict()`` / ``load_state_dict()`` is its resumable position, one entry of a checkpoint, and
  ``num_samples`` what that position counts over (a resume on other data is refused before loading);
* ``close()`` ends its workers; ``loaders`` are the DataLoaders whose workers
  ``worker_failures.named_worker_deaths`` asks about.

:class:`MapDataSource` is the implementation for a map-style dataset. Its position is the number of
batches it *handed out*, not what its DataLoader fetched: workers prefetch ahead of training, and a
checkpoint must resume at the first batch the loop did not take. The source counts a batch when its
iterator returns it (``ShardedBatchSampler.consume``), so a loop that takes one batch per step needs
no sampler of its own (``TrainLoop(data=source)``: the loop leaves the counting to the source).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from lerobot_trainloop.batch import HOST_KEYS, move_to_device
from lerobot_trainloop.loader import resumable_loader
from lerobot_trainloop.mixture import MixtureBatchSampler
from lerobot_trainloop.sampler import ShardedBatchSampler, SubsetBatches
from lerobot_trainloop.worker_signals import shutdown_loader

# The orders with a position: ``consume``, ``state_dict``, ``load_state_dict``, ``num_samples``.
RESUMABLE_ORDERS = (ShardedBatchSampler, MixtureBatchSampler)


@runtime_checkable
class DataSource(Protocol):
    """Batches for the model, with a position a checkpoint can save and a resume restore."""

    def __iter__(self) -> Iterator[Any]:
        """Batches on the device, prepared for the model; each one returned counts as consumed."""
        ...

    def state_dict(self) -> dict:
        """The position of what was consumed (JSON-able), one entry of the checkpoint."""
        ...

    def load_state_dict(self, state: dict) -> list[str]:
        """Continue at a saved position; returns what differs from an uninterrupted run (notes)."""
        ...

    def close(self) -> None:
        """End the source's worker processes now (a later iteration starts new ones)."""
        ...

    @property
    def num_samples(self) -> int:
        """The samples its position counts over: a position saved for another count does not apply."""
        ...

    @property
    def loaders(self) -> tuple[DataLoader, ...]:
        """The DataLoaders whose workers may die under it (for ``named_worker_deaths``)."""
        ...


class MapDataSource:
    """A map-style ``dataset`` read in ``order``, placed on ``device`` and ``prepare``-d.

    ``order``: a :class:`ShardedBatchSampler` or a :class:`MixtureBatchSampler` (the resumable, rank-sharded
    orders: the source's position is its consumed position and its state), or a fixed batch sampler of
    positions without a position (a held-out set's ``EvalBatches``: every iteration is the whole set,
    ``state_dict()`` is empty).
    ``rows``: the dataset rows the order's positions stand for (``SubsetBatches``; None: position = row),
    for a training set that samples only some rows, so the order and its state count the rows that can
    be sampled. ``seed``: the loader's own generator (see ``resumable_loader``: making an iterator never
    draws from the global RNG). ``host_keys``: mapping keys left in host memory by the placement.
    ``prepare``: applied to every placed batch (normalisation, dtype casts on the device), so the work is
    done where the batch already is. ``loader_kwargs``: the other DataLoader arguments (``num_workers``,
    ``pin_memory``, ``collate_fn``, …), ``shielded`` included.
    ``augment``: ``augment(item, key) -> item``, run in the loader's workers on every item of a resumable
    order, with the item's sample key (the order's ``keyed_batches``: ``(epoch, index)`` for a
    ``ShardedBatchSampler``), which a resume, another rank or another worker count give the same sample,
    so per-sample randomness seeded by it is reproducible.
    """

    def __init__(
        self,
        dataset: Dataset,
        order: ShardedBatchSampler | MixtureBatchSampler | Sampler[list[int]],
        *,
        device: torch.device,
        seed: int,
        rows: Sequence[int] | None = None,
        prepare: Callable[[Any], Any] | None = None,
        host_keys: frozenset[str] = HOST_KEYS,
        loader_kwargs: Mapping[str, Any] | None = None,
        augment: Callable[[Any, tuple[int, ...]], Any] | None = None,
    ) -> None:
        self.dataset = dataset
        self.order = order
        self.device = torch.device(device)
        self.prepare = prepare
        self.host_keys = host_keys
        self.handed_out = 0  # batches returned by this source's iterators, resumed ones not counted
        batches = order if rows is None else SubsetBatches(order, rows)
        if augment is not None:
            if not self.resumable:
                raise ValueError("augment needs an order with sample keys (a ShardedBatchSampler or mixture)")
            batches, dataset = KeyedBatches(batches), AugmentedDataset(dataset, augment)
        self.loader = resumable_loader(dataset, batches, seed=seed, **dict(loader_kwargs or {}))

    @property
    def resumable(self) -> bool:
        """Whether the source has a position (its order is a ``ShardedBatchSampler`` or a
        ``MixtureBatchSampler``)."""
        return isinstance(self.order, RESUMABLE_ORDERS)

    @property
    def num_samples(self) -> int:
        """The samples its order counts over (a ``ShardedBatchSampler``'s, an ``EvalBatches``' set); a
        position saved for another count does not apply."""
        return self.order.num_samples

    @property
    def loaders(self) -> tuple[DataLoader, ...]:
        return (self.loader,)

    def __iter__(self) -> Iterator[Any]:
        # The loader's iterator is made here, so a fresh iteration restarts the order at the consumed
        # position (the sampler's own iterator reads it then), whatever the workers had prefetched.
        for batch in self.loader:
            placed = move_to_device(batch, self.device, self.host_keys)
            prepared = self.prepare(placed) if self.prepare is not None else placed
            # Counted before it is returned: once next() gave it, the consumer has it. Counting after the
            # yield would count it only when the next batch is asked for, after a save at this step.
            self.handed_out += 1
            if self.resumable:
                self.order.consume(1)
            yield prepared

    def state_dict(self) -> dict:
        """The order's state (``ShardedBatchSampler.state_dict()``, its keys unchanged, so checkpoints
        of a sampler and of a source are interchangeable); empty for a fixed order."""
        return self.order.state_dict() if self.resumable else {}

    def load_state_dict(self, state: dict) -> list[str]:
        """Continue at ``state``'s position (``ShardedBatchSampler.load_state_dict``: raises for another
        sample count, returns notes for another seed or batch grouping)."""
        if not self.resumable:
            if state:
                raise ValueError("this data source has a fixed order: it has no position to load")
            return []
        return self.order.load_state_dict(state)

    def close(self) -> None:
        shutdown_loader(self.loader)


class KeyedBatches(Sampler):
    """``batches.keyed_batches()`` as a batch sampler: lists of ``(index, sample key)``."""

    def __init__(self, batches) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[list[tuple[int, tuple[int, ...]]]]:
        return self.batches.keyed_batches()

    def __len__(self) -> int:
        return len(self.batches)


class AugmentedDataset(Dataset):
    """``dataset`` read by ``(index, key)`` pairs: ``augment(dataset[index], key)``."""

    def __init__(self, dataset: Dataset, augment: Callable[[Any, tuple[int, ...]], Any]) -> None:
        self.dataset = dataset
        self.augment = augment

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, pair: tuple[int, tuple[int, ...]]) -> Any:
        index, key = pair
        return self.augment(self.dataset[index], tuple(key))
