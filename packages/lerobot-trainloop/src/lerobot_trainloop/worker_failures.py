"""A DataLoader worker's failure as facts a trainer can report in one line.

torch reports a worker process that dies (the kernel's out-of-memory killer sends SIGKILL; a decoder
crashes with SIGSEGV) as a ``RuntimeError`` raised wherever the training process happens to be: from its
SIGCHLD handler, often deep inside the backward pass or a checkpoint save (which may wrap it in an error
of its own), or at the next batch ("exited unexpectedly", chained to a ``queue.Empty``). Neither says
which worker, and parsing torch's text would break with its wording. :func:`named_worker_deaths` asks the
loaders' own worker processes instead: when an exception leaves its block while one of them has ended
with a signal or a non-zero code, it raises :class:`DataLoaderWorkerDied` (worker index, pid, signal or
exit code) from it.

An exception a worker *raises* (a dataset error) reaches the training process as the same class whose
message is the worker's whole traceback ("Caught DatasetError in DataLoader worker process 0. Original
Traceback ... pkg.errors.DatasetError: <message>"); :func:`worker_error_message` gives back ``<message>``,
what the same error says without workers.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from torch.utils.data import DataLoader

# torch's ExceptionWrapper.reraise: f"Caught {name} {where}.\nOriginal {traceback text}"
_WRAPPED = re.compile(r"\ACaught \w+ in DataLoader worker process \d+\.\nOriginal Traceback")


class DataLoaderWorkerDied(RuntimeError):
    """A worker process of a live DataLoader ended on its own: killed by ``signum``, or ``exitcode``.

    ``others_private_bytes``: the largest memory of its own (private pages, not those shared with the
    training process it was forked from) of the loader's workers still alive, measured when the death was
    found; None where there is none or ``/proc`` cannot tell."""

    def __init__(
        self, worker_id: int, pid: int, exitcode: int, others_private_bytes: int | None = None
    ) -> None:
        self.worker_id, self.pid, self.exitcode = worker_id, pid, exitcode
        self.signum: int | None = -exitcode if exitcode < 0 else None
        self.others_private_bytes = others_private_bytes
        if self.signum is not None:
            how = f"was killed by {signal_name(self.signum)}"
        else:
            how = f"exited with code {exitcode}"
        super().__init__(f"DataLoader worker {worker_id} (pid {pid}) {how}")


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9; ``signal 64`` for a number without a name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def private_bytes(pid: int) -> int | None:
    """Private memory of a process (``Private_Clean + Private_Dirty`` of ``/proc/PID/smaps_rollup``): what
    it holds beyond the pages it still shares with its parent; None where unreadable (not Linux, gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    found = re.finditer(r"^Private_(?:Clean|Dirty):\s+(\d+) kB", text, re.MULTILINE)
    kib = [int(m.group(1)) for m in found]
    return 1024 * sum(kib) if kib else None


def _workers(loader: DataLoader) -> list:
    """The worker processes of ``loader``'s current iterator (a persistent one's, or the last a
    :class:`~lerobot_trainloop.worker_signals.ShieldedDataLoader` made), in worker order; [] without."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is None:
        last = getattr(loader, "last_iterator", None)
        iterator = last() if last is not None else None
    return list(getattr(iterator, "_workers", None) or [])


def dead_worker(loader: DataLoader) -> DataLoaderWorkerDied | None:
    """The first worker of ``loader`` that ended with a signal or a non-zero exit code, or None.

    Reading ``exitcode`` reaps the worker: torch's own check (``_error_if_any_worker_fails``) waits with
    ``WNOWAIT``, so the dead worker is still there to be asked."""
    workers = _workers(loader)
    for worker_id, process in enumerate(workers):
        code = process.exitcode
        if code is not None and code != 0:
            sizes = [private_bytes(p.pid) for p in workers if p is not process and p.exitcode is None]
            known = [size for size in sizes if size is not None]
            return DataLoaderWorkerDied(worker_id, process.pid, code, max(known) if known else None)
    return None


# How long an exception that looks like a lost peer (a reset socket, a closed pipe) waits for a worker to
# be reapable: the kernel closes a killed process's sockets before its parent can reap it, so the
# training process may read the reset before the worker's exit code exists.
_REAP_GRACE_S = 2.0


def _lost_peer(exc: BaseException) -> bool:
    """Whether ``exc`` or an exception it was raised from is a broken connection or an early EOF."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        if isinstance(at, (ConnectionError, EOFError)):
            return True
        seen.add(id(at))
        at = at.__cause__ or at.__context__
    return False


def _await_a_death(loaders: tuple[DataLoader | None, ...], timeout: float) -> None:
    """Return once a worker of ``loaders`` can be reaped (its exit code known), or after ``timeout``.

    Polled: a worker's sentinel pipe closes with its other files, before it is reapable. torch's SIGCHLD
    handler reports the death by raising its RuntimeError wherever the main thread is, here: the
    awaited news, not a new error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(dead_worker(loader) for loader in loaders if loader is not None):
                return
            time.sleep(0.01)
        except RuntimeError:
            continue


@contextmanager
def named_worker_deaths(*loaders: DataLoader | None) -> Iterator[None]:
    """Re-raise an exception leaving the block as :class:`DataLoaderWorkerDied` (from it) when a worker of
    one of ``loaders`` has died; any other exception passes unchanged. See the module docstring.

    A worker killed while it handed a batch over can surface as a ``ConnectionResetError`` a moment
    before the kernel lets the parent reap it; such an error waits up to ``_REAP_GRACE_S`` for that."""
    try:
        yield
    except Exception as exc:
        if _lost_peer(exc):
            _await_a_death(loaders, _REAP_GRACE_S)
        for loader in loaders:
            died = dead_worker(loader) if loader is not None else None
            if died is not None:
                raise died from exc
        raise


def worker_error_message(exc: BaseException) -> str:
    """``str(exc)``, or for an exception a DataLoader worker raised, its own message without torch's
    "Caught … in DataLoader worker process N" and the worker's traceback (see the module docstring)."""
    text = str(exc)
    if not _WRAPPED.match(text):
        return text
    cls = type(exc)
    name = (
        cls.__qualname__
        if cls.__module__ in ("builtins", "__main__")
        else f"{cls.__module__}.{cls.__qualname__}"
    )
    marker = f"\n{name}: "
    at = text.rfind(marker)
    return text[at + len(marker) :].strip() if at >= 0 else text
