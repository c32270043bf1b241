"""A DataLoader over a ``ShardedBatchSampler`` that a resumed run continues exactly.

Creating a DataLoader iterator draws a base seed for its workers (``random_()`` on the loader's
generator, the *global* one when none is given), even with ``num_workers=0``. A resumed run creates its
iterator after the checkpoint restored the RNG, an uninterrupted run created it long before: that one
extra draw shifts every later dropout mask and VAE sample, and the losses after a resume no longer
equal the uninterrupted run's (found by examples/lerobot_act_fsdp.py with LeRobot's ACT). The loader
here owns its generator, so iterators never touch the global stream; the sampler's own state (saved
and restored with the checkpoint) decides the data order.

Its workers are shielded by default (:class:`~lerobot_trainloop.worker_signals.ShieldedDataLoader`): a
run is resumable only from a checkpoint that got written, and the checkpoint a trainer writes when its
launcher or scheduler stops it (SIGTERM/SIGINT to the whole process group) needs its DataLoader workers
alive until the ranks agree to stop. A trainer that does not catch the signals sees no difference (its
rank ends its workers as before). ``shielded=False`` gives torch's plain DataLoader (e.g. to keep its
default worker start method: shielded workers are forked unless ``multiprocessing_context`` is given).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from lerobot_trainloop.sampler import ShardedBatchSampler
from lerobot_trainloop.worker_signals import ShieldedDataLoader


def resumable_loader(
    dataset: Dataset,
    sampler: ShardedBatchSampler | Sampler[list[int]],
    *,
    seed: int,
    shielded: bool = True,
    **kwargs: Any,
) -> DataLoader:
    """``DataLoader(dataset, batch_sampler=sampler, generator=<its own, seeded seed>, **kwargs)``.

    ``sampler``: a ``ShardedBatchSampler``, or a batch sampler over one (``SubsetBatches``).
    ``seed``: the workers' base seed stream (pass the run seed plus the rank for per-rank workers).
    ``shielded``: workers that launcher signals cannot kill (a ``ShieldedDataLoader``; see the module
    docstring); False: a plain ``DataLoader``. Without workers both are the same.
    ``kwargs``: the other DataLoader arguments (``num_workers``, ``pin_memory``, ``collate_fn``, …);
    ``batch_sampler`` and ``generator`` are this function's."""
    for taken in ("batch_sampler", "generator", "sampler", "batch_size", "shuffle"):
        if taken in kwargs:
            raise TypeError(
                f"resumable_loader sets {taken} itself (the ShardedBatchSampler decides the order)"
            )
    cls = ShieldedDataLoader if shielded else DataLoader
    return cls(dataset, batch_sampler=sampler, generator=torch.Generator().manual_seed(seed), **kwargs)
