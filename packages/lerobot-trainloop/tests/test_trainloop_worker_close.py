"""``ShieldedDataLoader.close`` ends a loader's workers now, even when the loader sits in a reference cycle.

Without it such a persistent loader's iterator waits for the garbage collector, and a process forked
meanwhile (a later run's DataLoader worker) that collects it runs torch's ``__del__`` there: "Exception
ignored ... AssertionError: can only test a child process" on the shared stderr."""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys

import pytest
import torch
from lerobot_trainloop.worker_signals import ShieldedDataLoader

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="forks")


class _Holder:
    """A loader in a cycle, as a trainer's hooks hold its held-out eval."""

    def __init__(self) -> None:
        self.me = self
        self.loader = ShieldedDataLoader(
            torch.arange(8.0), batch_size=2, num_workers=2, persistent_workers=True
        )


def _stderr_of_a_forked_collection() -> str:
    """What a forked child that runs the garbage collector writes to its stderr."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a later run's worker, collecting what it inherited
        # where "Exception ignored" goes, as outside pytest (which replaces both)
        sys.stderr, sys.unraisablehook = os.fdopen(write, "w"), sys.__unraisablehook__
        gc.enable()
        gc.collect()
        sys.stderr.flush()
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as stream:
        text = stream.read()
    os.waitpid(pid, 0)
    return text


def test_close_ends_the_workers_of_a_loader_in_a_cycle_before_any_collection():
    gc.collect()
    gc.disable()
    try:
        holder = _Holder()
        assert len(list(holder.loader)) == 4
        assert len(multiprocessing.active_children()) == 2
        holder.loader.close()
        assert multiprocessing.active_children() == []
        del holder  # garbage in a cycle, left for the collector
        assert "Exception ignored" not in _stderr_of_a_forked_collection()
    finally:
        gc.enable()
        gc.collect()


def test_a_closed_loader_starts_new_workers_when_iterated_again():
    loader = ShieldedDataLoader(torch.arange(8.0), batch_size=2, num_workers=1, persistent_workers=True)
    assert len(list(loader)) == 4
    loader.close()
    assert len(list(loader)) == 4
    loader.close()
    assert multiprocessing.active_children() == []


def test_close_without_workers_or_iterators_does_nothing():
    ShieldedDataLoader(torch.arange(4.0), batch_size=2).close()
    loader = ShieldedDataLoader(torch.arange(4.0), batch_size=2)
    assert len(list(loader)) == 2
    loader.close()
