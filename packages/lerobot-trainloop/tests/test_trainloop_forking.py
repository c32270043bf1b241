"""A DataLoader worker never collects an object it inherited: a destructor that needs the rank's threads
(a gloo ProcessGroup's, left in a reference cycle by an earlier run) would block the worker for ever.
Here the inherited garbage is a cycle whose ``__del__`` records the pid it runs in, and each item forces a
collection in the worker."""

from __future__ import annotations

import gc
import os
import sys

import pytest
import torch
from lerobot_trainloop.forking import heap_frozen_for_fork
from lerobot_trainloop.worker_signals import ShieldedDataLoader

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork")


class Cycle:
    """Garbage in a reference cycle whose destructor appends its process's pid to ``log``."""

    def __init__(self, log) -> None:
        self.me, self.log = self, log

    def __del__(self) -> None:
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")


class Collecting(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        gc.collect()  # what a worker's allocations trigger sooner or later
        return index


@pytest.mark.parametrize("shielded", [True, False])
@pytest.mark.parametrize("persistent", [True, False])
def test_a_worker_never_runs_the_destructor_of_garbage_it_inherited(tmp_path, shielded, persistent):
    log = tmp_path / "deleted_in"
    gc.disable()  # the cycle must still be uncollected garbage when the workers fork
    try:
        Cycle(log)
        loader = ShieldedDataLoader(Collecting(), batch_size=2, num_workers=2, persistent_workers=persistent)
        if not shielded:
            loader._shield = None
        for _ in range(2):  # a persistent loader forks once, a one-epoch loader every epoch
            assert sorted(int(x) for batch in loader for x in batch) == list(range(8))
        loader.close()
    finally:
        gc.enable()
    assert not log.exists(), f"collected in a worker (pids {log.read_text().split()}, rank {os.getpid()})"
    gc.collect()  # the rank collects its own garbage afterwards, as usual
    assert log.read_text().split() == [str(os.getpid())]


def test_a_heap_the_caller_froze_stays_frozen():
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with heap_frozen_for_fork():
            pass
        assert gc.get_freeze_count() >= before > 0
    finally:
        gc.unfreeze()
    with heap_frozen_for_fork():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
