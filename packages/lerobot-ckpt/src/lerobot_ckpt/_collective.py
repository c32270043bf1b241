"""The few collectives a save needs, and the rule that keeps ranks from waiting on a dead peer.

Every rank calls the same collectives in the same order whatever happened locally: a rank that
failed still joins the next collective carrying an error flag, instead of raising and leaving the
others blocked until the process-group timeout. Works without a process group too (one process),
so a trainer that never initialises ``torch.distributed`` uses the same code path.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from attrs import define

from lerobot_ckpt import errors
from lerobot_ckpt.errors import CheckpointError, CheckpointSaveError


def _rebuild(kind: str, message: str) -> CheckpointError:
    """The error a peer reported, as the same class: a CLI then reacts identically on every rank.

    Classes with their own constructor (``MissingCheckpointFileError(path, why)``) are rebuilt from
    the final message alone; their ``path`` is unknown to this rank and left None.
    """
    cls = getattr(errors, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, CheckpointError)):
        cls = CheckpointSaveError
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    if issubclass(
        cls, errors.MissingCheckpointFileError | errors.CorruptCheckpointError | errors.CheckpointWriteError
    ):
        error.path = None
    if issubclass(cls, errors.CheckpointWriteError):
        error.os_error = None
    return error


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def _flag_device(group: Any = None) -> torch.device:
    """NCCL only moves CUDA tensors; every other backend (the gloo checkpoint group too) takes CPU ones."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and "gloo" not in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def describe(error: BaseException) -> str:
    """One line for any exception: ours already read well, others get their type name prefixed."""
    if isinstance(error, CheckpointError):
        return str(error)
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


@define(frozen=True)
class Collective:
    """A process group as seen by one rank (or a lone process when none is initialised).

    ``group`` is None for the default (training) group. An asynchronous save's background phase
    passes its own gloo group over the same ranks (:mod:`lerobot_ckpt.async_save`): collectives of
    two threads must never share one group, whose operations are matched by issue order alone.
    Ranks are global ranks; the groups used here span the whole world, so they equal group ranks.
    """

    rank: int
    world_size: int
    distributed: bool
    group: Any = None

    @classmethod
    def current(cls, group: Any = None) -> Collective:
        if _initialized():
            return cls(rank=dist.get_rank(), world_size=dist.get_world_size(), distributed=True, group=group)
        return cls(rank=0, world_size=1, distributed=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        """A barrier through a tiny all-reduce (works on NCCL without guessing the device)."""
        if self.distributed:
            dist.all_reduce(
                torch.zeros(1, dtype=torch.int64, device=_flag_device(self.group)), group=self.group
            )

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``src``'s object on every rank (the staging path a sharded save writes into)."""
        if not self.distributed:
            return obj
        payload = [obj]
        dist.broadcast_object_list(payload, src=src, group=self.group)
        return payload[0]

    def agree(self, error: CheckpointError | None) -> None:
        """Raise the same error on every rank if any rank failed; also a barrier when none did.

        One tiny all-reduce carries "the lowest failing rank" (encoded so that MAX finds it); only
        on failure does that rank broadcast its class name and message. A rank whose own error is
        not the one chosen still raises the agreed error (same class), chained to its own.
        """
        if not self.distributed:
            if error is not None:
                raise error
            return
        flag = torch.tensor([self.world_size - self.rank if error is not None else 0], dtype=torch.int64)
        flag = flag.to(_flag_device(self.group))
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        value = int(flag.item())
        if value == 0:
            return
        failed = self.world_size - value
        payload: list[Any] = [None]
        if self.rank == failed:
            payload = [(type(error).__name__, str(error))]
        dist.broadcast_object_list(payload, src=failed, group=self.group)
        kind, message = payload[0]
        if self.rank == failed and error is not None:
            raise error
        raise _rebuild(kind, message) from error
