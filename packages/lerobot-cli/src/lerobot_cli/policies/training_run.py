"""What a policy's ``PolicyConfig.prepare_training`` hook may use of the run it is about to train in.

Kept small on purpose: the hook runs once per training run, on every rank, after the policy is built (its
weights loaded) and before it is wrapped or sharded, for work that is cheaper done once than per batch
(FastWAM: each task's text context, so no rank holds the 11 GB text encoder while training). It gets the
dataset's tasks, the rank's device, whether it is the job's main rank and a broadcast from that rank, not
the runner's objects, so a policy cannot come to depend on how the runner is built.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from attrs import field, frozen
from torch import Tensor


def _no_broadcast(tensor: Tensor) -> None:
    """One process: the main rank's tensor is already everyone's."""


def _no_sum(value: int) -> int:
    return value


@frozen
class TrainingRun:
    """``tasks``: the dataset's task texts by task index (training and held-out episodes alike; the same
    order on every rank). ``broadcast(t)``: ``t`` (on ``device``, the same shape and dtype on every rank)
    overwritten in place with the main rank's values, a collective every rank must call. ``sum_over_ranks``:
    an integer summed over the ranks (a collective too), for a line the main rank prints about all of them."""

    tasks: tuple[str, ...]
    device: torch.device
    is_main: bool = True
    world_size: int = 1
    broadcast: Callable[[Tensor], None] = field(default=_no_broadcast, eq=False, repr=False)
    sum_over_ranks: Callable[[int], int] = field(default=_no_sum, eq=False, repr=False)


def distributed_run(tasks: tuple[str, ...], device: torch.device) -> TrainingRun:
    """The ``TrainingRun`` of this rank in an initialised default process group (global rank 0 is main)."""
    import torch.distributed as dist

    def broadcast(tensor: Tensor) -> None:
        dist.broadcast(tensor, src=0)

    def sum_over_ranks(value: int) -> int:
        total = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(total)
        return int(total.item())

    return TrainingRun(
        tasks=tasks,
        device=device,
        is_main=dist.get_rank() == 0,
        world_size=dist.get_world_size(),
        broadcast=broadcast,
        sum_over_ranks=sum_over_ranks,
    )
