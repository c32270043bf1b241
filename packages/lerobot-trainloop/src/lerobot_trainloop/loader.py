"""A DataLoader over a ``ShardedBatchSampler`` that a resumed run continues exactly.

Creating a DataLoader iterator draws a base seed for its workers (``random_()`` on the loader's
generator, the *global* one when none is given), even with ``num_workers=0``. A resumed run creates its
iterator after the checkpoint restored the RNG, an uninterrupted run created it long before: that one
extra draw shifts every later dropout mask and VAE sample, and the losses after a resume no longer
equal the uninterrupted run's (found by examples/lerobot_act_fsdp.py with LeRobot's ACT). The loader
here owns its generator, so iterators never touch the global stream; the sampler's own state (saved
and restored with the checkpoint) decides the data order.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from lerobot_trainloop.sampler import ShardedBatchSampler


def resumable_loader(dataset: Dataset, sampler: ShardedBatchSampler, *, seed: int,
                     **kwargs: Any) -> DataLoader:
    """``DataLoader(dataset, batch_sampler=sampler, generator=<its own, seeded seed>, **kwargs)``.

    ``seed``: the workers' base seed stream (pass the run seed plus the rank for per-rank workers).
    ``kwargs``: the other DataLoader arguments (``num_workers``, ``pin_memory``, ``collate_fn``, …);
    ``batch_sampler`` and ``generator`` are this function's."""
    for taken in ("batch_sampler", "generator", "sampler", "batch_size", "shuffle"):
        if taken in kwargs:
            raise TypeError(f"resumable_loader sets {taken} itself (the ShardedBatchSampler decides the "
                            "order)")
    return DataLoader(dataset, batch_sampler=sampler, generator=torch.Generator().manual_seed(seed), **kwargs)
