"""A DataLoader worker's failure, as facts: a worker killed from outside (the OOM killer's SIGKILL) is
named with its index, pid and signal, from a persistent or a one-epoch loader, whatever torch raised; an
error a worker raised gives back its own message, as without workers. (lerobot-train's one line built from
them: the repository's tests/test_worker_failures.py.)"""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest
from lerobot_trainloop.worker_failures import (
    DataLoaderWorkerDied,
    named_worker_deaths,
    private_bytes,
    worker_error_message,
)
from lerobot_trainloop.worker_signals import ShieldedDataLoader

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork, /proc")


class DataError(Exception):
    """An error of the dataset's own package (its module path is what torch's text would show)."""


class Data:
    """``size`` items; item ``fail_at`` raises a DataError (a dataset problem found in a worker)."""

    def __init__(self, size: int = 64, fail_at: int | None = None) -> None:
        self.size, self.fail_at = size, fail_at

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        if index == self.fail_at:
            raise DataError(f"item {index}: the frame at t=3.2 s is missing from videos/file-000.mp4")
        return index


@pytest.mark.parametrize("persistent", [True, False])
def test_a_worker_killed_from_outside_is_named_with_its_signal(persistent):
    loader = ShieldedDataLoader(Data(), batch_size=2, num_workers=2, persistent_workers=persistent)
    it = iter(loader)
    next(it)
    victim = it._workers[1]
    os.kill(victim.pid, signal.SIGKILL)
    with pytest.raises(DataLoaderWorkerDied) as exc, named_worker_deaths(None, loader):
        for _ in it:  # torch raises a RuntimeError: from its SIGCHLD handler, or "exited unexpectedly"
            pass
    died = exc.value
    assert (died.worker_id, died.pid, died.signum, died.exitcode) == (1, victim.pid, signal.SIGKILL, -9)
    assert str(died) == f"DataLoader worker 1 (pid {victim.pid}) was killed by SIGKILL"
    assert isinstance(died.__cause__, RuntimeError)  # torch's own report stays chained
    assert died.others_private_bytes is not None and died.others_private_bytes > 0  # worker 0, measured
    it._shutdown_workers()


def test_a_reset_connection_waits_for_the_killed_worker_to_be_reapable():
    """A worker killed while handing over a batch's shared memory surfaces as ConnectionResetError a
    moment before its exit code exists (the kernel closes its sockets first); here it dies 0.3 s later."""
    loader = ShieldedDataLoader(Data(), batch_size=2, num_workers=2, persistent_workers=True)
    it = iter(loader)
    next(it)
    victim = it._workers[0]
    threading.Timer(0.3, os.kill, (victim.pid, signal.SIGKILL)).start()
    with pytest.raises(DataLoaderWorkerDied) as exc, named_worker_deaths(loader):
        raise ConnectionResetError(104, "Connection reset by peer")
    assert (exc.value.worker_id, exc.value.signum) == (0, signal.SIGKILL)
    assert isinstance(exc.value.__cause__, ConnectionResetError)
    it._shutdown_workers()


def test_other_exceptions_pass_unchanged_while_the_workers_live():
    loader = ShieldedDataLoader(Data(), batch_size=2, num_workers=1, persistent_workers=True)
    it = iter(loader)
    next(it)
    with pytest.raises(KeyError, match="not a worker's"), named_worker_deaths(loader):
        raise KeyError("not a worker's")
    it._shutdown_workers()


def test_a_worker_that_exits_with_a_code_is_named_with_it():
    died = DataLoaderWorkerDied(0, 1234, 3)
    assert died.signum is None and str(died) == "DataLoader worker 0 (pid 1234) exited with code 3"


@pytest.mark.parametrize("workers", [0, 1])
def test_an_error_a_worker_raised_says_what_it_says_without_workers(workers):
    """torch re-raises it as "Caught DataError in DataLoader worker process 0. Original Traceback …
    test_trainloop_worker_failures.DataError: item 3: …"; the message is the same as in one process."""
    loader = ShieldedDataLoader(Data(fail_at=3), batch_size=2, num_workers=workers)
    with pytest.raises(DataError) as exc:
        list(loader)
    assert (workers > 0) == str(exc.value).startswith("Caught DataError in DataLoader worker process 0.")
    assert worker_error_message(exc.value) == (
        "item 3: the frame at t=3.2 s is missing from videos/file-000.mp4"
    )


def test_any_other_message_is_left_as_it_is():
    assert worker_error_message(ValueError("Caught nothing\nat all")) == "Caught nothing\nat all"


def test_private_bytes_reads_this_process_and_nothing_of_a_missing_one():
    assert private_bytes(os.getpid()) > 0
    assert private_bytes(2**22 + 1) is None  # above the default pid_max: no such process
