"""Asynchronous saves: snapshot at the save step, write and commit in the background.

:class:`AsyncCheckpointer` runs the one save transaction (:mod:`lerobot_ckpt.save`) in two parts.
On the training thread, at the save step: the RNG gather, the staging directory and the caller's
small ``pretrained_model/`` files, and a CPU copy of everything else (model and optimizer, this
rank's shards for DCP; the gathered whole model on the main rank for ``model.safetensors``; the
scheduler, scaler, sampler and loop state), so training may mutate the live objects right after.
On one background thread: the DCP shards and safetensors files written from the copies, an
agreement that every rank's writes finished, then the main rank's record and commit (fsync,
rename, ``last`` swapped) and a final agreement. A kill at any instant leaves ``last`` on the
previous complete checkpoint and, at worst, the dot-named staging directory that the next save
(or a resume) removes.

Why these choices:

* **A checkpoint group of its own.** A process group matches operations by issue order, so the
  background thread's collectives (DCP's plan gathering, the agreements) must not share the
  training thread's group, whose all-reduces and all-gathers run meanwhile. :meth:`create` makes
  a gloo group over every rank once (``new_group`` is collective: every rank, same point), as
  torchtitan does for its async checkpointing; gloo because the copies are CPU tensors and DCP's
  ``async_save`` demands a CPU-capable group.
* **Our own thread rather than ``dcp.async_save``.** ``async_save`` is exactly "stage to CPU, then
  ``dcp.save`` on a worker thread with the given group"; we do both steps ourselves inside the
  transaction, because the commit must follow *all* writers (two DCP directories, a safetensors
  file, the record) and their agreement, in one ordered sequence of collectives on one group.
  ``async_save``'s executor would be a second thread issuing collectives on that group.
* **One save in flight.** :meth:`save` first waits for the previous one, so at most one CPU copy
  is held and a checkpoint directory is committed in step order. The previous save's failure is
  raised there (and by :meth:`wait`), naming its step: a wait point is the same loop step on
  every rank, and the background agreement gives every rank the same outcome, so every rank
  raises the same error at the same point and none is left in a collective.
* **A daemon thread.** A run that dies for another reason does not hang at exit behind a
  background write whose peers are gone; the staging directory it leaves is invisible to readers.

Memory: each rank holds a CPU copy of its model and optimizer state while a save is in flight,
and with a ``model.safetensors`` artifact of a sharded run the main rank holds the whole model
once more (the synchronous gather streams one tensor at a time instead).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch.distributed as dist
from attrs import define, field

from lerobot_ckpt._collective import Collective, _initialized
from lerobot_ckpt.errors import CheckpointSaveError
from lerobot_ckpt.layout import checkpoints_dir, step_dir_name
from lerobot_ckpt.objects import TrainingObjects
from lerobot_ckpt.save import SaveRequest, WritePretrained, _Transaction
from lerobot_ckpt.state.fqn import AdapterState
from lerobot_ckpt.state.record import RunInfo


@define(frozen=True)
class CompletedSave:
    """A background save that committed: its step directory and when (``time.monotonic()``) its
    training-thread part ended (``snapshot_done``) and its commit was agreed (``committed``)."""

    step: int
    path: Path
    started: float
    snapshot_done: float
    committed: float


@define(eq=False)
class _InFlight:
    step: int
    started: float
    snapshot_done: float
    thread: threading.Thread | None = None
    path: Path | None = None
    error: BaseException | None = None
    committed: float = 0.0


@define(eq=False)
class AsyncCheckpointer:
    """Saves that return once the state is copied; the write and commit finish in the background.

    Build it with :meth:`create` on every rank at the same point (it makes the checkpoint group);
    call :meth:`save` where :func:`~lerobot_ckpt.save_checkpoint` would be called (collective,
    same arguments), and :meth:`wait` on every rank before the end of the run, before publishing
    the last checkpoint and on an interrupt.
    """

    group: Any = None  # the checkpoint group; None without torch.distributed
    last: CompletedSave | None = None  # the newest committed background save
    _inflight: _InFlight | None = field(default=None, init=False)

    @classmethod
    def create(cls, timeout_s: float | None = None) -> AsyncCheckpointer:
        """Collective when ``torch.distributed`` is initialised: every rank creates the gloo checkpoint
        group here, at the same point. ``timeout_s`` bounds its collectives (the training group's
        timeout is the natural choice: a peer that died mid-write is then reported, not waited for)."""
        if not _initialized():
            return cls()
        kwargs = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
        return cls(group=dist.new_group(backend="gloo", **kwargs))

    @property
    def in_flight(self) -> int | None:
        """The step being written in the background, or None."""
        return None if self._inflight is None else self._inflight.step

    def save(
        self,
        output_dir: Path | str,
        step: int,
        *,
        run: RunInfo,
        objects: TrainingObjects,
        sampler_state: Mapping[str, Any] | None = None,
        loop_state: Mapping[str, Any] | None = None,
        write_pretrained: WritePretrained | None = None,
        adapter_state: AdapterState | None = None,
    ) -> Path:
        """:func:`~lerobot_ckpt.save_checkpoint`, asynchronously; returns the step directory it will commit.

        Waits for the previous save first (raising its error, if it failed). Raises at once when
        the training-thread part fails (nothing is then left in flight); a failure of the write or
        commit is raised by the next :meth:`save` or :meth:`wait`.
        """
        self.wait()
        started = time.monotonic()
        request = SaveRequest(
            run=run,
            step=step,
            objects=objects,
            sampler_state=sampler_state,
            loop_state=loop_state,
            write_pretrained=write_pretrained,
            adapter_state=adapter_state,
        )
        comm = Collective.current()
        request.validate(comm)
        background = _Transaction(checkpoints_dir(output_dir), request, comm).start(
            Collective.current(self.group)
        )
        inflight = _InFlight(step=step, started=started, snapshot_done=time.monotonic())
        inflight.thread = threading.Thread(
            target=self._background,
            args=(inflight, background),
            daemon=True,
            name=f"lerobot-ckpt-save-{step_dir_name(step)}",
        )
        self._inflight = inflight
        inflight.thread.start()
        return checkpoints_dir(output_dir) / step_dir_name(step)

    @staticmethod
    def _background(inflight: _InFlight, work: Callable[[], Path]) -> None:
        try:
            inflight.path = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread by wait()
            inflight.error = exc
        inflight.committed = time.monotonic()

    def wait(self) -> CompletedSave | None:
        """Block until the save in flight (if any) committed; raise its error on failure.

        Every rank gets the same outcome (the background phase ends in an agreement), so calling it
        at the same loop step on every rank keeps the ranks together. Returns the save that
        committed, or None when none was in flight.
        """
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return None
        inflight.thread.join()
        if inflight.error is not None:
            error = inflight.error
            if not isinstance(error, CheckpointSaveError):  # a bug, not an I/O failure: still name the step
                error = CheckpointSaveError(
                    f"checkpoint {step_dir_name(inflight.step)} was not saved (the "
                    f"previous checkpoint and `last` are unchanged): {error!r}"
                )
                error.__cause__ = inflight.error
            raise error
        self.last = CompletedSave(
            step=inflight.step,
            path=inflight.path,
            started=inflight.started,
            snapshot_done=inflight.snapshot_done,
            committed=inflight.committed,
        )
        return self.last

    def close(self) -> None:
        """Wait for the save in flight, then destroy the checkpoint group (every rank)."""
        try:
            self.wait()
        finally:
            if self.group is not None and _initialized():
                dist.destroy_process_group(self.group)
            self.group = None
