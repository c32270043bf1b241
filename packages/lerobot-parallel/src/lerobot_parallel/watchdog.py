"""A rank exits when its launcher is gone, instead of training on orphaned (torch-free).

torchrun starts every worker in a session of its own (``start_new_session=True``), so
``kill -9`` of the launcher, or of its whole process group, reaches no rank: they would train
on, holding ports, devices and the output directory, and keep writing checkpoints nobody
asked for. Each worker is a child of the torchrun process itself (``accelerate launch
--multi_gpu`` runs torchrun in-process, so there it is accelerate's process); when it dies the
rank is reparented (to init or a subreaper), which ``os.getppid()`` shows.

Why polling and not ``prctl(PR_SET_PDEATHSIG)``: the death signal follows the parent *thread*
that forked, is lost when the parent died before the child called ``prctl``, and is Linux-only;
SIGKILL would leave no line saying why, and a catchable signal is only handled on the main
thread, which may sit in a long collective. A daemon thread comparing ``os.getppid()`` with the
parent seen at start once a second (as torch's own DataLoader workers do) costs one syscall.

Why a hard exit (``os._exit``): nothing of the training may run on, not even ``finally`` blocks
or a save-on-interrupt handler. A checkpoint being written stays in its dot-prefixed staging
directory, which is never committed and is removed by the next save; committed checkpoints and
``last`` are untouched.

The parent is recorded when this module is first imported (``lerobot_parallel`` imports it
before torch), so a launcher that dies while the rank imports torch is noticed too. A launcher
that dies before that, or a wrapper process between launcher and rank that does not ``exec``, is
not seen.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Self

from attrs import define, field

from lerobot_parallel.launch_env import LaunchEnv

LAUNCHER_GONE_EXIT_CODE = 1  # a failure, not a usage error (2); nobody may be left to read it
DEFAULT_INTERVAL_S = 1.0
_WRITE_DEADLINE_S = 2.0  # stderr may be a pipe nobody drains any more: never let it block the exit

_IMPORTED_AS = (os.getpid(), os.getppid())


def parent_at_start() -> int:
    """The parent this process had when this module was imported; after a ``fork``, the forker."""
    pid, ppid = _IMPORTED_AS
    return ppid if pid == os.getpid() else os.getppid()


def launcher_watch_wanted(launch: LaunchEnv, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a launcher started this process: several ranks, or a torchrun worker (even alone).

    A single process without a launcher is left alone: its parent is a shell or a scheduler, whose
    exit (``nohup``, a closed terminal) must not end the run.
    """
    env = os.environ if environ is None else environ
    return launch.world_size > 1 or "TORCHELASTIC_RUN_ID" in env


def _write_with_deadline(fd: int, data: bytes, deadline_s: float) -> None:
    """``os.write`` the whole of ``data`` from a helper thread, giving up after ``deadline_s``."""

    def write() -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            pass

    writer = threading.Thread(target=write, name="lerobot-launcher-watch-write", daemon=True)
    writer.start()
    writer.join(deadline_s)


def hard_exit(message: str, code: int = LAUNCHER_GONE_EXIT_CODE) -> None:
    """Write one line to stderr (raw fd: Python's stream locks may be held) and ``os._exit``."""
    _write_with_deadline(2, (message + "\n").encode(errors="replace"), _WRITE_DEADLINE_S)
    os._exit(code)


@define
class LauncherWatch:
    """Polls the parent pid from a daemon thread; when it changes, ``on_gone(message)`` runs.

    The default ``on_gone`` is :func:`hard_exit`. ``stop()`` (or leaving the ``with`` block) ends
    the watch; a watch that was stopped never fires, so a clean teardown cannot be cut short.
    """

    parent_pid: int = field(factory=parent_at_start)
    label: str = ""  # prefix of the message, e.g. "[rank 1/2] "
    interval_s: float = DEFAULT_INTERVAL_S
    exit_code: int = LAUNCHER_GONE_EXIT_CODE
    on_gone: Callable[[str], None] | None = None
    _stopped: threading.Event = field(factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _firing: threading.Lock = field(factory=threading.Lock, init=False)  # one line, even from two threads

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def parent_is_gone(self) -> bool:
        return os.getppid() != self.parent_pid

    def message(self) -> str:
        return f"{self.label}the launcher (pid {self.parent_pid}) is gone; exiting"

    def start(self) -> Self:
        """Start polling (the first check is immediate: the launcher may already be gone)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lerobot-launcher-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopped.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def exit_now(self) -> None:
        """Say the launcher is gone and hard-exit (or call ``on_gone``), whatever the thread."""
        # No flush of sys.stdout/sys.stderr: the main thread may hold their locks, blocked on a
        # pipe nobody reads; stderr is line-buffered, so what the rank printed is already out.
        if not self._firing.acquire(blocking=False):
            if self.on_gone is None:
                threading.Event().wait()  # the other thread is ending the process right now
            return
        if self.on_gone is not None:
            self.on_gone(self.message())
            return
        hard_exit(self.message(), self.exit_code)

    def _run(self) -> None:
        while not self._stopped.is_set():
            if self.parent_is_gone():
                if not self._stopped.is_set():
                    self.exit_now()
                return
            # On the wall clock's multiples of the interval: the ranks of a node look at the same
            # instants, so they see the launcher gone together, before one's exit breaks a
            # collective under the others (which would then fail with a peer's connection error).
            self._stopped.wait(self.interval_s - time.time() % self.interval_s)


def start_launcher_watch(launch: LaunchEnv, *, interval_s: float = DEFAULT_INTERVAL_S) -> LauncherWatch:
    """A started watch labelled with the rank, the way ``parallel_session`` arms it."""
    return LauncherWatch(label=f"[rank {launch.rank}/{launch.world_size}] ", interval_s=interval_s).start()
