"""One run owns its output directory: an exclusive lock held for the whole life of the run.

Two trainers writing into one ``output_dir`` interleave their metrics and overwrite each other's
checkpoints, and nothing in the files would show it afterwards. So the writing process (the main
rank) takes an exclusive ``flock`` on ``<output_dir>/.lerobot-run.lock`` before it writes anything
and keeps it until it exits; a second run is refused at once with the holder's pid, host and start
time, which the lock file records.

The kernel drops a ``flock`` when its process dies, however it dies, so a crashed run never blocks
the next one; what it leaves is a lock file whose holder record was never cleared, which the next
run reports as a stale lock (who held it, since when) and takes over. The lock file is opened
with ``O_NOFOLLOW`` and must be a regular file: a run directory someone else wrote (a run one was
sent and resumes) may hold a symlink there, and the holder record would be written through it.
Torch-free.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import json
import os
import socket
import stat
import sys
from pathlib import Path
from typing import Any, Self

from attrs import define, field

from lerobot_ckpt.errors import CheckpointError
from lerobot_ckpt.layout import RUN_LOCK


class RunDirectoryError(CheckpointError):
    """The output directory cannot be used: not creatable, not writable, or held by another run."""


class RunDirectoryLockedError(RunDirectoryError):
    """Another live process holds the run directory's lock."""


@define(frozen=True)
class LockHolder:
    """Who holds (or held) a run directory: written into the lock file by the holder."""

    pid: int
    host: str
    started: str
    command: str = ""

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, started {self.started}" + (
            f": {self.command}" if self.command else ""
        )

    @classmethod
    def current(cls) -> LockHolder:
        now = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
        command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300] if sys.argv and sys.argv[0] else ""
        return cls(pid=os.getpid(), host=socket.gethostname(), started=now, command=command)

    @classmethod
    def parse(cls, text: str) -> LockHolder | None:
        try:
            raw: Any = json.loads(text)
            return cls(
                pid=int(raw["pid"]),
                host=str(raw["host"]),
                started=str(raw["started"]),
                command=str(raw.get("command", "")),
            )
        except (ValueError, KeyError, TypeError):
            return None


def _read_holder(fd: int) -> LockHolder | None:
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    return LockHolder.parse(data.decode("utf-8", errors="replace")) if data.strip() else None


def _denied(directory: Path, exc: OSError) -> RunDirectoryError:
    reason = exc.strerror or type(exc).__name__
    return RunDirectoryError(
        f"{directory} cannot be used as the run directory: {reason} ({exc.filename or directory})"
    )


_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_lock_file(path: Path, directory: Path) -> int:
    """The lock file, created if missing, never through a symlink and only if it is a regular file
    (``O_NONBLOCK``: a FIFO planted there must not hang the open)."""
    try:
        fd = os.open(path, _LOCK_FLAGS | getattr(os, "O_NONBLOCK", 0), 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP or path.is_symlink():
            raise RunDirectoryError(
                f"{path} is a symlink (to {os.readlink(path)}); the run lock is never written through a "
                "symlink: remove it (it is not a file a run writes) or choose another output directory"
            ) from None
        raise _denied(directory, exc) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RunDirectoryError(
            f"{path} is not a regular file; the run lock cannot be taken: remove it or choose another "
            "output directory"
        )
    os.set_blocking(fd, True)
    return fd


@define
class RunLock:
    """The held lock; :meth:`release` (or leaving the ``with`` block) gives it up."""

    directory: Path
    created: tuple[Path, ...]  # directories this process created, deepest first (removed again if unused)
    stale: LockHolder | None  # a previous holder that died without releasing, reported by the caller
    _fd: int | None = field(default=None, alias="fd")

    @property
    def path(self) -> Path:
        return self.directory / RUN_LOCK

    @classmethod
    def acquire(cls, directory: Path | str) -> RunLock:
        """Create ``directory`` if needed and lock it, or raise :class:`RunDirectoryError` at once."""
        directory = Path(directory)
        created, probe = [], directory.absolute()
        while not probe.exists() and probe != probe.parent:
            created.append(probe)
            probe = probe.parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise RunDirectoryError(f"{directory} exists and is not a directory") from None
        except OSError as exc:
            raise _denied(directory, exc) from None
        if not directory.is_dir():
            raise RunDirectoryError(f"{directory} exists and is not a directory")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise RunDirectoryError(f"{directory} cannot be used as the run directory: it is not writable")
        path = directory / RUN_LOCK
        while True:
            fd = _open_lock_file(path, directory)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read_holder(fd)
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise _denied(directory, exc) from None
                who = holder.describe() if holder else "a process that has not yet recorded itself"
                raise RunDirectoryLockedError(
                    f"{directory} is in use by another run ({who}); wait for it to end, or choose another "
                    "output directory"
                ) from None
            # A releasing holder unlinks the file: a lock on the unlinked inode would protect nothing.
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        stale = _read_holder(fd)
        me = LockHolder.current()
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(
            fd,
            (
                json.dumps({"pid": me.pid, "host": me.host, "started": me.started, "command": me.command})
                + "\n"
            ).encode(),
        )
        os.fsync(fd)
        return cls(directory=directory, created=tuple(created), stale=stale, fd=fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self, *, remove_unused_directory: bool = True) -> None:
        """Clear the holder record, unlink the lock file, unlock; idempotent.

        With ``remove_unused_directory`` a directory this process created is removed again when
        nothing else was written into it (a run refused after the lock, e.g. for a bad dataset,
        leaves no trace that would block the corrected re-run).
        """
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(fd)  # closing drops the flock
        if remove_unused_directory:
            for path in self.created:
                try:
                    path.rmdir()  # only succeeds when empty
                except OSError:
                    break

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.release()
