"""ShieldedDataLoader: its workers survive SIGINT/SIGTERM, even one sent between their fork and their
init, yet their parent can still terminate them, and they die with it; resumable_loader builds one by
default (the end-to-end drills, lerobot-train under torchrun, are in the repository's
tests/test_interrupt.py)."""

from __future__ import annotations

import os
import select
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


def _signals_taken(pids: list[int], timeout_s: float = 60.0) -> None:
    """Wait until each of ``pids`` has taken the SIGTERM/SIGINT just sent to it (none left pending in
    ``/proc/PID/status``), or has died: then whether it survived can be judged, with no margin of time.
    A shielded worker discards SIGINT (ignored) and its thread takes SIGTERM; torch's would die of them."""
    stop = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGINT - 1))

    def pending(pid: int) -> bool:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        masks = [
            int(ln.split()[1], 16) for ln in status.splitlines() if ln.startswith(("SigPnd:", "ShdPnd:"))
        ]
        return _alive(pid) and any(mask & stop for mask in masks)

    deadline = time.monotonic() + timeout_s
    while any(pending(pid) for pid in pids):
        assert time.monotonic() < deadline, "a stop signal stayed pending"
        time.sleep(0.01)


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
    _signals_taken(pids)  # a worker they killed would be reported at the next batch (torch's SIGCHLD handler)
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
    import threading
    from lerobot_trainloop.worker_signals import ShieldedDataLoader

    class Data:
        # "stuck": past the first batch, every read blocks for ever (a worker stuck in a dataset read,
        # which never gets back to torch's check on its parent); "idle": the workers wait for work
        def __len__(self):
            return 64

        def __getitem__(self, index):
            if sys.argv[1] == "stuck" and index >= 2:
                threading.Event().wait()
            return index

    loader = ShieldedDataLoader(Data(), batch_size=2, num_workers=2, persistent_workers=True)
    it = iter(loader)
    next(it)
    print(" ".join(str(w.pid) for w in it._workers), flush=True)
    sys.stdin.readline()  # the test kills it here, or tells it to end with its workers still running
""")
GONE_S = 60.0  # only bounds a failure: a passing wait ends when the workers do


@pytest.fixture(scope="module")
def ranks():
    """Two processes, each like a rank holding a loader's two running workers: [(process, worker pids)],
    the first one's idle, the second one's stuck in a dataset read. Started together: importing torch is
    most of their time."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, workers],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for workers in ("idle", "stuck")
    ]
    try:
        yield [(proc, [int(pid) for pid in proc.stdout.readline().split()]) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()


def _gone_within(pids: list[int], timeout_s: float) -> list[int]:
    """Those of ``pids`` still alive after waiting up to ``timeout_s`` for each to end (killed then, so no
    test leaves them behind). The wait is on each process's exit (a pidfd turns readable when it ends), not
    a fixed time: it returns as soon as they are gone."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(fd)
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
    assert _gone_within(pids, GONE_S) == []


def test_workers_die_with_the_process_that_forked_them(ranks):
    """A rank killed outright (SIGKILL: no DataLoader shutdown) takes its workers with it, even while
    they are stuck in a dataset read: those never get back to torch's watchdog (which polls the parent
    every 5 s), so without the death signal they would outlive it for ever. The test tells the two apart
    by whether they end, not by how soon (a margin a loaded machine could miss)."""
    proc, pids = ranks[1]
    assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    proc.kill()
    proc.wait(10)
    assert _gone_within(pids, GONE_S) == [], "workers outlived their rank"


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
    _signals_taken(pids)
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
    assert loader._shield is None and loader.multiprocessing_context is None
    assert loader.worker_init_fn.inner is None  # only forking.FreezeInherited, nothing of the shield
    assert [int(x) for b in loader for x in b] == DATA
