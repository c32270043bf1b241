"""Batch helpers: device placement and micro-batch size.

Batches are whatever the collate function made (dicts of tensors for LeRobot datasets,
tuples for tensor datasets); these helpers walk the structure instead of assuming one.

Which keys stay in host memory is declared once (``lerobot_parallel.host_values.HOST_KEYS``, the
dataset ``index``, re-exported here): the loop's placement (:func:`move_to_device`, in
``TrainLoop.train_step`` and ``evaluate``) leaves them where they are, a pre-processor that places batches
earlier (lerobot-cli's ``DeviceStep``) reads the same set, and so does the FSDP2 root's input move.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from lerobot_parallel.host_values import HOST_KEYS

__all__ = ["HOST_KEYS", "batch_size_of", "move_to_device"]


def move_to_device(batch: Any, device: torch.device, host_keys: frozenset[str] = HOST_KEYS) -> Any:
    """Tensors in ``batch`` moved to ``device``; other leaves (strings, ints) unchanged, and so are a
    mapping's values under ``host_keys`` (at any depth).

    ``non_blocking`` for accelerators: a pinned host tensor then copies asynchronously, and an
    unpinned one is copied synchronously anyway, so it is always safe.
    """
    non_blocking = device.type != "cpu"
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        moved = {k: v if k in host_keys else move_to_device(v, device, host_keys) for k, v in batch.items()}
        return moved if type(batch) is dict else type(batch)(moved)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(move_to_device(v, device, host_keys) for v in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(move_to_device(v, device, host_keys) for v in batch)
    return batch


def batch_size_of(batch: Any) -> int | None:
    """Leading dimension of the first tensor found (the micro-batch size), None if there is none."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim else None
    values = (
        batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, list | tuple) else ()
    )
    for v in values:
        n = batch_size_of(v)
        if n is not None:
            return n
    return None
