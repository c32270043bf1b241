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
    gc.collect()  # the rank collects its own garbage (maybe already did: an explicit collect in torch)
    assert log.read_text().split() == [str(os.getpid())], f"rank {os.getpid()}: a worker collected it"


def test_the_rank_keeps_its_own_collector_state_and_freeze():
    """Python 3.12 starts with objects frozen; a caller may freeze more or disable the collector: a
    fork leaves all of it as it was in the rank (only the workers freeze what they inherit)."""
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            frozen = gc.get_freeze_count()
            loader = ShieldedDataLoader(Collecting(), batch_size=4, num_workers=1)
            assert sorted(int(x) for batch in loader for x in batch) == list(range(8))
            loader.close()
            assert gc.isenabled() is enabled and gc.get_freeze_count() == frozen
        finally:
            gc.enable()
