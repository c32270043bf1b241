"""DataLoader workers that SIGINT/SIGTERM cannot kill: their rank decides when to stop, then ends them.

Why: a DataLoader worker is in its rank's process group, and a stop signal reaches that whole group:
torchrun forwards it with ``killpg`` to each rank's group, Ctrl-C hits a terminal's foreground group,
and SLURM signals every process of the job. torch's worker dies of any SIGTERM its parent did not send
(its C handler), and a SIGINT ends its loop; the rank then fails with "DataLoader worker ... killed by
signal" long before the ranks agreed on a step to stop at (a trainer that saves an interrupt checkpoint
on the signal, as lerobot-train does), and that checkpoint is never written. So a worker ignores SIGINT,
and takes SIGTERM from its parent alone. A trainer that does not handle the signals loses nothing: its
rank stops as before and ends its workers (or they die with it, below).

No window: a worker could be signalled between its fork and the ``worker_init_fn`` that shields it
(torch's handler is installed first). So the rank blocks both signals on its thread while
``DataLoader.__iter__`` forks the workers, and each child starts with them blocked; a signal that
reaches the rank meanwhile stays pending until the fork is done and is then delivered as usual.
Workers are forked explicitly (``fork`` context): a forkserver's children would not inherit the mask
(and it is the default from Python 3.14 on).

In the worker, SIGINT is ignored (then unblocked: one pending is discarded). SIGTERM stays blocked, and
a thread takes each one with ``sigwaitinfo``, which names the sender: the parent's (torch's shutdown
falls back on ``terminate()``, and ``multiprocessing`` terminates a daemon still running at exit
before joining it without a timeout) ends the worker with status 0, as torch's own handler does;
anyone else's is dropped. Ignoring SIGTERM outright would leave that exit-time join hanging for ever.

Teardown: a worker still ends when its rank's DataLoader shuts down, or when torch's worker watchdog
sees its parent gone (it polls every 5 s); and it asks the kernel for SIGKILL the moment its rank dies,
however it dies (``PR_SET_PDEATHSIG``; Linux, and only when forked on the main thread: the death
signal follows the forking *thread*).

Where ``signal.sigwaitinfo`` or the ``fork`` start method is missing (macOS, Windows), the loader is a
plain ``DataLoader``: a worker whose SIGTERM stayed blocked with no thread to take it would hang its
rank's exit (see above).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch.utils.data import DataLoader

from lerobot_trainloop.forking import FreezeInherited, collector_paused_for_fork

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1
# What the shield needs of the platform; elsewhere ShieldedDataLoader is a plain DataLoader.
SHIELD_SUPPORTED = (
    hasattr(signal, "sigwaitinfo")
    and hasattr(signal, "pthread_sigmask")
    and "fork" in multiprocessing.get_all_start_methods()
)


@contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """SIGINT/SIGTERM blocked on this thread (a process it forks starts with them blocked)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _take_sigterm_from_parent_only() -> None:
    """The worker's SIGTERM thread: exit on the parent's, drop the others (SIGTERM stays blocked)."""
    while True:
        info = signal.sigwaitinfo({signal.SIGTERM})
        if info.si_pid == os.getppid():
            os._exit(0)


def _shield_from_stop_signals() -> None:
    """In a worker that starts with both signals blocked: see the module docstring."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    # Threads inherit the mask, so SIGTERM is blocked in every thread and waits for this one.
    threading.Thread(target=_take_sigterm_from_parent_only, name="sigterm-from-parent", daemon=True).start()


def _die_with_parent(parent: int) -> None:
    """In a worker: SIGKILL when the forking thread dies; exit now if the parent is already gone."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # died before the prctl: nothing would send the signal
        os._exit(0)


class ShieldWorker:
    """The ``worker_init_fn`` of a :class:`ShieldedDataLoader` (then the caller's own, if any)."""

    def __init__(self, inner: Callable[[int], None] | None = None) -> None:
        self.inner = inner
        self.parent = os.getpid()
        self.main_thread_forks = False  # set by the loader before each fork

    def __call__(self, worker_id: int) -> None:
        _shield_from_stop_signals()
        if self.main_thread_forks:
            _die_with_parent(self.parent)
        if self.inner is not None:
            self.inner(worker_id)


class ShieldedDataLoader(DataLoader):
    """A ``DataLoader`` whose worker processes never die of SIGINT/SIGTERM (see the module docstring).

    Takes the same arguments; with ``num_workers=0``, or where the platform lacks what the shield needs
    (``SHIELD_SUPPORTED``), it is a plain DataLoader. Workers are forked unless ``multiprocessing_context``
    says otherwise (a spawned or forkserver worker does not start with the signals blocked, so a signal
    right after its start can still reach torch's handler)."""

    def __init__(self, *args, **kwargs) -> None:
        self._shield: ShieldWorker | None = None
        # The iterator made last (weakly: a caller that drops it still ends its workers), so that a dead
        # worker can be named when the loader is not persistent (worker_failures.py).
        self.last_iterator: Callable[[], object | None] | None = None
        self._freeze: FreezeInherited | None = None
        if kwargs.get("num_workers", 0) > 0:  # forking.py: workers never collect what they inherit
            self._freeze = FreezeInherited(kwargs.pop("worker_init_fn", None))
            kwargs["worker_init_fn"] = self._freeze
        if kwargs.get("num_workers", 0) > 0 and SHIELD_SUPPORTED:
            # the shield first (a signal must find it), then the freeze (the collector stays paused)
            self._shield = ShieldWorker(kwargs.pop("worker_init_fn"))
            kwargs["worker_init_fn"] = self._shield
            if kwargs.get("multiprocessing_context") is None:
                kwargs["multiprocessing_context"] = "fork"
        super().__init__(*args, **kwargs)

    def __iter__(self):
        if self._freeze is None:
            iterator = super().__iter__()
        elif self._shield is None:
            with collector_paused_for_fork(self._freeze):
                iterator = super().__iter__()
        else:
            self._shield.parent = os.getpid()
            self._shield.main_thread_forks = threading.current_thread() is threading.main_thread()
            # the first iterator (and each without persistent workers) forks
            with stop_signals_blocked(), collector_paused_for_fork(self._freeze):
                iterator = super().__iter__()
        self.last_iterator = weakref.ref(iterator)
        return iterator

    def close(self) -> None:
        """End this loader's worker processes now (a persistent loader's, and those of the iterator made
        last if it is still alive); a later ``iter()`` starts new ones.

        Without it a persistent loader's workers end only when its iterator is freed, which for a loader
        held in a reference cycle (a trainer's hooks) is whenever the garbage collector runs, in whichever
        process runs it: a DataLoader worker forked later (of the next run in the same process) inherits
        the iterator and, collecting it, fails in torch's ``__del__`` ("can only test a child process")."""
        iterators = [self._iterator, self.last_iterator() if self.last_iterator is not None else None]
        self._iterator = None
        self.last_iterator = None
        for iterator in iterators:
            _shutdown_workers(iterator)


def _shutdown_workers(iterator: object) -> None:
    shutdown = getattr(iterator, "_shutdown_workers", None)  # torch's multi-process iterator only
    if shutdown is not None:
        shutdown()


def shutdown_loader(loader: DataLoader) -> None:
    """End ``loader``'s worker processes now: a :class:`ShieldedDataLoader`'s through its ``close``, a
    plain DataLoader's persistent iterator directly (see ``ShieldedDataLoader.close`` for why now)."""
    close = getattr(loader, "close", None)
    if close is not None:
        close()
        return
    iterator, loader._iterator = loader._iterator, None
    _shutdown_workers(iterator)
