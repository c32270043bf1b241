"""ShieldedDataLoader: its workers survive SIGINT/SIGTERM, even one sent between their fork and their
init, yet their parent can still terminate them, and they die with it; resumable_loader builds one by
default (the end-to-end drills, lerobot-train under torchrun, are in the repository's
tests/test_interrupt.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from lerobot_trainloop import ShardedBatchSampler, ShieldedDataLoader, resumable_loader, worker_signals
from torch.utils.data import DataLoader

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork, signal masks, PR_SET_PDEATHSIG")

DATA = list(range(24))


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_worker_signalled_before_its_init_survives(monkeypatch):
    """The race a drill can hardly hit: the signal lands after the fork, before the worker ignores it
    (torch's own SIGTERM handler, installed first, would kill it; SIGINT would end its loop). The
    worker signals itself there; the fork's blocked mask keeps both pending until they are ignored."""
    original = worker_signals._shield_from_stop_signals

    def signalled_first() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        original()

    monkeypatch.setattr(worker_signals, "_shield_from_stop_signals", signalled_first)
    loader = ShieldedDataLoader(DATA, batch_size=4, num_workers=2)
    assert [int(x) for batch in loader for x in batch] == DATA


def test_workers_ignore_stop_signals_sent_to_them():
    loader = ShieldedDataLoader(DATA, batch_size=2, num_workers=2, persistent_workers=True)
    it = iter(loader)
    got = [int(x) for x in next(it)]
    pids = [w.pid for w in it._workers]
    # from another process, as torchrun's or a scheduler's would be (the parent's SIGTERM terminates)
    subprocess.run(["sh", "-c", f"kill -TERM {pids[0]} {pids[1]}; kill -INT {pids[0]} {pids[1]}"], check=True)
    time.sleep(0.3)  # torch's SIGCHLD handler would report a dead worker at the next batch
    got += [int(x) for batch in it for x in batch]
    assert got == DATA and all(_alive(pid) for pid in pids)
    got = [int(x) for batch in loader for x in batch]  # a second epoch on the same (persistent) workers
    assert got == DATA and [w.pid for w in loader._iterator._workers] == pids


def test_the_parent_can_still_terminate_a_worker():
    """torch's shutdown falls back on ``terminate()`` (SIGTERM) for a worker that did not stop: it must
    end it, with status 0 as torch's own handler does (a worker killed by a signal is reported as failed)."""
    loader = ShieldedDataLoader(DATA, batch_size=2, num_workers=1, persistent_workers=True)
    it = iter(loader)
    next(it)
    worker = it._workers[0]
    worker.terminate()
    worker.join(10)
    assert worker.exitcode == 0
    it._shutdown_workers()


RANK = textwrap.dedent("""
    import sys
    from lerobot_trainloop.worker_signals import ShieldedDataLoader
    loader = ShieldedDataLoader(list(range(64)), batch_size=2, num_workers=2, persistent_workers=True)
    it = iter(loader)
    next(it)
    print(" ".join(str(w.pid) for w in it._workers), flush=True)
    sys.stdin.readline()  # the test kills it here, or tells it to end with its workers still running
""")


@pytest.fixture(scope="module")
def ranks():
    """Two processes, each like a rank holding a loader's two running workers: [(process, worker pids)].
    Started together: importing torch is most of their time."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        yield [(proc, [int(pid) for pid in proc.stdout.readline().split()]) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()


def _gone_within(pids: list[int], timeout_s: float) -> list[int]:
    """Those of ``pids`` still alive after ``timeout_s`` (killed then, so no test leaves them behind)."""
    deadline = time.monotonic() + timeout_s
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in pids if _alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def test_a_process_exits_with_its_workers_still_running(ranks):
    """At exit, ``multiprocessing`` terminates a daemon still running, then joins it without a timeout:
    a worker that ignored SIGTERM outright would hang its rank's exit for ever (seen while writing it)."""
    proc, pids = ranks[0]
    assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    _, stderr = proc.communicate("exit\n", timeout=60)
    assert proc.returncode == 0 and "Error" not in stderr, stderr
    assert _gone_within(pids, 2.0) == []


def test_workers_die_with_the_process_that_forked_them(ranks):
    """A rank killed outright (SIGKILL: no DataLoader shutdown) takes its workers with it at once:
    without the death signal they would linger until torch's watchdog polls (every 5 s), and one stuck
    in a dataset read would never see it."""
    proc, pids = ranks[1]
    assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    proc.kill()
    proc.wait(10)
    assert _gone_within(pids, 2.0) == [], "workers outlived their rank"


def test_without_workers_it_is_a_plain_dataloader():
    loader = ShieldedDataLoader(DATA, batch_size=4)
    assert loader.worker_init_fn is None and [int(x) for b in loader for x in b] == DATA


def test_resumable_loader_is_shielded_by_default():
    """Its workers survive a launcher's signals as ShieldedDataLoader's do; shielded=False is torch's own."""
    sampler = ShardedBatchSampler(len(DATA), 4, seed=0, max_batches=6)
    loader = resumable_loader(DATA, sampler, seed=0, num_workers=2, persistent_workers=True)
    assert isinstance(loader, ShieldedDataLoader) and isinstance(
        loader.worker_init_fn, worker_signals.ShieldWorker
    )
    expected = [list(map(int, b)) for b in sampler]
    it = iter(loader)
    got = [next(it).tolist()]
    pids = [w.pid for w in it._workers]
    subprocess.run(["sh", "-c", f"kill -TERM {pids[0]} {pids[1]}; kill -INT {pids[0]} {pids[1]}"], check=True)
    time.sleep(0.3)
    got += [b.tolist() for b in it]
    assert got == expected and all(_alive(pid) for pid in pids)
    it._shutdown_workers()
    plain = resumable_loader(DATA, sampler, seed=0, num_workers=2, shielded=False)
    assert type(plain) is DataLoader and plain.worker_init_fn is None


def test_where_the_platform_lacks_the_shield_it_is_a_plain_dataloader(monkeypatch):
    """No sigwaitinfo or no fork (macOS, Windows): a blocked SIGTERM with no thread to take it would hang
    the rank's exit, so the workers are torch's own (and the start method the caller's or torch's)."""
    monkeypatch.setattr(worker_signals, "SHIELD_SUPPORTED", False)
    loader = ShieldedDataLoader(DATA, batch_size=4, num_workers=2)
    assert loader.worker_init_fn is None and loader.multiprocessing_context is None
    assert [int(x) for b in loader for x in b] == DATA
